"""The generated stubs carry a server-streaming Generate and a unary Abort over real gRPC."""

from concurrent import futures

import grpc
import pytest

from pdserve.v1 import generation_pb2 as pb
from pdserve.v1 import generation_pb2_grpc as pb_grpc


class EchoGeneration(pb_grpc.GenerationServicer):
    def Generate(self, request, context):
        for token in request.token_ids.ids:
            yield pb.GenerateResponse(request_id=request.request_id, token_ids=[token])
        yield pb.GenerateResponse(
            request_id=request.request_id,
            finish_reason=pb.FINISH_REASON_LENGTH,
            usage=pb.Usage(prompt_tokens=len(request.token_ids.ids)),
        )

    def Abort(self, request, context):
        return pb.AbortResponse(found=request.request_id == "known")


@pytest.fixture
def channel():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_GenerationServicer_to_server(EchoGeneration(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
        yield chan
    server.stop(grace=None)


@pytest.mark.timeout(30)
def test_generate_streams_and_abort_answers(channel):
    stub = pb_grpc.GenerationStub(channel)
    request = pb.GenerateRequest(request_id="r", token_ids=pb.TokenIds(ids=[4, 5, 6]))
    replies = list(stub.Generate(request, timeout=10))
    assert [list(r.token_ids) for r in replies] == [[4], [5], [6], []]
    assert replies[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert replies[-1].usage.prompt_tokens == 3
    assert stub.Abort(pb.AbortRequest(request_id="known"), timeout=10).found
    assert not stub.Abort(pb.AbortRequest(request_id="other"), timeout=10).found
