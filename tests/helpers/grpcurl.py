"""Runs the real grpcurl binary (1.8.6, fetched into the venv by `make install`) against a server.

grpcurl talks to the server through reflection only: no proto files. A call is
`grpcurl -plaintext -max-time S [-d JSON] ADDRESS [list|describe] [SYMBOL|SERVICE/METHOD]`; a
streamed answer is printed as one JSON object after another, an error as
`ERROR:\\n  Code: <Code>\\n  Message: <message>` on stderr with a non-zero exit status.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

INSTALL_HINT = "run `make grpcurl` (part of `make install`): it fetches grpcurl 1.8.6 into the venv's bin/"


@dataclass(frozen=True)
class GrpcurlResult:
    """What one grpcurl run printed, and how it exited."""

    returncode: int
    stdout: str
    stderr: str

    def messages(self) -> list[dict]:
        """The JSON objects on stdout, in order (one per streamed message)."""
        decoder, text, found, at = json.JSONDecoder(), self.stdout, [], 0
        while (at := _skip_space(text, at)) < len(text):
            message, at = decoder.raw_decode(text, at)
            found.append(message)
        return found

    def lines(self) -> list[str]:
        return [line.strip() for line in self.stdout.splitlines() if line.strip()]


def find_grpcurl() -> Path:
    """The venv's grpcurl (beside this Python), else one on PATH; fails the test when neither exists."""
    beside = Path(sys.executable).parent / "grpcurl"
    if beside.is_file():
        return beside
    on_path = shutil.which("grpcurl")
    if on_path is None:
        pytest.fail(f"grpcurl is not installed (looked for {beside} and on PATH): {INSTALL_HINT}", pytrace=False)
    return Path(on_path)


@dataclass(frozen=True)
class Grpcurl:
    """grpcurl aimed at one plaintext address."""

    binary: Path
    address: str

    def run(self, *words: str, data: dict | None = None, flags: Sequence[str] = (),
            timeout_s: float = 60) -> GrpcurlResult:
        """`grpcurl FLAGS ADDRESS WORDS...`, e.g. run('list') or run('pdserve.v1.Generation/Generate', data=...)."""
        command = [str(self.binary), "-plaintext", "-max-time", f"{timeout_s:g}", *flags]
        if data is not None:
            command += ["-d", json.dumps(data)]
        done = subprocess.run([*command, self.address, *words], capture_output=True, text=True,
                              timeout=timeout_s + 30)
        return GrpcurlResult(done.returncode, done.stdout, done.stderr)


def grpcurl(address: str) -> Grpcurl:
    return Grpcurl(find_grpcurl(), address)


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at
