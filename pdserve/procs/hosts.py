"""Test hosts on one machine: network namespaces on a bridge, each with an address of its own.

What a fleet across machines (or Kubernetes Pods on one node) looks like to a process: its own
interfaces and loopback, peers reachable only through the bridge. The bridge has an address in
the caller's namespace too, so the caller (a test, a benchmark) reaches every host as a client.

    with HostNetwork.make(3) as net:          # root only (ip netns, veth, bridge)
        router, prefill, decode = net.hosts
        supervisor.spawn("decode", argv, launcher=decode.launcher())
        net.link_down(decode)                 # a partition: the host's only link down
        net.blackhole(decode)                 # ... or every packet to it dropped, the link up
        net.shape(decode, rate_mbit=10_000)   # a bandwidth cap on its link (tbf; a delay needs netem)

`HostNetwork.unavailable()` says why hosts cannot be made here (not root, no `ip`), or None.
Mechanism only: which process runs where is the caller's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


@dataclass(frozen=True)
class TestHost:
    name: str  # the network namespace
    address: str  # its address on the bridge
    link: str  # its veth end in the caller's namespace (on the bridge)

    __test__ = False  # not a pytest class

    def launcher(self) -> list[str]:
        """The prefix that runs a command on this host."""
        return ["ip", "netns", "exec", self.name]


@dataclass
class HostNetwork:
    tag: str  # a few hex digits naming this network's bridge, links and namespaces
    subnet: str  # "10.a.b" : the bridge is .1, hosts .2 ...
    hosts: list[TestHost] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"pdbr{self.tag}"

    @property
    def gateway(self) -> str:
        """The caller's address on the bridge."""
        return f"{self.subnet}.1"

    @staticmethod
    def unavailable() -> str | None:
        """Why test hosts cannot be made on this machine, or None when they can."""
        if os.geteuid() != 0:
            return "test hosts need root (ip netns, veth, bridge)"
        if shutil.which("ip") is None:
            return "test hosts need iproute2's `ip`"
        probe = f"pdprobe{uuid.uuid4().hex[:6]}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot make a network namespace: {made.stderr.strip()}"
        _ip("netns", "del", probe, check=False)
        return None

    @classmethod
    def make(cls, count: int) -> "HostNetwork":
        tag = uuid.uuid4().hex[:6]
        net = cls(tag, _free_subnet())
        try:
            net._make_bridge()
            for index in range(count):
                net.hosts.append(net._make_host(index))
        except BaseException:
            net.close()
            raise
        return net

    def _make_bridge(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def _make_host(self, index: int) -> TestHost:
        name, outer, inner = f"pd{self.tag}h{index}", f"pd{self.tag}o{index}", f"pd{self.tag}i{index}"
        address = f"{self.subnet}.{index + 2}"
        _ip("netns", "add", name)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", name)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("-n", name, "addr", "add", f"{address}/24", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "route", "add", "default", "via", self.gateway)
        return TestHost(name, address, outer)

    def link_down(self, host: TestHost) -> None:
        """Cut the host off: packets to and from it are dropped (its sockets see no reset)."""
        _ip("link", "set", host.link, "down")

    def link_up(self, host: TestHost) -> None:
        _ip("link", "set", host.link, "up")

    def blackhole(self, host: TestHost) -> None:
        """Drop every packet towards the host, its link staying up (no carrier change, no reset, no
        ICMP): a peer that stalls, as a partition looks from the far side. `clear` undoes it."""
        self._qdisc(host, "tbf", "rate", "8bit", "burst", "32", "limit", "32")  # every frame is larger

    def shape(self, host: TestHost, *, rate_mbit: float, delay_ms: float = 0.0) -> None:
        """Cap the bandwidth towards the host (tbf); a delay needs the kernel's netem."""
        if delay_ms:
            self._qdisc(host, "netem", "delay", f"{delay_ms}ms", "rate", f"{rate_mbit}mbit")
        else:
            self._qdisc(host, "tbf", "rate", f"{rate_mbit}mbit", "burst", "256kb", "latency", "50ms")

    def clear(self, host: TestHost) -> None:
        subprocess.run(["tc", "qdisc", "del", "dev", host.link, "root"], capture_output=True, timeout=10)

    def _qdisc(self, host: TestHost, *spec: str) -> None:
        done = subprocess.run(["tc", "qdisc", "replace", "dev", host.link, "root", *spec], capture_output=True,
                              text=True, timeout=10)
        if done.returncode != 0:
            raise RuntimeError(f"tc qdisc {spec[0]} on {host.link}: {done.stderr.strip()}")

    def close(self) -> None:
        for host in self.hosts:
            _ip("netns", "del", host.name, check=False)  # takes its veth pair with it
        _ip("link", "del", self.bridge, check=False)
        self.hosts = []

    def __enter__(self) -> "HostNetwork":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_subnet() -> str:
    """A 10.x.y.0/24 no interface of this namespace uses."""
    used = _ip("-4", "-o", "addr", "show").stdout
    for _ in range(100):
        second, third = 100 + int.from_bytes(os.urandom(1), "big") % 100, int.from_bytes(os.urandom(1), "big")
        subnet = f"10.{second}.{third}"
        if f" {subnet}." not in used:
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet for test hosts")
