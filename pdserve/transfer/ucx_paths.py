"""Which UCX transports a sender may use towards one peer: policy, no UCX import.

UCX builds a worker address from every transport its context opened, and a peer picks lanes
from that address by what UCX believes is reachable. Its shared-memory transports (posix, sysv:
the `sm` group, with cma) take "same machine" from the boot id alone, but they wake the receiving
worker through a Unix socket of its network namespace and attach segments through its IPC and
PID namespaces. Between two network namespaces of one machine (test hosts, or Kubernetes Pods
on one node) the sender writes into a FIFO the receiver never looks at: nothing is delivered.

So each end says where it lives (`Locality`: boot id and the namespaces shared memory needs),
carried in front of its UCX address, and the sender opens a UCX context per path:

    HOST     same boot and the same net, IPC and PID namespaces: every transport (shared memory
             and cma first, as UCX ranks them)
    NETWORK  anything else: every transport but shared memory (TCP, RDMA where there is a device)

A path the operator fixed (UCX_TLS in the environment, or a `TLS` option) is taken as given for
every peer. The choice is logged and counted per peer by the sender (`UcxSender.paths`).
"""

from __future__ import annotations

import enum
import hashlib
import os
from dataclasses import dataclass
from typing import Mapping

_NAMESPACES = ("net", "ipc", "pid")
# In front of a UCX address that carries its locality; its first byte's low bits name an address
# format UCX never wrote (`ucx_worker.check_peer_address` refuses it as a bare address).
_MAGIC = b"\xffPDL"
LOCALITY_NBYTES = 16


class Path(enum.Enum):
    HOST = "host"
    NETWORK = "network"


# The transports a path leaves out (UCX_TLS's "^" form: everything else UCX finds).
_EXCLUDED = {Path.HOST: "", Path.NETWORK: "sm"}


@dataclass(frozen=True)
class Locality:
    """Where a process lives, as far as shared memory is concerned: a digest, equal for two
    processes exactly when they share the boot and the net, IPC and PID namespaces."""

    key: bytes

    @classmethod
    def of_this_process(cls, proc: str = "/proc") -> "Locality":
        parts = [_read(f"{proc}/sys/kernel/random/boot_id")]
        for name in _NAMESPACES:
            try:
                st = os.stat(f"{proc}/self/ns/{name}")
                parts.append(f"{name}:{st.st_dev}:{st.st_ino}")
            except OSError:
                parts.append(f"{name}:unknown")
        return cls(hashlib.blake2b("|".join(parts).encode(), digest_size=LOCALITY_NBYTES).digest())


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def choose_path(own: Locality, peer: Locality | None) -> Path:
    """HOST only for a peer that shares everything shared memory needs; an address without a
    locality (an older worker) is taken as across the network, which works everywhere."""
    return Path.HOST if peer is not None and peer == own else Path.NETWORK


def context_options(path: Path, options: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The UCX context options for `path`: the configured ones, plus the path's exclusions unless
    the operator chose the transports (a TLS option, or UCX_TLS in the environment)."""
    chosen = dict(options)
    if fixed_transports(options, environ) is not None or not _EXCLUDED[path]:
        return chosen
    return {**chosen, "TLS": "^" + _EXCLUDED[path]}


def fixed_transports(options: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """The transports the operator fixed for every peer, or None."""
    return options.get("TLS") or environ.get("UCX_TLS")


@dataclass(frozen=True)
class PeerPath:
    """What a sender chose for one peer, as logged and exported."""

    path: Path
    transports: str  # UCX_TLS as the context had it ("^sm": all but shared memory; "": UCX's default)
    fixed: bool = False  # the operator's choice, not this module's

    def __str__(self) -> str:
        how = self.transports or "every transport"
        return f"{self.path.value} path ({how}{', as configured' if self.fixed else ''})"


def describe_path(path: Path, options: Mapping[str, str], environ: Mapping[str, str]) -> PeerPath:
    fixed = fixed_transports(options, environ)
    return PeerPath(path, fixed if fixed is not None else context_options(path, options, environ).get("TLS", ""),
                    fixed is not None)


def peer_label(ucx_address: bytes) -> str:
    """A short stable name of a peer worker for logs and metrics (its address's digest)."""
    return hashlib.blake2b(ucx_address, digest_size=4).hexdigest()


def with_locality(locality: Locality, ucx_address: bytes) -> bytes:
    """A receiver's address as it travels: its locality in front of the UCX worker address."""
    return _MAGIC + locality.key + ucx_address


def split_address(address: bytes) -> tuple[Locality | None, bytes]:
    """(the peer's locality or None, its UCX worker address)."""
    head = len(_MAGIC) + LOCALITY_NBYTES
    if address.startswith(_MAGIC) and len(address) > head:
        return Locality(address[len(_MAGIC):head]), address[head:]
    return None, address
