"""`pdserve chaos`: a seeded schedule of worker faults under load, judged against a no-fault run."""

from __future__ import annotations

import argparse
import signal
import sys

NOT_SETTINGS = {"command", "log_level", "run", "scenario", "json"}


def _pair(kind: type):
    def parse(value: str) -> tuple:
        low, _, high = value.partition(",")
        return kind(low), kind(high or low)
    return parse


def _words(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _kinds(value: str):
    from pdserve.chaos.schedule import parse_kinds

    try:
        return parse_kinds(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _schedule(value: str):
    from pdserve.chaos.scenarios import parse_schedule

    try:
        return parse_schedule(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"AT:KIND:WORKER[:STOP_S],...: {exc}") from exc


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from pdserve.chaos.scenarios import NAMES

    p = sub.add_parser(name, help="faults under load on real processes, against a no-fault run")
    p.add_argument("--scenario", default="default", choices=NAMES, help="a preset; other flags change it")
    p.add_argument("--json", default=None, help="write everything, every request's tokens included, here")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-progress", dest="progress", action="store_const", const=False, default=None)
    f = p.add_argument_group("fleet")
    f.add_argument("--fleet", dest="fleet_kind", choices=["separate", "up", "hosts"], default=None,
                   help="separate: a process per worker, restarted by the harness; up: one `pdserve up`; hosts: "
                        "separate, with the router and each worker on a test host of its own (network namespaces; "
                        "root only)")
    f.add_argument("--baseline-fleet", choices=["fresh", "same"], default=None,
                   help="the no-fault run on a fleet of its own (fresh) or on the faulted one (same)")
    f.add_argument("--prefill-workers", dest="prefill", type=int, default=None)
    f.add_argument("--decode-workers", dest="decode", type=int, default=None)
    for flag, kind in (("--threads", int), ("--kv-blocks", int), ("--host-kv-blocks", int), ("--token-budget", int),
                       ("--max-chunk-tokens", int), ("--drain-timeout-s", float), ("--restart-delay-s", float),
                       ("--time-slice-s", float)):
        f.add_argument(flag, type=kind, default=None)
    f.add_argument("--kv-timeout", dest="kv_timeout_s", type=float, default=None, help="router: seconds for KV")
    f.add_argument("--deterministic", action="store_const", const=True, default=None,
                   help="workers in deterministic mode: every output must equal the no-fault run's exactly "
                        "(no tie judge)")
    f.add_argument("--reserve-at", dest="reserve_at", choices=["prefill", "arrival"], default=None,
                   help="router: decode blocks reserved once the prefill starts, or at arrival")
    f.add_argument("--ready-timeout", dest="ready_timeout_s", type=float, default=None)
    g = p.add_argument_group("load")
    g.add_argument("--streams", type=int, default=None, help="concurrent chat streams")
    g.add_argument("--documents", type=int, default=None, help="BATCH documents of about 1,800 words")
    g.add_argument("--chat-words", type=_pair(int), default=None, help="LOW,HIGH prompt words of a chat")
    g.add_argument("--chat-tokens", type=_pair(int), default=None, help="LOW,HIGH tokens out of a chat")
    g.add_argument("--document-tokens", type=int, default=None)
    g.add_argument("--temperature", type=float, default=None, help="of the seeded half")
    g.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (default: all at once)")
    s = p.add_argument_group("faults")
    s.add_argument("--faults", type=int, default=None, help="how many, placed by the seed")
    s.add_argument("--fault-kinds", dest="kinds", type=_kinds, default=None, help="of kill,stop,term")
    s.add_argument("--fault-roles", dest="roles", type=_words, default=None, help="of prefill,decode")
    s.add_argument("--stop-s", type=_pair(float), default=None, help="LOW,HIGH seconds between SIGSTOP and SIGCONT")
    s.add_argument("--recovery-s", type=float, default=None, help="a restart's length when placing faults")
    s.add_argument("--max-down-per-role", type=int, default=None,
                   help="workers of one role faulted at once (default 1; 0: no limit)")
    s.add_argument("--first-fault-s", dest="first_s", type=float, default=None)
    s.add_argument("--span-s", type=float, default=None, help="last fault start (default: 0.8 x no-fault run)")
    s.add_argument("--schedule", dest="fixed", type=_schedule, default=None,
                   help="fixed faults instead of seeded ones: AT:KIND:WORKER[:STOP_S],...")
    v = p.add_argument_group("verdict")
    v.add_argument("--settle-s", type=float, default=None, help="a fault's TBT window lasts this long past its end")
    v.add_argument("--blocks-bound-s", type=float, default=None, help="default: kv timeout + 10")
    v.add_argument("--recovery-timeout-s", type=float, default=None)
    v.add_argument("--duration-limit-s", type=float, default=None, help="per run")
    p.set_defaults(run=run)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    from pdserve.bench.report import write_json
    from pdserve.chaos import harness, report, scenarios

    overrides = {k: v for k, v in vars(args).items() if k not in NOT_SETTINGS and v is not None}
    try:
        config = scenarios.config(args.scenario, overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = harness.run(config)
    except (harness.FleetStartError, harness.ScheduleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.format_report(result), flush=True)
    if args.json:
        write_json(args.json, report.to_document(result))
        print(f"wrote {args.json}")
    return 0 if result.verdict.passed else 1
