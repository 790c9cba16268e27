"""A worker's role, and how an elastic worker (`pdserve prefill|decode --elastic`, both roles'
services on one model and one KV pool) changes it on the router's command:

    serving R ──set(S)──▶ leaving R for S   new work of R refused (UNAVAILABLE, so the router places it
                                            elsewhere), work of R in flight finishes; Stats: role R,
                                            next_role S (the router uses it for neither role)
              ◀──set(R)──                   the change called off
    leaving R for S ──no work of R left──▶ serving S   Stats: role S; the registry hears it too

A worker started without --elastic has one role for life and serves no SetRole.
"""

from __future__ import annotations

from pdserve.errors import InvalidRequestError
from pdserve.rpc.errors import Withdrawn

ROLES = ("prefill", "decode")


class RoleState:
    def __init__(self, role: str):
        _check(role)
        self.role = role
        self.next_role: str | None = None

    def serves(self, role: str) -> bool:
        return self.role == role and self.next_role is None

    def refuse_unless(self, role: str) -> None:
        """Withdrawn (UNAVAILABLE, nobody charged) unless this worker takes new work of `role` now."""
        if self.serves(role):
            return
        if self.next_role is not None:
            raise Withdrawn(f"this worker is leaving the {self.role} role for {self.next_role}; it takes no new "
                              f"{role} work")
        raise Withdrawn(f"this worker serves the {self.role} role now, not {role}")

    def set(self, role: str) -> None:
        """Leave the current role for `role` (or call a change off by naming the current one)."""
        _check(role)
        self.next_role = None if role == self.role else role

    def switch(self) -> str:
        """The change is carried out (the old role's work is over); the new role."""
        assert self.next_role is not None, "no change of role under way"
        self.role, self.next_role = self.next_role, None
        return self.role


def _check(role: str) -> None:
    if role not in ROLES:
        raise InvalidRequestError(f"role must be one of {ROLES}, got {role[:32]!r}")
