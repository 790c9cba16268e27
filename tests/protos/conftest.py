import importlib.util
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    """tools/gen_protos.py is a script, not a package: load it by path."""
    name = "pdserve_tools_gen_protos"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tools" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def gen_protos():
    return load_generator()


@pytest.fixture(scope="session", autouse=True)
def generated_stubs(gen_protos):
    """Bring pdserve/v1/ up to date (a no-op when `make protos` or pip already did)."""
    return gen_protos.generate(REPO_ROOT)
