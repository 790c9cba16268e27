"""What the kernels are built for, and whether this CPU can run a library built for it.

    target: $PDSERVE_NATIVE_ARCH (an image built for a fleet names the oldest CPU it runs on,
            e.g. x86-64-v3 or znver1), else native (this CPU)
    needs:  the instruction-set features the compiler enables for the target, read from its
            predefined macros when a library is built (`cc -march=T -dM -E`), named as
            /proc/cpuinfo names them, kept beside the library (<library>.needs)

A library whose needs this CPU lacks is refused before it is loaded: loaded, it would end the
process with SIGILL at its first vector instruction. Features the table below does not name
(none that a kernel's arithmetic uses) are not checked.
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path

NATIVE = "native"

# The compiler's macro for a feature -> the feature's name in /proc/cpuinfo's flags.
MACRO_FLAGS = {
    "__SSE3__": "pni", "__SSSE3__": "ssse3", "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2",
    "__SSE4A__": "sse4a", "__POPCNT__": "popcnt", "__LZCNT__": "abm", "__MOVBE__": "movbe",
    "__XSAVE__": "xsave", "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__FMA4__": "fma4",
    "__F16C__": "f16c", "__BMI__": "bmi1", "__BMI2__": "bmi2", "__ADX__": "adx", "__AES__": "aes",
    "__PCLMUL__": "pclmulqdq", "__SHA__": "sha_ni", "__RDRND__": "rdrand", "__RDSEED__": "rdseed",
    "__CLZERO__": "clzero", "__GFNI__": "gfni", "__VAES__": "vaes", "__VPCLMULQDQ__": "vpclmulqdq",
    "__AVXVNNI__": "avx_vnni", "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw",
    "__AVX512CD__": "avx512cd", "__AVX512DQ__": "avx512dq", "__AVX512VL__": "avx512vl",
    "__AVX512IFMA__": "avx512ifma", "__AVX512VBMI__": "avx512vbmi", "__AVX512VBMI2__": "avx512_vbmi2",
    "__AVX512VNNI__": "avx512_vnni", "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq", "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16", "__AMX_TILE__": "amx_tile", "__AMX_BF16__": "amx_bf16",
    "__AMX_INT8__": "amx_int8",
}


class TargetError(RuntimeError):
    """The compiler cannot say what the target needs (it does not know the target)."""


def target() -> str:
    """The -march the kernels are built for here."""
    return os.environ.get("PDSERVE_NATIVE_ARCH") or NATIVE


def needs_of(compiler: str, arch: str, timeout_s: float) -> frozenset[str]:
    """The features `compiler` enables for -march=`arch`, as /proc/cpuinfo names them."""
    argv = [compiler, f"-march={arch}", "-dM", "-E", "-x", "c", os.devnull]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"{compiler} failed to run: {exc}") from exc
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line] or [done.stderr.strip()]
        raise TargetError(f"{compiler} does not know -march={arch}: {errors[0][-300:]}")
    return flags_of_macros(line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define "))


def flags_of_macros(macros: Iterable[str]) -> frozenset[str]:
    return frozenset(MACRO_FLAGS[m] for m in macros if m in MACRO_FLAGS)


def write_needs(library: Path, needs: frozenset[str]) -> None:
    needs_path(library).write_text(" ".join(sorted(needs)) + "\n")


def read_needs(library: Path) -> frozenset[str]:
    """What `library` was built to need; nothing where it was built before needs were kept."""
    try:
        return frozenset(needs_path(library).read_text().split())
    except FileNotFoundError:
        return frozenset()


def needs_path(library: Path) -> Path:
    return library.with_name(library.name + ".needs")


def lacking(needs: frozenset[str]) -> list[str]:
    """The features of `needs` this CPU does not have, sorted; none on a CPU whose flags cannot be
    read (not Linux): there the target is the operator's word."""
    flags = cpu_flags()
    return sorted(needs - flags) if flags else []


def cpu_flags() -> frozenset[str]:
    return frozenset(cpu_features_line().partition(":")[2].split())


def cpu_features_line() -> str:
    """/proc/cpuinfo's line of this CPU's features (x86 "flags", Arm "Features")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()
