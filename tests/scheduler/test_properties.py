"""Property tests: random arrivals, prompt lengths, priorities, aborts, remote adds and tiny pools,
with the block accounting and the step rules checked after every step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdserve.config import PreemptionConfig
from pdserve.kv.manager import BlockHold
from pdserve.requests import Priority, Request, RequestState
from pdserve.scheduler import PromptTooLongError, Scheduler, SchedulerOutput
from tests.scheduler.fakes import FakeClock, FakeExecutor, build, request

SHARED = [7] * 64  # a common prefix so the prefix cache and its eviction are exercised

arrival = st.fixed_dictionaries({
    "prompt_len": st.integers(1, 60),
    "shared": st.integers(0, 48),
    "max_tokens": st.integers(1, 12),
    "priority": st.sampled_from(list(Priority)),
    "remote": st.booleans(),
    "at_step": st.integers(0, 30),
})

scenario = st.fixed_dictionaries({
    "policy": st.sampled_from(["chunked", "fcfs", "decode-first"]),
    "num_blocks": st.integers(24, 48),
    "num_host_blocks": st.sampled_from([0, 8, 32]),
    "watermark": st.sampled_from([0.0, 0.05, 0.2]),
    "prefix_cache": st.booleans(),
    "token_budget": st.sampled_from([16, 32, 64]),
    "max_chunk_tokens": st.sampled_from([4, 16, 64]),
    "max_running": st.integers(1, 8),
    "swap_threshold": st.sampled_from([0, 8, 10_000]),
    "arrivals": st.lists(arrival, min_size=1, max_size=14),
    "aborts": st.lists(st.tuples(st.integers(0, 40), st.integers(0, 13)), max_size=4),
    "hold_finished": st.booleans(),  # a prefill worker: finished requests' blocks are held
    "hold_every": st.sampled_from([0, 1, 3]),  # holds on running requests (KV being streamed)
})


class Driver:
    """Feeds a scenario into a scheduler and checks every step."""

    def __init__(self, sc: dict):
        self.sc = sc
        preemption = PreemptionConfig(recompute_below_tokens=sc["swap_threshold"],
                                      swap_above_tokens=sc["swap_threshold"])
        self.s, self.ex, self.clock = build(
            sc["policy"], num_blocks=sc["num_blocks"], num_host_blocks=sc["num_host_blocks"],
            watermark=sc["watermark"], prefix_cache=sc["prefix_cache"], token_budget=sc["token_budget"],
            max_chunk_tokens=sc["max_chunk_tokens"], max_running=sc["max_running"], aging_seconds=1.0,
            preemption=preemption, block_size=4, max_model_len=128, hold_finished=sc["hold_finished"])
        self.requests: list[Request] = []
        self.holds: list[tuple[int, BlockHold]] = []  # (release at step, hold)
        self.receiving_since: dict[str, int] = {}
        self.step_no = 0

    def arrive(self) -> None:
        for i, a in enumerate(self.sc["arrivals"]):
            if a["at_step"] == self.step_no:
                prompt = SHARED[:a["shared"]] + [(i * 31 + j) % 200 + 1 for j in range(a["prompt_len"])]
                r = request(f"r{i}", prompt=prompt, max_tokens=a["max_tokens"], priority=a["priority"])
                try:
                    (self.s.add_remote if a["remote"] else self.s.add)(r)
                except PromptTooLongError:
                    assert r.num_tokens + 1 >= self.s.max_model_len
                    continue
                self.requests.append(r)

    def abort(self) -> None:
        for at, index in self.sc["aborts"]:
            if at == self.step_no and index < len(self.requests):
                self.s.abort(self.requests[index].request_id)

    def deliver(self) -> None:
        """Remote KV arrives two steps after the reservation; the executor writes it."""
        for reservation in self.s.take_reserved():
            r = reservation.request
            cached = reservation.cached_blocks * self.s.kv.block_size  # shared hits: never written again
            self.ex._write(r.prompt_token_ids, reservation.block_ids, cached, r.num_prompt_tokens)
            self.receiving_since[r.request_id] = self.step_no
        for rid, since in list(self.receiving_since.items()):
            if self.step_no - since >= 2:
                del self.receiving_since[rid]
                if self.s.get(rid) is not None:
                    self.s.mark_received(rid, first_token=999)
        for due, hold in [h for h in self.holds if h[0] <= self.step_no or not self.busy_requests()]:
            self.s.release_hold(hold)
            self.holds.remove((due, hold))

    def step(self) -> None:
        self.arrive()
        self.abort()
        self.deliver()
        vip_running = {r.request_id for r in self.requests if r.priority == Priority.VIP
                       and r.state == RequestState.RUNNING}
        output = self.s.schedule()
        check_step(self.s, output, vip_running, self.sc)
        sampled = self.ex.execute(output)
        self.s.update(output, sampled)
        self.s.check_integrity()
        self.holds += [(self.step_no + 1, hold) for hold in self.s.take_holds().values()]
        self.hold_computed(output)
        self.clock.advance(0.25)
        self.step_no += 1

    def hold_computed(self, output: SchedulerOutput) -> None:
        """As a prefill worker's engine does: a hold on each running request this step computed
        (its new KV is being sent), given back two steps later."""
        every = self.sc["hold_every"]
        if not every or self.step_no % every:
            return
        for chunk in output.chunks:
            hold = self.s.hold(chunk.request.request_id)
            if hold is not None:
                self.holds.append((self.step_no + 2, hold))

    def busy_requests(self) -> bool:
        pending = any(a["at_step"] >= self.step_no for a in self.sc["arrivals"])
        return pending or self.s.has_work() or bool(self.s.stats().receiving)

    def busy(self) -> bool:
        return self.busy_requests() or bool(self.holds)


def check_step(s: Scheduler, output: SchedulerOutput, vip_running: set[str], sc: dict) -> None:
    ids = [c.request.request_id for c in output.chunks]
    assert len(ids) == len(set(ids)), "a request was scheduled twice in one step"
    longest = max((c.num_tokens for c in output.chunks), default=0)
    limit = sc["token_budget"] if sc["policy"] != "fcfs" else max(sc["token_budget"], longest)
    assert output.num_tokens <= limit, "the step exceeds its token budget"
    preempted = {p.request.request_id for p in output.preempted}
    assert not preempted & vip_running, "a VIP request was preempted"
    assert not preempted & set(ids), "a request was preempted and scheduled in the same step"
    for chunk in output.chunks:
        assert chunk.start == chunk.request.num_computed_tokens and chunk.num_tokens >= 1
        assert chunk.end <= chunk.request.num_tokens
    kv = s.stats().kv
    assert kv.free + kv.cached + kv.active == kv.total


@pytest.mark.timeout(240)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_random_workloads_keep_every_invariant_and_drain(sc: dict) -> None:
    d = Driver(sc)
    while d.busy():
        assert d.step_no < 3000, "requests did not all finish (starvation or livelock)"
        d.step()
    assert all(r.is_finished for r in d.requests)
    stats = d.s.stats()
    assert stats.kv.active == 0 and stats.kv.swapped == 0
    assert stats.kv.free + stats.kv.cached == stats.kv.total
    assert (stats.running, stats.waiting, stats.swapped, stats.receiving) == (0, 0, 0, 0)
    for r in d.requests:
        if r.finish_reason is not None and r.finish_reason.value == "length":
            assert len(r.output_token_ids) == r.sampling.max_tokens or r.num_tokens >= d.s.max_model_len
