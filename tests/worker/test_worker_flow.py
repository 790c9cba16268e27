"""A request through a prefill and a decode worker in one process, to its last token."""

import asyncio

import pytest

from pdserve.requests import FinishReason, SamplingParams
from tests.worker.pair import make_pair, settle

pytestmark = pytest.mark.timeout(120)

PROMPT = tuple(range(5, 45))  # 40 tokens: 5 chunks, 5 pieces


def test_a_request_streams_to_its_end_and_frees_every_block(tiny_llama):
    async def main():
        pair = await make_pair(tiny_llama)
        try:
            outcome = await asyncio.wait_for(pair.serve("r-1", PROMPT), 30)
            return outcome, await settle(pair.prefill_engine), await settle(pair.decode_engine)
        finally:
            await pair.stop()

    outcome, prefill_left, decode_left = asyncio.run(main())
    assert outcome.finished.reason == FinishReason.LENGTH and len(outcome.tokens) == 5
    assert (prefill_left, decode_left) == (0, 0)


def test_max_tokens_1_finishes_with_the_first_token_alone(tiny_llama):
    """The first token, sampled on the prefill worker, already ends the request: no decode step
    is left to run, yet Finished must reach the stream."""

    async def main():
        pair = await make_pair(tiny_llama)
        try:
            sampling = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
            outcome = await asyncio.wait_for(pair.serve("one", PROMPT, sampling), 10)
            return outcome, await settle(pair.decode_engine)
        finally:
            await pair.stop()

    outcome, decode_left = asyncio.run(main())
    assert outcome.first_token is not None and outcome.tokens == []
    assert outcome.finished is not None and outcome.finished.reason == FinishReason.LENGTH
    assert decode_left == 0


@pytest.mark.parametrize("resumed_count,fresh", [(1, False), (3, False), (12, False), (12, True)])
def test_a_resume_through_the_prefill_worker_continues_exactly_where_the_stream_stopped(tiny_llama, resumed_count,
                                                                                          fresh):
    """A stream cut after `resumed_count` tokens, resumed with those tokens: the prefill worker
    sends the KV of prompt and tokens so far (across a block boundary for 12) and samples the next
    one; the decode worker goes on from there. On the same pair both hold most of it cached; on a
    `fresh` pair neither holds anything. Greedy: the same tokens as uncut."""
    sampling = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    async def main():
        pair = await make_pair(tiny_llama)
        other = await make_pair(tiny_llama) if fresh else pair
        try:
            whole = await asyncio.wait_for(pair.serve("whole", PROMPT, sampling), 60)
            out = [whole.first_token, *whole.tokens]
            resumed = await asyncio.wait_for(other.serve("resumed", PROMPT, sampling, tuple(out[:resumed_count])), 60)
            return out, resumed, [await settle(e) for p in {id(pair): pair, id(other): other}.values()
                                  for e in (p.prefill_engine, p.decode_engine)]
        finally:
            await pair.stop()
            if fresh:
                await other.stop()

    out, resumed, left = asyncio.run(main())
    assert len(out) == 16
    assert [resumed.first_token, *resumed.tokens] == out[resumed_count:]
    assert resumed.finished.reason == FinishReason.LENGTH
    assert not any(left)
