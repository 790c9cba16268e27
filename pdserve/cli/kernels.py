"""`pdserve kernels --into DIR`: builds every C kernel for an explicit target into a folder that
workers then load from without a compiler (PDSERVE_NATIVE_PREBUILT=DIR, PDSERVE_NATIVE_ARCH the
same target): the image's build step, so no pod compiles at start."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, name: str) -> None:
    from pdserve.native.target import target

    p = sub.add_parser(name, help="build the C kernels for a target into a folder workers load them from")
    p.add_argument("--into", type=Path, required=True, help="the folder (PDSERVE_NATIVE_PREBUILT at run time)")
    p.add_argument("--arch", default=target(),
                   help="the -march to build for: the oldest CPU the image runs on, e.g. x86-64-v3 "
                        "(default $PDSERVE_NATIVE_ARCH; PDSERVE_NATIVE_ARCH must name it at run time)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pdserve.native.build import NativeBuildError, prebuild
    from pdserve.native.loader import every_source
    from pdserve.native.target import read_needs

    try:
        built = prebuild(every_source(), args.into, args.arch)
    except NativeBuildError as exc:
        print(f"pdserve kernels: {exc}")
        return 1
    for library in built:
        print(f"{library}  needs: {' '.join(sorted(read_needs(library))) or '-'}")
    print(f"run with PDSERVE_NATIVE_ARCH={args.arch} PDSERVE_NATIVE_PREBUILT={args.into}")
    return 0
