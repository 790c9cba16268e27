"""`HostsFleet`: a `SeparateFleet` whose router and every worker run on a test host of their own
(network namespaces on a bridge, pdserve/procs/hosts.py): the KV crosses a network, as between
machines or Pods. Root only (`HostNetwork.unavailable()` says why not)."""

from __future__ import annotations

from pdserve.chaos.fleet import FleetSpec
from pdserve.chaos.separate import SeparateFleet
from pdserve.procs.hosts import HostNetwork, TestHost


class HostsFleet(SeparateFleet):
    def __init__(self, spec: FleetSpec):
        super().__init__(spec)
        self._net: HostNetwork | None = None
        self._hosts: dict[str, TestHost] = {}

    def start(self) -> str:
        names = [*self.spec.names(), "router"]
        self._net = HostNetwork.make(len(names))
        self._hosts = dict(zip(names, self._net.hosts))
        return super().start()

    def _host(self, name: str) -> str:
        return self._hosts[name].address

    def _launcher(self, name: str) -> tuple[str, ...]:
        return tuple(self._hosts[name].launcher())

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._net is not None:
                self._net.close()

    def describe(self) -> str:
        return super().describe() + "; the router and each worker on a test host of its own"
