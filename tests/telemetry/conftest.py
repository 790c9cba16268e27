import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
from tests.helpers.otlp_receivers import GrpcReceiver, HttpReceiver


@pytest.fixture
def grpc_receiver():
    receiver = GrpcReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def http_receiver():
    receiver = HttpReceiver()
    yield receiver
    receiver.stop()
