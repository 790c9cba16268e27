"""Shared by the proto tests: the repository root and tools/gen_protos.py loaded by path."""

import importlib.util
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    """tools/gen_protos.py is a script, not a package: load it by path once."""
    name = "pdserve_tools_gen_protos"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tools" / "gen_protos.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
