"""`pdserve` command line: one subcommand per module, each with add_parser() and run(); every
one of SUBCOMMANDS must import."""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import io
import logging
import sys

SUBCOMMANDS = {
    "generate": "pdserve.cli.generate",
    "up": "pdserve.cli.up",
    "serve": "pdserve.cli.serve",
    "router": "pdserve.cli.services",
    "prefill": "pdserve.cli.services",
    "decode": "pdserve.cli.services",
    "bench": "pdserve.cli.bench",
    "simulate": "pdserve.cli.simulate",
    "chaos": "pdserve.cli.chaos",
    "info": "pdserve.cli.info",
    "kernels": "pdserve.cli.kernels",
    "set-role": "pdserve.cli.set_role",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve", description="Disaggregated LLM inference service")
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in SUBCOMMANDS.items():
        _subcommand(module, name).add_parser(sub, name)
    return parser


def _subcommand(module: str, name: str):
    """The subcommand's module. NOTE: one that fails to import fails the whole command line,
    so a deleted or broken service is an error (and its tests fail), never a missing subcommand."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"pdserve {name}: its module {module} fails to import: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _enable_faulthandler()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130


def _enable_faulthandler() -> None:
    """A crash in native code (UCX, the kernels) leaves every thread's Python stack in the log."""
    try:
        faulthandler.enable()
    except (io.UnsupportedOperation, AttributeError, ValueError):
        pass  # stderr is no file (main() called in-process, under a caller's capture): nothing to write to


if __name__ == "__main__":
    sys.exit(main())
