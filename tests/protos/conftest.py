import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest
from proto_helpers import REPO_ROOT, load_generator

# The test modules import pdserve.v1 at collection time, so bring the generated stubs up to
# date before they are collected (a no-op when `make protos` or pip already did it).
GENERATED = load_generator().generate(REPO_ROOT)


@pytest.fixture(scope="session")
def gen_protos():
    return load_generator()
