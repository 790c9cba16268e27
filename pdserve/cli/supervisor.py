"""The process supervisor lives in pdserve/procs/supervisor.py (below the CLI, which it serves
with the benchmarks, chaos and tests); this name stays for the importers of pdserve.cli."""

from pdserve.procs.supervisor import Child, Supervisor

__all__ = ["Child", "Supervisor"]
