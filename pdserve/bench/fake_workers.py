"""A decode worker with no model, for measuring the router alone (benchmarks/relay.py).

It speaks DecodeWorker as a real decode worker does to a colocated router (`pdserve router
--colocated`: every Decode prefills locally, so no reservation, no KV and no prefill worker),
event feed included (pdserve/bench/fake_decode.py). Stats says it is ready and serves the
embedded model, with the identity a real worker on a CPU builds (pdserve/identity: the model's
fingerprint, a float32 pool, the default block size); Decode streams `max_tokens` ordinary words
of the model's vocabulary, then DecodeFinished(LENGTH): ignore_eos, whatever the request asks.

    pace      the client's request id `relay:<µs>:<anything>` spaces its stream's tokens that many
              microseconds apart, the first at once (`relay_id`); any other id: --interval-us
    steps     every --step-us (1 ms) the tokens due of every stream go out together: one event per
              stream on its own call, or one message for all the streams of a router's feed
    send log  one JSON line per stream as it ends, ended or cancelled: {"id": <the client's request
              id>, "sent": [CLOCK_MONOTONIC ns of each token as handed to gRPC]}; a client on the
              same host joins its receipt times to it (the latency the router adds)

    python -m pdserve.bench.fake_workers --port 0 --ready-file F [--send-log PATH] [--interval-us N]
        [--step-us N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import grpc

from pdserve.bench.fake_decode import FakeDecodeServicer
from pdserve.config import CacheConfig
from pdserve.identity import WorkerIdentity, model_fingerprint
from pdserve.procs.parent_watch import SUPERVISOR_PID_ENV, supervisor_pid, watch_parent
from pdserve.v1 import worker_pb2 as wpb
from pdserve.v1 import worker_pb2_grpc

WORDS = " the quick brown fox jumps over the lazy dog and then runs far away into a green field"
PACED = "relay"
READY_TIMEOUT_S = 60.0
DEFAULT_INTERVAL_US = 10_000  # a request id that names no pace
DEFAULT_STEP_US = 1_000  # the fake engine's step: each stream's tokens due by then go together


def word_ids(tokenizer) -> tuple[int, ...]:
    """WORDS as token ids: one token per word, each decoding to its word alone (" fox")."""
    ids = tuple(tokenizer.encode(WORDS))
    assert tokenizer.decode(list(ids)) == WORDS and len(ids) == len(WORDS.split()), "a word is not one token"
    return ids


def relay_id(interval_s: float, name: str) -> str:
    """A request id that tells the fake worker to space its tokens `interval_s` apart."""
    return f"{PACED}:{round(interval_s * 1e6)}:{name}"


def client_id(worker_id: str) -> str:
    """The client's request id inside the router's worker id (`<id>@<attempt>.<hex>`)."""
    return worker_id.rsplit("@", 1)[0]


def interval_of(request_id: str, default_s: float) -> float:
    kind, _, rest = request_id.partition(":")
    micros = rest.partition(":")[0]
    return int(micros) / 1e6 if kind == PACED and micros.isdigit() else default_s


def worker_identity() -> wpb.WorkerIdentity:
    """What a real decode worker on a CPU reports (pdserve/worker/startup.py builds the same; the
    router compares only its model's fields)."""
    identity = WorkerIdentity(model_fingerprint(None), "torch.float32", CacheConfig().block_size)
    fields = {k: v for k, v in asdict(identity).items() if k != "model"}
    return wpb.WorkerIdentity(**asdict(identity.model), **fields)


class SendLog:
    """The send log (see the module's docstring); `None` writes nothing."""

    def __init__(self, path: Path | None):
        self._file: IO[str] | None = open(path, "a", buffering=1) if path else None

    def write(self, request_id: str, sent: list[int]) -> None:
        if self._file is not None:
            self._file.write(json.dumps({"id": request_id, "sent": sent}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class SendLogReader:
    """Reads the send log as it grows: each call, the streams logged since the last."""

    def __init__(self, path: Path):
        self._path = path
        self._offset = 0

    def read_new(self) -> dict[str, list[int]]:
        """Client request id -> its tokens' send times (CLOCK_MONOTONIC ns)."""
        with open(self._path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self._offset += len(whole)
        records = (json.loads(line) for line in whole.splitlines())
        return {r["id"]: r["sent"] for r in records}


@dataclass
class FakeProcess:
    """A fake decode worker in a process of its own."""

    process: subprocess.Popen
    port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Until no stream runs on it (a cancelled stream's send times are then in the log)."""
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            stub = worker_pb2_grpc.DecodeWorkerStub(channel)
            while stub.Stats(wpb.StatsRequest(), timeout=timeout_s).requests_running:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the fake decode worker still streams after {timeout_s:.0f} s")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


def start_process(workdir: Path, send_log: Path | None = None, interval_us: int = DEFAULT_INTERVAL_US,
                  step_us: int = DEFAULT_STEP_US) -> FakeProcess:
    """Starts `python -m pdserve.bench.fake_workers` and waits for its port; it stops by itself
    once this process is gone."""
    ready = workdir / "fake-decode.port"
    ready.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pdserve.bench.fake_workers", "--port", "0", "--ready-file", str(ready),
            "--interval-us", str(interval_us), "--step-us", str(step_us)]
    argv += ["--send-log", str(send_log)] if send_log else []
    with open(workdir / "fake-decode.log", "w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, SUPERVISOR_PID_ENV: str(os.getpid())})
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            FakeProcess(process, 0).stop()
            raise RuntimeError(f"the fake decode worker did not start; see {workdir / 'fake-decode.log'}")
        time.sleep(0.05)
    return FakeProcess(process, json.loads(ready.read_text())["port"])


async def _serve(args: argparse.Namespace) -> None:
    from pdserve.tokenizer import load_tokenizer

    log = SendLog(Path(args.send_log) if args.send_log else None)
    servicer = FakeDecodeServicer(word_ids(load_tokenizer(None)), worker_identity(), log.write, args.interval_us / 1e6,
                                  args.step_us / 1e6, client_id, interval_of)
    server = grpc.aio.server()
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    parent = supervisor_pid(os.environ)
    watch = asyncio.ensure_future(watch_parent(parent, stop.set)) if parent is not None else None
    tmp = f"{args.ready_file}.tmp"
    Path(tmp).write_text(json.dumps({"port": port}))
    os.replace(tmp, args.ready_file)
    await stop.wait()
    if watch is not None:
        watch.cancel()
    await server.stop(0.5)
    log.close()


def main(argv: list[str] | None = None) -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file", required=True, help="its port goes here (JSON) once it serves")
    p.add_argument("--send-log", default=None, help="append each stream's send times here (JSON lines)")
    p.add_argument("--interval-us", type=int, default=DEFAULT_INTERVAL_US,
                   help="token spacing of a request id without one")
    p.add_argument("--step-us", type=int, default=DEFAULT_STEP_US,
                   help="the fake engine's step: the tokens of every stream due by then are sent together")
    uvloop.run(_serve(p.parse_args(argv)))


if __name__ == "__main__":
    main()
