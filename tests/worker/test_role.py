"""An elastic worker's role: what it takes while changing, when the change happens, calling it off."""

from __future__ import annotations

import asyncio

import pytest

from pdserve.errors import InvalidRequestError
from pdserve.rpc.errors import Unavailable
from pdserve.worker.role import RoleState
from pdserve.worker.role_control import RoleControl


def test_while_leaving_a_role_it_takes_new_work_of_neither():
    state = RoleState("decode")
    assert state.serves("decode") and not state.serves("prefill")
    state.set("prefill")
    for role in ("decode", "prefill"):
        with pytest.raises(Unavailable, match="leaving the decode role for prefill"):
            state.refuse_unless(role)
    state.set("decode")  # called off
    assert state.serves("decode") and state.next_role is None
    with pytest.raises(Unavailable, match="serves the decode role now, not prefill"):
        state.refuse_unless("prefill")
    with pytest.raises(InvalidRequestError):
        state.set("router")
    with pytest.raises(InvalidRequestError):
        RoleState("both")


def test_the_change_waits_for_the_old_roles_work_then_tells():
    async def main():
        work = {"decode": 2, "prefill": 0}
        told: list[str] = []
        control = RoleControl(RoleState("decode"), {r: (lambda r=r: work[r]) for r in work}, told.append, poll_s=0.01)
        control.set("prefill")
        await asyncio.sleep(0.05)
        assert (control.state.role, control.state.next_role, told) == ("decode", "prefill", [])
        work["decode"] = 0
        await asyncio.sleep(0.05)
        assert (control.state.role, control.state.next_role, told) == ("prefill", None, ["prefill"])
        control.set("decode")  # nothing of the prefill role held: at once
        assert (control.state.role, told) == ("decode", ["prefill", "decode"])
        work["decode"] = 1
        control.set("prefill")
        control.set("decode")  # called off before it happened
        work["decode"] = 0
        await asyncio.sleep(0.05)
        assert (control.state.role, control.state.next_role, told) == ("decode", None, ["prefill", "decode"])
        control.stop()

    asyncio.run(main())
