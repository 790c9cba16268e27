"""The router refuses oversized or malformed requests before any work, with INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.errors import DuplicateRequestError, InvalidRequestError
from pdserve.validation import Limits
from pdserve.rpc.drain import Drain
from pdserve.tokenizer import load_tokenizer
from pdserve.v1 import generation_pb2 as pb
from router.doors.frontend import Frontend
from router.doors.limits import InputLimits
from router.doors.gateway import Gateway
from router.doors.servicer import WireAsk
from tests.router.fake_trace import FakeTrace


class _Counting:
    """The tokenizer, counting the prompts it is given to tokenise."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def encode(self, *args, **kwargs):
        self.calls += 1
        return self.inner.encode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        self.calls += 1
        return self.inner.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def servicer():
    frontend = Frontend(_Counting(load_tokenizer(None)), Limits(49152, 8192), InputLimits(max_prompt_chars=100_000))
    yield Gateway(frontend, flow=None, traces=lambda md: FakeTrace(), drain=Drain())
    frontend.close()


def _admit(gateway, request: pb.GenerateRequest, metadata=()):
    return asyncio.run(gateway.admit(metadata, WireAsk(request), None)).job


def test_a_good_request_is_admitted(servicer):
    tokenised = servicer.frontend.tokenizer.calls
    job = _admit(servicer, pb.GenerateRequest(text="Hello there", request_id="ok-1"))
    assert job.request_id == "ok-1" and job.prompt
    assert servicer.frontend.tokenizer.calls == tokenised + 1


@pytest.mark.parametrize("request_,needle", [
    (pb.GenerateRequest(text="x" * 60_000_000), "--max-prompt-chars"),
    (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1] * 8_000_000)), "--max-prompt-tokens"),
    (pb.GenerateRequest(text="hi", request_id="r" * 129), "--max-request-id-chars"),
    (pb.GenerateRequest(text="hi", request_id="bad\nid"), "printable"),
    (pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(stop=["s"] * 17)), "--max-stop-strings"),
    (pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(stop=["s" * 257])), "--max-stop-chars"),
    (pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(stop_token_ids=[1] * 65)), "--max-stop-token-ids"),
    (pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="a")] * 513)),
     "--max-messages"),
    (pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="robot", content="a")])), "role"),
    (pb.GenerateRequest(messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="a" * 100_001)])),
     "--max-prompt-chars"),
])
def test_oversized_and_malformed_requests_are_refused_before_any_work(servicer, request_, needle):
    tokenised = servicer.frontend.tokenizer.calls
    with pytest.raises(InvalidRequestError, match=needle.replace("-", r"\-")):
        _admit(servicer, request_)
    assert servicer.frontend.tokenizer.calls == tokenised  # refused on sizes alone: never tokenised


def test_a_running_id_is_refused_but_an_ending_one_may_be_taken():
    class _Ending:
        ending = True

    class _Running:
        ending = False

    frontend = Frontend(load_tokenizer(None), Limits(49152, 8192))
    s = Gateway(frontend, flow=None, traces=lambda md: FakeTrace(), drain=Drain())
    s.active["x"] = _Running()
    with pytest.raises(DuplicateRequestError):
        _admit(s, pb.GenerateRequest(text="hi", request_id="x"))
    s.active["x"] = _Ending()
    assert _admit(s, pb.GenerateRequest(text="hi", request_id="x")).request_id == "x"
    frontend.close()
