"""The client is a small library: importing it loads neither torch nor the engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_importing_the_client_loads_no_torch():
    code = "import sys, pdserve.client; print(sorted(m for m in ('torch', 'pdserve.engine') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=True)
    assert out.stdout.strip() == "[]"
