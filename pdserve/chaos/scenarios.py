"""Named presets, and flags laid over them.

    default      2 prefill + 2 decode, 40 chats, 4 seeded faults of every kind on every role
    decode-kill  1 prefill + 2 decode, 100 chats (40-160 words, 32 tokens out, a quarter VIP)
                 and 5 BATCH documents of ~1,800 words; decode-1 SIGKILLed 30 s in
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pdserve.chaos.config import ChaosConfig, FaultPlan, TieSpec
from pdserve.chaos.fleet import FleetSpec
from pdserve.chaos.load import LoadSpec
from pdserve.chaos.schedule import Fault, FaultKind

PRESETS = {
    "default": ChaosConfig(),
    "decode-kill": ChaosConfig(
        fleet=FleetSpec(prefill=1, decode=2),
        load=LoadSpec(streams=100, documents=5, chat_tokens=(32, 32), batch_fraction=0.0),
        plan=FaultPlan(fixed=(Fault(30.0, FaultKind.KILL, "decode-1"),)),
    ),
}
NAMES = tuple(PRESETS)
_PARTS = {"fleet": FleetSpec, "load": LoadSpec, "plan": FaultPlan, "ties": TieSpec}


def config(name: str, overrides: Mapping[str, Any]) -> ChaosConfig:
    """The preset `name` with each override (a field of ChaosConfig or of one of its parts) laid over it.

    Raises ValueError for a name no preset has, or a field no part has."""
    if name not in PRESETS:
        raise ValueError(f"unknown scenario {name!r}; one of {', '.join(NAMES)}")
    base = PRESETS[name]
    top = {f.name for f in dataclasses.fields(ChaosConfig)} - set(_PARTS)
    parts = {part: {} for part in _PARTS}
    flat = {}
    for key, value in overrides.items():
        owner = next((part for part, cls in _PARTS.items() if key in {f.name for f in dataclasses.fields(cls)}), None)
        if owner is not None:
            parts[owner][key] = value
        elif key in top:
            flat[key] = value
        else:
            raise ValueError(f"no chaos setting is called {key!r}")
    laid = {part: dataclasses.replace(getattr(base, part), **values) for part, values in parts.items()}
    return dataclasses.replace(base, **flat, **laid)


def parse_schedule(value: str) -> tuple[Fault, ...]:
    """"AT:KIND:WORKER[:STOP_S],..." (e.g. "30:kill:decode-1,45:stop:prefill-0:5") -> faults in time order."""
    faults = []
    for item in filter(None, (v.strip() for v in value.split(","))):
        at, kind, target, *rest = item.split(":")
        stop_s = float(rest[0]) if rest else 5.0
        kind = FaultKind(kind)
        faults.append(Fault(float(at), kind, target, stop_s if kind is FaultKind.STOP else 0.0))
    return tuple(sorted(faults, key=lambda f: f.at_s))
