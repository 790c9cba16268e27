"""The fleet under faults, with separately started workers (1 prefill, 2 decode) and a router:
Generate racing Abort, one id cancelled and resubmitted, a decode worker killed while it prefills
a conversation's turn itself, a stalled and a killed decode worker under load (plain streams, and
streams under a JSON schema). Every stream ends, nothing is lost, and every worker is back to
zero active blocks. The workers serve a tiny random model, each step paced to about the embedded
model's pace here (tests/helpers/pacing.py): streams last as long while the workers spend almost no CPU."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import signal
import time

import jsonschema
import pytest

from pdserve.cli.supervisor import Supervisor
from pdserve.client import Client, ClientOptions, PdserveError
from pdserve.procs.health import wait_serving
from pdserve.requests import Constraint, ConstraintKind
from pdserve.v1 import worker_pb2 as wpb
from tests.helpers.cluster import cluster_flags
from tests.helpers.pacing import allow_pacing, greedy_outputs, pace_all, tiny_model
from tests.helpers.outcomes import outcome, succeeded
from tests.helpers.waiting import wait_for, wait_until
from tests.helpers.worker_stats import worker_stats

pytestmark = [pytest.mark.e2e, pytest.mark.tiny_fleet, pytest.mark.timeout(600)]

ENGINE = ["--threads", "1", "--kv-blocks", "256", "--host-kv-blocks", "64", "--token-budget", "256",
          "--max-chunk-tokens", "128"]
ROLES = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}


class Fleet:
    def __init__(self, sup: Supervisor, model: str):
        self.sup = sup
        self.model = model
        allow_pacing(sup)
        self.secured = cluster_flags(sup.workdir)
        self.children = {n: self.sup.spawn(n, [role, "--port", "0", *ENGINE, "--model", model, *self.secured])
                         for n, role in ROLES.items()}
        pace_all(sup, self.children.values())
        self.ports = {n: self.sup.wait_ready(c, 240) for n, c in self.children.items()}
        router = self.sup.spawn("router", ["router", "--port", "0", "--model", model, "--kv-timeout", "10",
                                           "--prefill-workers", f"127.0.0.1:{self.ports['prefill-0']}",
                                           "--decode-workers", ",".join(f"127.0.0.1:{self.ports[n]}"
                                                                        for n in ("decode-0", "decode-1")),
                                           *self.secured])
        self.target = f"127.0.0.1:{self.sup.wait_ready(router, 240)}"
        wait_serving(self.target, 60)

    def restart(self, name: str) -> None:
        """Start a worker again on the port it had (a platform rescheduling it)."""
        child = self.sup.spawn(f"{name}-again", [ROLES[name], "--port", str(self.ports[name]), *ENGINE,
                                                 "--model", self.model, *self.secured])
        pace_all(self.sup, [child])
        self.sup.wait_ready(child, 240)
        self.children[name] = child

    def stats(self, name: str) -> wpb.WorkerStats:
        return worker_stats(f"127.0.0.1:{self.ports[name]}", ROLES[name])

    def wait_idle(self, timeout_s: float = 30.0) -> dict[str, int]:
        """Until every worker reports zero active blocks (or the timeout): what each reports."""
        deadline = time.monotonic() + timeout_s
        while True:
            active = {n: self.stats(n).blocks_active for n in ROLES}
            if not any(active.values()) or time.monotonic() > deadline:
                return active
            time.sleep(0.2)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return tiny_model(tmp_path_factory, "faults", max_positions=4096)


@pytest.fixture(scope="module")
def fleet(model):
    sup = Supervisor(env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "HF_HUB_OFFLINE": "1"})
    try:
        yield Fleet(sup, model)
    finally:
        sup.stop()


GREEDY = {"temperature": 0, "ignore_eos": True}


RACE_TOKENS = 24
HELD_TOKENS = 1000  # a stream aborted after its first token is still far from its end, however fast it decodes


def test_generate_racing_abort_ends_every_stream(fleet):
    """Half the pairs abort at a random moment (before the router has the request, while it runs,
    or after it ended); the other half abort once their stream has its first token, so the
    router holds the request and the abort must find it. An abort that came first leaves a
    tombstone: its stream ends with abort on arrival (router/doors/tombstones.py)."""
    with Client(fleet.target, ClientOptions(timeout_s=120)) as client:

        def pair(i: int):
            held = i % 2 == 0
            call = client.stream(f"Tell me about the number {i}.", max_tokens=HELD_TOKENS if held else RACE_TOKENS,
                                 request_id=f"race-{i}", **GREEDY)
            head = next(call).token_ids if held else ()
            if not held:
                time.sleep(random.Random(i).uniform(0, 0.05))
            found = client.abort_outcome(f"race-{i}")  # aborted, pending (came first) or ended
            result = outcome(call.collect)
            return held, found, head, result

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(pair, range(48)))
    for held, found, head, result in results:
        assert not isinstance(result, PdserveError), result
        assert (found != "ended") == (result.finish_reason == "abort"), (held, found, result.finish_reason)
        if held:  # aborted mid-stream: it ends with ABORT, short of its end
            assert found == "aborted" and len(head) + len(result.token_ids) < HELD_TOKENS
        elif found == "pending":  # the abort came first: the stream ended on arrival, nothing generated
            assert len(result.token_ids) == 0
        elif found == "ended":  # the abort came last: the stream ran to its end
            assert result.finish_reason == "length" and len(result.token_ids) == RACE_TOKENS
    assert not any(fleet.wait_idle().values())


def test_cancel_and_resubmit_one_id(fleet):
    """A resubmission right after the cancel is served, or refused ALREADY_EXISTS while the router
    has not yet seen the cancel; then it is served once the router has."""
    rng = random.Random(7)
    served = []
    with Client(fleet.target, ClientOptions(timeout_s=60)) as client:

        def resubmit() -> int | str:
            result = outcome(client.generate, "Say hello.", max_tokens=6, request_id="same-id", **GREEDY)
            return result.code if isinstance(result, PdserveError) else len(result.token_ids)

        for i in range(20):
            call = client.stream(f"Write a poem about the sea, verse {i}.", max_tokens=40, request_id="same-id",
                                 **GREEDY)
            time.sleep(rng.uniform(0, 0.3))
            call.cancel()
            deadline = time.monotonic() + 60
            while (status := resubmit()) == "ALREADY_EXISTS" and time.monotonic() < deadline:
                time.sleep(0.05)
            served.append(status)
    assert served == [6] * 20, served
    assert not any(fleet.wait_idle().values())


PROMPTS = [f"Write a short story about a robot named Unit {i}." for i in range(8)]
LOAD_TOKENS = 96  # long enough that a decode worker holds several streams at once, however fast it decodes


def _run_all(fleet, max_tokens: int, during=None, sampling=GREEDY) -> list:
    with Client(fleet.target, ClientOptions(timeout_s=300)) as client:
        with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures = [pool.submit(outcome, client.generate, p, max_tokens=max_tokens, **sampling) for p in PROMPTS]
            if during is not None:
                during()
            return [f.result() for f in futures]


def _tokens(results) -> list:
    return [tuple(r.token_ids) for r in succeeded(results)]


def _kill_the_decode_worker_computing_it(fleet) -> str:
    """SIGKILL the decode worker running the one request in flight while the prefill worker has
    none (so that worker is prefilling it itself); its name."""
    decode = [n for n, role in ROLES.items() if role == "decode"]

    def victim():
        if fleet.stats("prefill-0").requests_running:
            return None
        return next((n for n in decode if fleet.stats(n).requests_running), None)

    name = wait_for(victim, 120, "a decode worker prefilling the turn itself", interval_s=0.02)
    os.killpg(fleet.children[name].process.pid, signal.SIGKILL)
    return name


def test_a_decode_worker_killed_while_it_prefills_a_turn_itself_loses_nothing(fleet, model):
    """A conversation's second turn is prefilled on the decode worker holding its first (a short
    remainder over its cached prefix); that worker is killed midway: the turn resumes on the other
    decode worker, every token once and equal to the unbroken run's; nothing is left held."""
    from pdserve.client import Message
    from pdserve.tokenizer import load_tokenizer

    opening = "Here are my notes. " + " ".join(f"Item {i}: water the plants on day {i}." for i in range(40))
    follow_up = "Now list them again, " + " ".join(f"and add remark {i} about the soil" for i in range(25))
    with Client(fleet.target, ClientOptions(timeout_s=300)) as client:
        first = client.generate(messages=[Message("user", opening)], max_tokens=16, **GREEDY)
        turn = [Message("user", opening), Message("assistant", first.text), Message("user", follow_up)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(client.generate, messages=turn, max_tokens=24, **GREEDY)
            killed = _kill_the_decode_worker_computing_it(fleet)
            result = answer.result()
    prompt = load_tokenizer(model).apply_chat_template(turn)
    assert tuple(result.token_ids) == greedy_outputs(model, [prompt], 24)[0]
    fleet.restart(killed)
    assert not any(fleet.wait_idle().values())


def _decode_worker_holding_two(fleet) -> str:
    """A decode worker running two of the streams at once: of the eight sent together, placed by
    the router (its choice, so either worker), one holds four, each of them LOAD_TOKENS long."""
    decode = [n for n, role in ROLES.items() if role == "decode"]
    return wait_for(lambda: next((n for n in decode if fleet.stats(n).requests_running >= 2), None), 120,
                    "a decode worker running two streams at once")


def test_a_stalled_decode_worker_is_seen_and_its_streams_resume(fleet):
    baseline = _tokens(_run_all(fleet, LOAD_TOKENS))

    def stall():
        victim = fleet.children[_decode_worker_holding_two(fleet)]
        os.killpg(victim.process.pid, signal.SIGSTOP)
        time.sleep(10)
        os.killpg(victim.process.pid, signal.SIGCONT)

    assert _tokens(_run_all(fleet, LOAD_TOKENS, stall)) == baseline
    assert not any(fleet.wait_idle().values())


# Long by construction (thirty numbers, each followed by ", " but the last): a stream is mid-way when
# its decode worker dies, and each ends where the schema does, inside max_tokens.
NUMBERS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 30,
           "maxItems": 30}
CONSTRAINED = {"temperature": 0, "constraint": Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(NUMBERS))}


def test_constrained_streams_keep_their_grammar_across_a_killed_decode_worker(fleet):
    """The resumed streams' matchers are rebuilt from the tokens they bring (the prefill worker's
    first, the dead worker's): every output equals the no-fault run's and validates."""
    baseline = _tokens(_run_all(fleet, 400, sampling=CONSTRAINED))
    assert len(baseline) == len(PROMPTS)
    killed = []

    def kill():
        killed.append(_decode_worker_holding_two(fleet))
        os.killpg(fleet.children[killed[0]].process.pid, signal.SIGKILL)

    results = _run_all(fleet, 400, kill, sampling=CONSTRAINED)
    assert _tokens(results) == baseline
    for result in results:
        jsonschema.validate(json.loads(result.text), NUMBERS)
    fleet.restart(killed[0])
    assert not any(fleet.wait_idle().values())


def test_samples_of_one_prompt_survive_their_decode_worker_killed(fleet):
    """n = 3: the later samples run beside the first on one decode worker; it is killed mid-way and
    each sample resumes on its own, its tokens equal to the no-fault run's."""
    def samples():
        with Client(fleet.target, ClientOptions(timeout_s=300)) as client:
            return client.stream(PROMPTS[1], n=3, max_tokens=LOAD_TOKENS, **GREEDY).collect_samples()

    baseline = [s.token_ids for s in samples()]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(samples)
        victim = _decode_worker_holding_two(fleet)
        os.killpg(fleet.children[victim].process.pid, signal.SIGKILL)
        assert [s.token_ids for s in running.result()] == baseline
    fleet.restart(victim)
    assert not any(fleet.wait_idle().values())


def test_a_killed_decode_worker_under_load_loses_nothing_and_is_taken_back(fleet):
    baseline = _tokens(_run_all(fleet, LOAD_TOKENS))
    killed = []

    def kill():
        killed.append(_decode_worker_holding_two(fleet))
        os.killpg(fleet.children[killed[0]].process.pid, signal.SIGKILL)

    assert _tokens(_run_all(fleet, LOAD_TOKENS, kill)) == baseline
    victim, = killed
    other = next(n for n, role in ROLES.items() if role == "decode" and n != victim)
    fleet.restart(victim)
    os.killpg(fleet.children[other].process.pid, signal.SIGKILL)  # only the restarted worker is left
    with Client(fleet.target, ClientOptions(timeout_s=120)) as client:
        after = client.generate(PROMPTS[0], max_tokens=LOAD_TOKENS, **GREEDY)
    assert tuple(after.token_ids) == baseline[0]
    wait_until(lambda: not any(fleet.stats(n).blocks_active for n in ("prefill-0", victim)), 30,
               "zero active blocks on the workers left")
