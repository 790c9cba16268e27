"""What internal RPCs may carry, checked before a worker or the registry acts on it.

Each check raises InvalidRequestError (INVALID_ARGUMENT) with a message naming the field; a
refused call changes nothing. The router checks what clients send (router/doors/limits.py); these
bounds are for the internal plane, where a caller holds the cluster token but may still be wrong.
"""

from __future__ import annotations

import math
import re

from pdserve.config import DeadlineConfig
from pdserve.errors import InvalidRequestError

MAX_TIMEOUT_S = 600.0
DEFAULT_KV_TIMEOUT_S = DeadlineConfig().kv_timeout_s
MAX_ID_CHARS = 1024  # request and transfer ids: the router's own ids with attempt suffixes fit
MAX_ADDRESS_CHARS = 255
MAX_KV_ADDRESS_BYTES = 4096  # a UCX worker address is a few hundred bytes

_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$")


def check_id(name: str, value: str) -> str:
    """Non-empty, at most MAX_ID_CHARS printable ASCII characters."""
    if not value or len(value) > MAX_ID_CHARS or not (value.isascii() and value.isprintable()):
        raise InvalidRequestError(f"{name} must be 1..{MAX_ID_CHARS} printable ASCII characters")
    return value


def check_timeout(name: str, seconds: float) -> float:
    """Inside (0, MAX_TIMEOUT_S]."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise InvalidRequestError(f"{name} {seconds} s outside (0, {MAX_TIMEOUT_S:.0f}]")
    return seconds


def kv_timeout(seconds: float) -> float:
    """A request's kv_timeout_s: unset (0) is DEFAULT_KV_TIMEOUT_S, else inside (0, MAX_TIMEOUT_S]."""
    return DEFAULT_KV_TIMEOUT_S if seconds == 0 else check_timeout("kv_timeout_s", seconds)


def check_address(name: str, address: str) -> str:
    """`host:port`, the host a name, an IPv4 address or a bracketed IPv6 one, the port 1..65535."""
    host, sep, port = address.rpartition(":")
    valid = (bool(sep) and len(address) <= MAX_ADDRESS_CHARS and port.isdigit() and 0 < int(port) < 65536
             and _HOST.match(host) is not None)
    if not valid:
        raise InvalidRequestError(f"{name} {address[:64]!r} is not host:port")
    return address


def check_kv_address(kv_address: bytes) -> bytes:
    if not 0 < len(kv_address) <= MAX_KV_ADDRESS_BYTES:
        raise InvalidRequestError(f"kv_address must be 1..{MAX_KV_ADDRESS_BYTES} bytes")
    return kv_address
