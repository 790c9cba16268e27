"""Processes seen through /proc: whether one still runs, and the children of one."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    """The pids of `pid`'s children, whichever of its threads started them."""
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
