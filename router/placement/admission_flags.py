"""The router's admission flags (argparse), what they make (pdserve/admission/), and what
`pdserve up` passes on to its router."""

from __future__ import annotations

import argparse

from pdserve.admission import AdmissionPolicy, parse_objectives
from pdserve.admission.objectives import parse_class_seconds


def _class_seconds(flag: str):
    """An argparse type: the flag's text, once it parses (else argparse's usage error)."""
    def check(text: str) -> str:
        try:
            parse_class_seconds(text, flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return check


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_admission_flags(p: argparse.ArgumentParser) -> None:
    d = AdmissionPolicy()
    g = p.add_argument_group("admission (predicted time to first token against objectives per class)")
    g.add_argument("--ttft-objective", default="", type=_class_seconds("--ttft-objective"),
                   help="seconds to first token per class, as vip=2,normal=10: a request no path is predicted "
                        "to serve within it is prefilled by its decode worker if that is, deferred if BATCH, "
                        "else refused (RESOURCE_EXHAUSTED, HTTP 429 with Retry-After); default: none")
    g.add_argument("--tbt-objective", default="", type=_class_seconds("--tbt-objective"),
                   help="seconds between tokens per class, as vip=0.2: over it on the decode worker's recent "
                        "steps, as over the TTFT objective; default: none")
    g.add_argument("--defer-max-s", type=_seconds, default=d.defer_max_s,
                   help="longest a BATCH request waits at the router for its objective before it runs anyway")


def admission_from_args(args: argparse.Namespace) -> AdmissionPolicy:
    return AdmissionPolicy(parse_objectives(args.ttft_objective, args.tbt_objective), args.defer_max_s)


def admission_argv(args: argparse.Namespace) -> list[str]:
    return ["--ttft-objective", args.ttft_objective, "--tbt-objective", args.tbt_objective,
            "--defer-max-s", str(args.defer_max_s)]
