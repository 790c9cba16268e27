"""KV block transfer throughput: memcpy vs in-process vs UCX (two processes) vs gRPC (two processes),
and UCX with the KV checksums on (pdserve/transfer/checksum.py: the sender sums each piece while
it sends it, the receiver sums each piece once landed; a round ends when both sums are done).

One process copies (the decode side reads the prefill side's pool with CMA), so one thread's
memcpy is the yardstick; the 2-thread flat memcpy shows what the host's memory allows.

All four move the same bytes: a prompt's KV in chunk-sized pieces from a prefill pool into
fragmented blocks of a decode pool (SmolLM2-135M shape by default: 30 layers, 3 KV heads,
head_dim 64, block 16, fp32 = 737,280 bytes per block).

    .venv/bin/python benchmarks/kv_transfer.py --mib 256 --chunk-tokens 512 --repeats 5

A plain TCP socket moving the same runs is the floor of the path. Across test hosts (network
namespaces on a bridge) benchmarks/hosts.py runs this script on one host with the children on
another (--peer-host, --peer-address).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import multiprocessing
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")

from pdserve.kv.kv_cache import KVCache  # noqa: E402
from pdserve.kv.kv_shape import KVShape  # noqa: E402
from pdserve.transfer import InProcessFabric, make_transport  # noqa: E402
from pdserve.transfer.base import pool_bytes  # noqa: E402
from pdserve.transfer.checksum import blocks_checksum_off_loop  # noqa: E402
from pdserve.transfer.descriptors import merge_runs  # noqa: E402
from pdserve.transfer.ucx import UcxConfig  # noqa: E402

SHAPE = KVShape(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16)
GRPC_METHOD = "/pdserve.bench.KvBytes/Put"
SECRET = b"kv-transfer bench"  # both ends of every benchmark piece hold it
Piece = tuple[str, int, list[tuple[int, int]]]


@dataclass(frozen=True)
class Setup:
    num_blocks: int
    blocks: int
    chunk_blocks: int
    dst_run: int
    ucx: UcxConfig
    inflight: int
    grpc_message: int
    seed: int = 0
    checksums: bool = False  # UCX: both sides sum every piece, as the workers do
    listen: str = "127.0.0.1"  # where the children's gRPC and TCP servers listen (the peer host's address)
    peer_host: str = ""  # the network namespace the children run in ("": this one)


def make_pool(num_blocks: int) -> torch.Tensor:
    return KVCache(SHAPE, num_blocks, torch.float32, "cpu").data


def make_pieces(setup: Setup, prefix: str) -> list[Piece]:
    """Chunks of consecutive prefill blocks into shuffled decode runs of `dst_run` blocks."""
    rng = random.Random(setup.seed)
    starts = list(range(0, setup.num_blocks - setup.dst_run + 1, setup.dst_run))
    rng.shuffle(starts)
    dst = [s + i for s in starts for i in range(setup.dst_run)][: setup.blocks]
    pairs = list(zip(range(setup.blocks), dst))
    chunks = range(0, setup.blocks, setup.chunk_blocks)
    return [(f"{prefix}-{n}", 0, pairs[c : c + setup.chunk_blocks]) for n, c in enumerate(chunks)]


def digest(pool: torch.Tensor, blocks: list[int]) -> str:
    rows = pool_bytes(pool)
    h = hashlib.blake2b(digest_size=16)
    for b in blocks:
        h.update(rows[b].numpy().tobytes())
    return h.hexdigest()


# ---- measurements in this process -------------------------------------------------------------


def time_memcpy(src: torch.Tensor, dst: torch.Tensor, pieces: list[Piece]) -> float:
    src_b, dst_b = pool_bytes(src), pool_bytes(dst)
    started = time.perf_counter()
    for _, _, pairs in pieces:
        for run in merge_runs(pairs):
            dst_b[run.dst_start : run.dst_start + run.count].copy_(src_b[run.src_start : run.src_start + run.count])
    return time.perf_counter() - started


def time_flat_memcpy(src: torch.Tensor, dst: torch.Tensor, nbytes: int, threads: int = 1) -> float:
    a, b = src.view(-1).view(torch.uint8)[:nbytes], dst.view(-1).view(torch.uint8)[:nbytes]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    started = time.perf_counter()
    b.copy_(a)
    elapsed = time.perf_counter() - started
    torch.set_num_threads(before)
    return elapsed


async def send_all(sender, address: bytes, pieces: list[Piece], inflight: int, pool: torch.Tensor | None = None) -> float:
    """`pool`: sum each piece's source blocks while it is sent (the sender's checksum)."""
    limit = asyncio.Semaphore(inflight)

    async def one(piece: Piece) -> None:
        async with limit:
            send = sender.send(address, piece[0], piece[1], piece[2], 30.0, secret=SECRET)
            if pool is None:
                await send
            else:
                await asyncio.gather(send, blocks_checksum_off_loop(pool, [s for s, _ in piece[2]]))

    started = time.monotonic()
    await asyncio.gather(*(one(p) for p in pieces))
    return started


class InProcessBench:
    def __init__(self, src: torch.Tensor, dst: torch.Tensor, setup: Setup):
        transport = make_transport("inprocess", fabric=InProcessFabric())
        self.sender, self.receiver, self.setup = transport.sender(src), transport.receiver(dst), setup

    async def round(self, r: int) -> float:
        pieces = make_pieces(self.setup, f"inproc{r}")
        expects = [asyncio.ensure_future(self.receiver.expect(t, s, p, 30.0, secret=SECRET)) for t, s, p in pieces]
        started = await send_all(self.sender, self.receiver.address(), pieces, self.setup.inflight)
        await asyncio.gather(*expects)
        return time.monotonic() - started

    async def stop(self) -> None:
        await self.receiver.close()


# ---- UCX: decode side in a child process ------------------------------------------------------


def ucx_child(conn, setup: Setup) -> None:
    import uvloop

    uvloop.run(_ucx_child(conn, setup))


async def _ucx_child(conn, setup: Setup) -> None:
    loop = asyncio.get_running_loop()
    pool = make_pool(setup.num_blocks)
    receiver = make_transport("ucx", ucx=setup.ucx).receiver(pool)
    conn.send(receiver.address())
    while (command := await loop.run_in_executor(None, conn.recv))[0] == "round":
        pieces = make_pieces(setup, command[1])

        async def landed(t: str, s: int, p: list[tuple[int, int]]) -> None:
            await receiver.expect(t, s, p, 30.0, secret=SECRET)
            if setup.checksums:  # the receiver's sum of what landed, before it may be used
                await blocks_checksum_off_loop(pool, [d for _, d in p])

        expects = [asyncio.ensure_future(landed(t, s, p)) for t, s, p in pieces]
        conn.send("ready")
        await asyncio.gather(*expects)
        conn.send(time.monotonic())
    conn.send(digest(pool, [d for _, _, pairs in make_pieces(setup, "") for _, d in pairs]))
    await receiver.close()


class UcxBench:
    """Prefill side here, decode side in a child; a round ends when both sides are done."""

    def __init__(self, src: torch.Tensor, setup: Setup):
        self.conn, self.process = start_child(ucx_child, setup)
        self.sender = make_transport("ucx", ucx=setup.ucx).sender(src)
        self.setup, self.src = setup, src

    async def round(self, r: int) -> float:
        loop = asyncio.get_running_loop()
        if r == 0:
            self.address = await loop.run_in_executor(None, self.conn.recv)
        self.conn.send(("round", f"ucx{r}"))
        await loop.run_in_executor(None, self.conn.recv)
        started = await send_all(self.sender, self.address, make_pieces(self.setup, f"ucx{r}"), self.setup.inflight,
                                 self.src if self.setup.checksums else None)
        sent = time.monotonic()
        return max(sent, await loop.run_in_executor(None, self.conn.recv)) - started

    async def stop(self) -> str:
        self.conn.send(("stop",))
        remote_digest = await asyncio.get_running_loop().run_in_executor(None, self.conn.recv)
        await self.sender.close()
        stop_child(self.process)
        return remote_digest


# ---- a plain TCP socket: the same bytes, run by run, into the decode pool (the path's floor) -----


def tcp_child(conn, setup: Setup) -> None:
    import socket

    flat = pool_bytes(make_pool(setup.num_blocks)).view(-1).numpy()
    server = socket.create_server((setup.listen, 0))
    conn.send(server.getsockname()[1])
    peer, _ = server.accept()
    peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(16)
    while conn.recv() == "round":
        while True:
            _recv_exactly(peer, memoryview(header))
            offset, size = int.from_bytes(header[:8], "little"), int.from_bytes(header[8:], "little")
            if size == 0:
                break
            _recv_exactly(peer, memoryview(flat)[offset : offset + size])
        conn.send(time.monotonic())
    peer.close()
    server.close()


def _recv_exactly(sock, view: memoryview) -> None:
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("peer closed")
        view = view[n:]


class TcpBench:
    """One TCP connection, each run sent as a header and its bytes; a round ends when the child
    has every byte in its pool."""

    def __init__(self, src: torch.Tensor, setup: Setup):
        self.conn, self.process = start_child(tcp_child, setup)
        self.src, self.setup = src, setup
        self.sock = None

    async def round(self, r: int) -> float:
        return await asyncio.get_running_loop().run_in_executor(None, self._round)

    def _round(self) -> float:
        import socket

        if self.sock is None:
            self.sock = socket.create_connection((self.setup.listen, self.conn.recv()))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn.send("round")
        started = time.monotonic()
        for offset, data in grpc_messages(self.src, make_pieces(self.setup, ""), self.setup.grpc_message):
            self.sock.sendall(offset.to_bytes(8, "little") + data.numel().to_bytes(8, "little"))
            self.sock.sendall(data.numpy())
        self.sock.sendall(bytes(16))
        return self.conn.recv() - started

    async def stop(self) -> None:
        self.conn.send("stop")
        self.sock.close()
        stop_child(self.process)


# ---- gRPC: the same bytes as 4 MiB messages (offset header + payload) -------------------------


def grpc_child(conn, setup: Setup) -> None:
    import uvloop

    uvloop.run(_grpc_child(conn, setup))


async def _grpc_child(conn, setup: Setup) -> None:
    import grpc
    import numpy as np

    flat = pool_bytes(make_pool(setup.num_blocks)).view(-1).numpy()
    flat[::4096] = 0

    async def put(request: bytes, context) -> bytes:
        offset = int.from_bytes(request[:8], "little")
        flat[offset : offset + len(request) - 8] = np.frombuffer(request, np.uint8, offset=8)
        return b""

    handler = grpc.method_handlers_generic_handler(
        "pdserve.bench.KvBytes", {"Put": grpc.unary_unary_rpc_method_handler(put)}
    )
    limits = [("grpc.max_receive_message_length", 64 << 20)]
    server = grpc.aio.server(options=limits)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{setup.listen}:0")
    await server.start()
    conn.send(port)
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await server.stop(None)


def grpc_messages(src: torch.Tensor, pieces: list[Piece], chunk: int):
    """(dst byte offset, src byte slice) of every <= chunk-byte message of every run."""
    rows = pool_bytes(src)
    nbytes = rows.shape[1]
    for _, _, pairs in pieces:
        for run in merge_runs(pairs):
            data = rows[run.src_start : run.src_start + run.count].view(-1)
            for first in range(0, data.numel(), chunk):
                yield run.dst_start * nbytes + first, data[first : first + chunk]


class GrpcBench:
    def __init__(self, src: torch.Tensor, setup: Setup):
        self.conn, self.process = start_child(grpc_child, setup)
        self.src, self.setup = src, setup

    async def round(self, r: int) -> float:
        import grpc

        if r == 0:
            port = await asyncio.get_running_loop().run_in_executor(None, self.conn.recv)
            options = [("grpc.max_send_message_length", 64 << 20)]
            self.channel = grpc.aio.insecure_channel(f"{self.setup.listen}:{port}", options=options)
            self.put = self.channel.unary_unary(GRPC_METHOD)
        limit = asyncio.Semaphore(self.setup.inflight * 2)

        async def one(offset: int, data: torch.Tensor) -> None:
            async with limit:
                await self.put(offset.to_bytes(8, "little") + data.numpy().tobytes())

        messages = grpc_messages(self.src, make_pieces(self.setup, ""), self.setup.grpc_message)
        started = time.monotonic()
        await asyncio.gather(*(one(o, d) for o, d in messages))
        return time.monotonic() - started

    async def stop(self) -> None:
        await self.channel.close()
        self.conn.send("stop")
        stop_child(self.process)


def start_child(target, setup: Setup):
    """`target(conn, setup)` in a spawned child: on the peer host when the setup names one (its
    interpreter started by `ip netns exec`, which keeps the pipe's descriptors)."""
    context = multiprocessing.get_context("spawn")
    if setup.peer_host:
        context.set_executable(_host_interpreter(setup.peer_host))
    parent, child = context.Pipe()
    process = context.Process(target=target, args=(child, setup), daemon=True)
    process.start()
    return parent, process


def _host_interpreter(netns: str) -> str:
    """An executable that runs this interpreter on network namespace `netns`."""
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="pdserve-host-"), "python")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec ip netns exec {netns} {sys.executable} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def stop_child(process) -> None:
    process.join(30)
    if process.is_alive():
        process.kill()
        process.join(10)


# ---- report -------------------------------------------------------------------------------------


def gbps(nbytes: int, times: list[float]) -> float:
    return nbytes / statistics.median(times) / 1e9


async def measure(args: argparse.Namespace) -> None:
    block_nbytes = SHAPE.block_numel() * 4
    blocks = max(1, (args.mib << 20) // block_nbytes)
    setup = Setup(
        num_blocks=int(blocks * 1.25) + args.dst_run, blocks=blocks,
        chunk_blocks=max(1, args.chunk_tokens // SHAPE.block_size), dst_run=args.dst_run,
        ucx=UcxConfig(max_message_bytes=args.max_message_mib << 20), inflight=args.inflight,
        grpc_message=args.grpc_message_mib << 20, listen=args.peer_address or "127.0.0.1", peer_host=args.peer_host,
    )
    nbytes = blocks * block_nbytes
    src, dst = make_pool(setup.num_blocks), make_pool(setup.num_blocks)
    src.copy_(torch.rand_like(src))
    dst.view(-1)[::1024] = 0
    pieces = make_pieces(setup, "")
    print(f"{nbytes / 2**20:.0f} MiB = {blocks} blocks of {block_nbytes} B, {len(pieces)} pieces of "
          f"{setup.chunk_blocks} blocks ({args.chunk_tokens} tokens), "
          f"{sum(len(merge_runs(p)) for _, _, p in pieces)} runs; {args.repeats} interleaved rounds "
          f"after {args.warmup} warm-up, median")
    benches = {"in-process transport": InProcessBench(src, dst, setup),
               "UCX transport (2 processes)": UcxBench(src, setup),
               "UCX transport, KV checksums on": UcxBench(src, dataclasses.replace(setup, checksums=True)),
               "gRPC unary, 4 MiB (2 processes)": GrpcBench(src, setup),
               "plain TCP socket (2 processes)": TcpBench(src, setup)}
    times: dict[str, list[float]] = {}
    for r in range(args.warmup + args.repeats):
        measured = {"memcpy (one flat copy)": time_flat_memcpy(src, dst, nbytes),
                    "memcpy (flat, 2 threads: host bound)": time_flat_memcpy(src, dst, nbytes, 2),
                    "memcpy (torch, per run)": time_memcpy(src, dst, pieces)}
        for name, bench in benches.items():
            measured[name] = await bench.round(r)
        for name, seconds in measured.items():
            times.setdefault(name, []).extend([seconds] if r >= args.warmup else [])
    remote = await benches["UCX transport (2 processes)"].stop()
    await benches["UCX transport, KV checksums on"].stop()
    await benches["gRPC unary, 4 MiB (2 processes)"].stop()
    await benches["plain TCP socket (2 processes)"].stop()
    await benches["in-process transport"].stop()
    report(times, nbytes)
    assert remote == digest(src, [s for _, _, pairs in pieces for s, _ in pairs]), "UCX data differs"
    print("  UCX data verified (digest of every decode block)")


def report(times: dict[str, list[float]], nbytes: int) -> None:
    figures = {name: gbps(nbytes, t) for name, t in times.items()}
    for name, value in figures.items():
        spread = ", ".join(f"{nbytes / t / 1e9:.2f}" for t in times[name])
        print(f"  {name:34s} {value:6.2f} GB/s   (rounds: {spread})")
    ucx, memcpy = figures["UCX transport (2 processes)"], figures["memcpy (torch, per run)"]
    grpc_ = figures["gRPC unary, 4 MiB (2 processes)"]
    bound = figures["memcpy (flat, 2 threads: host bound)"]
    print(f"  UCX / memcpy = {ucx / memcpy:.2f} (target >= 0.5)   UCX / gRPC = {ucx / grpc_:.1f} (target >= 8)   "
          f"UCX / 2-thread memcpy = {ucx / bound:.2f}")
    print(f"  UCX / plain TCP socket = {ucx / figures['plain TCP socket (2 processes)']:.2f}")
    summed = figures["UCX transport, KV checksums on"]
    print(f"  UCX with KV checksums / without = {summed / ucx:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="bytes moved per round")
    parser.add_argument("--chunk-tokens", type=int, default=512, help="tokens per piece (prefill chunk)")
    parser.add_argument("--dst-run", type=int, default=8, help="blocks per run in the fragmented decode pool")
    parser.add_argument("--max-message-mib", type=int, default=8, help="UCX message cap")
    parser.add_argument("--grpc-message-mib", type=int, default=4)
    parser.add_argument("--inflight", type=int, default=2, help="pieces in flight (gRPC: twice as many messages)")
    parser.add_argument("--repeats", type=int, default=5, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    parser.add_argument("--peer-host", default="", help="run the receiving children on this network namespace "
                        "(a test host: benchmarks/hosts.py runs this script so)")
    parser.add_argument("--peer-address", default="", help="the peer host's address (its gRPC and TCP servers)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
