"""The router's admission flags (argparse), what they make (pdserve/admission/), and what
`pdserve up` passes on to its router."""

from __future__ import annotations

import argparse

from pdserve.admission import AdmissionPolicy, parse_objectives


def add_admission_flags(p: argparse.ArgumentParser) -> None:
    d = AdmissionPolicy()
    g = p.add_argument_group("admission (predicted time to first token against objectives per class)")
    g.add_argument("--ttft-objective", default="",
                   help="seconds to first token per class, as vip=2,normal=10: a request no path is predicted "
                        "to serve within it is prefilled by its decode worker if that is, deferred if BATCH, "
                        "else refused (RESOURCE_EXHAUSTED, HTTP 429 with Retry-After); default: none")
    g.add_argument("--tbt-objective", default="",
                   help="seconds between tokens per class, as vip=0.2: over it on the decode worker's recent "
                        "steps, as over the TTFT objective; default: none")
    g.add_argument("--defer-max-s", type=float, default=d.defer_max_s,
                   help="longest a BATCH request waits at the router for its objective before it runs anyway")


def admission_from_args(args: argparse.Namespace) -> AdmissionPolicy:
    """Raises ValueError naming a malformed objective."""
    if not args.defer_max_s >= 0:
        raise ValueError(f"--defer-max-s must be >= 0, got {args.defer_max_s}")
    return AdmissionPolicy(parse_objectives(args.ttft_objective, args.tbt_objective), args.defer_max_s)


def admission_argv(args: argparse.Namespace) -> list[str]:
    """Checked here first: a malformed objective stops `pdserve up` before anything starts."""
    admission_from_args(args)
    return ["--ttft-objective", args.ttft_objective, "--tbt-objective", args.tbt_objective,
            "--defer-max-s", str(args.defer_max_s)]
