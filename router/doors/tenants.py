"""Who is calling the public API, and which priority classes they may use.

A tenants file (`--api-token-file`) has one tenant per line; `#` starts a comment:

    <token>  [tenant=NAME]  [max_priority=vip|normal|batch]  [over_priority=refuse|lower]  [max_concurrent=N]

A line with a token alone is tenant `default`, allowed every class (a single-token file keeps
meaning what it meant). Every call must then carry `authorization: Bearer <token>` of a tenant.
Without a file every caller is the tenant `anonymous`, capped at `--anonymous-max-priority`
(NORMAL unless set): priority classes are granted by whoever runs the service, never chosen by
the client. A request above its tenant's class is refused with PERMISSION_DENIED, or served
at the tenant's class when its `over_priority` is `lower`.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pdserve.requests import Priority
from pdserve.rpc.errors import PermissionDenied

ANONYMOUS = "anonymous"


class OverPriority(enum.Enum):
    REFUSE = "refuse"
    LOWER = "lower"


class TenantsFileError(ValueError):
    """A tenants file that cannot be read as documented."""


@dataclass(frozen=True)
class Tenant:
    name: str
    max_priority: Priority = Priority.NORMAL
    over_priority: OverPriority = OverPriority.REFUSE
    max_concurrent: int | None = None

    def priority_for(self, asked: Priority) -> Priority:
        """The class the request is served at; PermissionDenied when it may not be."""
        if asked >= self.max_priority:  # Priority: VIP < NORMAL < BATCH, lower is more important
            return asked
        if self.over_priority == OverPriority.LOWER:
            return self.max_priority
        raise PermissionDenied(f"tenant {self.name!r} may use priority {self.max_priority.name} at most, "
                               f"not {asked.name}")


@dataclass(frozen=True)
class Tenants:
    """token -> tenant; without tokens, everyone is `anonymous`."""

    by_token: Mapping[str, Tenant]
    anonymous: Tenant | None = None

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.by_token)

    @property
    def names(self) -> tuple[str, ...]:
        names = {t.name for t in self.by_token.values()}
        return tuple(sorted(names | ({self.anonymous.name} if self.anonymous else set())))

    def resolve(self, authorization: str | None) -> Tenant | None:
        """The caller's tenant from its `authorization` header; None when it names none."""
        if self.anonymous is not None:
            return self.anonymous
        given = (authorization or "").removeprefix("Bearer ").strip().encode()
        for token, tenant in self.by_token.items():
            if hmac.compare_digest(given, token.encode()):
                return tenant
        return None


def open_tenants(anonymous_max: Priority = Priority.NORMAL) -> Tenants:
    return Tenants({}, Tenant(ANONYMOUS, anonymous_max))


def read_tenants(path: str) -> Tenants:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise TenantsFileError(f"cannot read the tenants file {path}: {exc}") from exc
    tenants = dict(_parse(lines, path))
    if not tenants:
        raise TenantsFileError(f"the tenants file {path} names no tenant")
    return Tenants(tenants)


def _parse(lines: Iterable[str], path: str):
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        token, options = fields[0], dict(_option(f, path, number) for f in fields[1:])
        unknown = set(options) - {"tenant", "max_priority", "over_priority", "max_concurrent"}
        if unknown:
            raise TenantsFileError(f"{path}:{number}: unknown setting {sorted(unknown)[0]!r}")
        yield token, _tenant(options, path, number)


def _option(field: str, path: str, number: int) -> tuple[str, str]:
    key, sep, value = field.partition("=")
    if not sep or not value:
        raise TenantsFileError(f"{path}:{number}: expected key=value after the token, got {field!r}")
    return key, value


def _tenant(options: dict[str, str], path: str, number: int) -> Tenant:
    try:
        return Tenant(options.get("tenant", "default"),
                      Priority[options.get("max_priority", "vip").upper()],
                      OverPriority(options.get("over_priority", "refuse")),
                      int(options["max_concurrent"]) if "max_concurrent" in options else None)
    except (KeyError, ValueError) as exc:
        raise TenantsFileError(f"{path}:{number}: bad setting ({exc})") from None
