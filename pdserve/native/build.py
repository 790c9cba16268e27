"""Compiles a C source of this package into a shared library once per machine, and loads it.

    cache:  $PDSERVE_CACHE_DIR, else $XDG_CACHE_HOME/pdserve, else ~/.cache/pdserve
    target: -march=$PDSERVE_NATIVE_ARCH, else -march=native (an image built for a fleet names the
            oldest CPU it runs on, e.g. x86-64-v3 or znver1; the kernels size their tiles to it)
    key:    the source, the compiler (its resolved path, size and modification time: nothing is run
            to read it, so a cached library loads without starting the compiler), the flags and
            this CPU's features: a library built with -march=native for one CPU is never loaded on
            another
    build:  `$CC` (else cc) in a temporary folder, then renamed into place: workers starting together
            may each build, and each loads a whole library; the compiler runs only here

Raises NativeBuildError with the reason (no compiler, a compile error, an unwritable cache).
Wrappers load their library through pdserve/native/loader.py, never from here.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

# -ffast-math for the compile only (vectorised expf and sums): linked with it, gcc adds
# crtfastmath.o, whose constructor flushes denormals to zero for the whole process.
COMPILE_FLAGS = ("-O3", "-ffast-math", "-fPIC", "-std=c11", "-c")
LINK_FLAGS = ("-shared",)
LIBS = ("-lm", "-lpthread")
COMPILE_TIMEOUT_S = 120

log = logging.getLogger(__name__)


class NativeBuildError(RuntimeError):
    """The library could not be built or loaded here."""


def load_library(source: Path) -> ctypes.CDLL:
    """The compiled `source`, built now unless this machine has it cached."""
    compiler = _compiler()
    target = cache_dir() / f"{source.stem}-{_key(source, compiler)}.so"
    if not target.exists():
        _compile(compiler, source, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        raise NativeBuildError(f"loading {target} failed: {exc}") from exc


def function_address(function: ctypes._CFuncPtr) -> int:
    """A loaded library's function as an address another C function can call it through."""
    return ctypes.cast(function, ctypes.c_void_p).value


def cache_dir() -> Path:
    explicit = os.environ.get("PDSERVE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdserve"


def _compiler() -> str:
    """The compiler's resolved path: $CC (a name on PATH or a path), else cc, else gcc."""
    named = os.environ.get("CC")
    found = shutil.which(named) if named else shutil.which("cc") or shutil.which("gcc")
    if found is None:
        raise NativeBuildError(f"no C compiler ({named} not found)" if named else
                               "no C compiler (cc, gcc or $CC) on this machine")
    return found


def _key(source: Path, compiler: str) -> str:
    digest = hashlib.sha256(source.read_bytes())
    digest.update(" ".join((*_compile_flags(), *LINK_FLAGS, *LIBS)).encode())
    digest.update(_compiler_identity(compiler).encode())
    digest.update(f"{platform.machine()} {_cpu_features()}".encode())
    return digest.hexdigest()[:16]


def _compiler_identity(compiler: str) -> str:
    """What tells one compiler from another without running it: the file `compiler` resolves to
    (through the cc -> gcc -> gcc-12 links), its size and modification time; an upgrade in place
    or another $CC changes it."""
    real = os.path.realpath(compiler)
    try:
        stat = os.stat(real)
    except OSError as exc:
        raise NativeBuildError(f"the C compiler {compiler} cannot be read: {exc}") from exc
    return f"{real} {stat.st_size} {stat.st_mtime_ns}"


def _compile_flags() -> tuple[str, ...]:
    return (f"-march={os.environ.get('PDSERVE_NATIVE_ARCH') or 'native'}", *COMPILE_FLAGS)


def _cpu_features() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compile(compiler: str, source: Path, target: Path) -> None:
    version = _run([compiler, "--version"]).partition("\n")[0]
    log.info("building %s with %s (%s) into %s", source.name, compiler, version, target.parent)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=target.parent, prefix=f".{target.stem}-")
    except OSError as exc:
        raise NativeBuildError(f"the cache {target.parent} is not writable: {exc}") from exc
    obj, partial = os.path.join(scratch, "kernel.o"), os.path.join(scratch, target.name)
    try:
        _run([compiler, *_compile_flags(), "-o", obj, str(source)])
        _run([compiler, *LINK_FLAGS, "-o", partial, obj, *LIBS])
        os.replace(partial, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"{argv[0]} failed to run: {exc}") from exc
    if done.returncode != 0:
        raise NativeBuildError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return done.stdout
