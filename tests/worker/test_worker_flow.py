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
