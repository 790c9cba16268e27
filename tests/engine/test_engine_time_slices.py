"""Time slices through the engine: a pool that holds only the longest request, so out-of-blocks
victims (streams already started) wait, and with a quantum shorter than any step each takes a
slice from a running one that streamed its 4 tokens. Outputs stay those of an unpreempted run,
swapped or recomputed, and every block comes back; a step that swaps one out reports the blocks it
reserved for remote KV only after its copies."""

from __future__ import annotations

import pytest

from pdserve.requests import PreemptionMode, Priority
from pdserve.scheduler.preemptor import TIME_SLICE
from tests.engine.driver import GREEDY, assert_all_blocks_released, make_engine, run, tiny_prompt
from tests.engine.test_engine_preemption import (ALWAYS_RECOMPUTE, BLOCK_SIZE, MODEL, TIGHT_BLOCKS, _arrivals,
                                                 _check_against_oracle)

pytestmark = pytest.mark.timeout(120)

QUANTUM_S = 1e-6  # shorter than any step: a slice is as long as its 4 tokens


@pytest.mark.parametrize(("num_host_blocks", "mode"), [(64, PreemptionMode.SWAP), (0, PreemptionMode.RECOMPUTE)])
def test_time_slices_keep_output_and_blocks(tiny_loaded, oracle, num_host_blocks, mode):
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, block_size=BLOCK_SIZE, num_blocks=TIGHT_BLOCKS, num_host_blocks=num_host_blocks,
                         max_chunk_tokens=16, preemption=ALWAYS_RECOMPUTE, time_slice_s=QUANTUM_S)
    arrivals = _arrivals(loaded.config.vocab_size)
    trace = run(engine, arrivals)
    sliced = [p for p in trace.preemptions if p.reason == TIME_SLICE]
    assert sliced and {p.mode for p in sliced} == {mode}
    _check_against_oracle(trace, arrivals, oracle)
    assert_all_blocks_released(engine)


def test_blocks_reserved_in_a_step_that_swaps_out_are_reported_after_its_copies(tiny_loaded):
    # a resumed VIP the guard refuses (two VIPs' worst case, 6 blocks each, fill most of 16) takes
    # v1's slice: v1 is swapped out in the step that reserves rv's blocks, and a block v1 freed
    # may be among them, so the prefill worker may write them only once the copy has read them
    loaded = tiny_loaded[MODEL]
    engine = make_engine(loaded, block_size=BLOCK_SIZE, num_blocks=16, num_host_blocks=64, time_slice_s=QUANTUM_S)
    vocab = loaded.config.vocab_size
    for n in (1, 2):
        engine.add_request(f"v{n}", tiny_prompt(8, vocab, seed=n), GREEDY, Priority.VIP)
    for _ in range(5):
        engine.step()
    engine.add_remote_request("rv", tiny_prompt(8, vocab, seed=3), GREEDY, Priority.VIP, output_token_ids=(5, 6),
                              age_s=3.0)
    events = []
    execute = engine.runner.execute
    engine.runner.execute = lambda output: (events.append(("execute", len(output.swap_out))), execute(output))[1]
    result = engine.step(lambda reserved: events.append(("reserved", [r.request.request_id for r in reserved])))
    assert [(p.request.request_id, p.mode, p.reason) for p in result.preemptions] == \
        [("v1", PreemptionMode.SWAP, TIME_SLICE)]
    assert events[0][0] == "execute" and events[0][1] > 0 and events[1] == ("reserved", ["rv"])
