"""Compiles a C source of this package into a shared library once per machine (or once per
image), and loads it.

    target:   -march=$PDSERVE_NATIVE_ARCH, else -march=native (pdserve/native/target.py)
    prebuilt: $PDSERVE_NATIVE_PREBUILT, a read-only folder of libraries built for the explicit
              target when the image was built (`pdserve kernels --into DIR`), looked in first: a
              pod that finds its kernels there starts without a compiler and compiles nothing
    cache:    $PDSERVE_CACHE_DIR, else $XDG_CACHE_HOME/pdserve, else ~/.cache/pdserve
    key:      the source, the flags, the target and (in the cache) the compiler: its resolved
              path, size and modification time, so a cached library loads without starting it;
              for -march=native this CPU's features too, so a library built for one CPU is never
              loaded on another
    needs:    every library is checked against this CPU's features before it is loaded: one
              built for a target this CPU does not implement is refused with the features it lacks
    build:    `$CC` (else cc) in a temporary folder, then renamed into place, under a lock file
              beside it: threads and workers starting together build each library once, the
              others wait for it; the compiler runs only here
    behind:   `build_behind(sources)` builds the ones not built yet on a thread of its own, so a
              worker's first start compiles while it reads the model and measures its layouts (a
              library needed before its turn is built where it is needed, or waited for)

Raises NativeBuildError with the reason (no compiler, a compile error, an unwritable cache, a
CPU without the target's features). Wrappers load their library through pdserve/native/loader.py,
never from here.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pdserve.native.target import (NATIVE, TargetError, cpu_features_line, lacking, needs_of,
                                   needs_path, read_needs, target, write_needs)

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
    """The compiled `source`: the image's prebuilt one, else this machine's cached one, else one
    built now."""
    arch = target()
    shipped = _prebuilt(source, arch)
    if shipped is not None:
        return _open(shipped, arch)
    if prebuilt_dir() is not None and arch != NATIVE:
        log.info("no prebuilt %s for -march=%s in %s (another source): building it", source.name, arch, prebuilt_dir())
    return _open(_built(source, arch), arch)


def build_behind(sources: Sequence[Path]) -> threading.Thread:
    """Builds every one of `sources` that is neither prebuilt nor cached, in order, on a thread of
    its own (started); a failure is left for the load that needs the library to report."""
    def build() -> None:
        arch = target()
        for source in sources:
            try:
                if _prebuilt(source, arch) is None:
                    _built(source, arch)
            except (NativeBuildError, TargetError) as exc:
                log.debug("building %s ahead failed: %s", source.name, exc)

    thread = threading.Thread(target=build, name="build-kernels", daemon=True)
    thread.start()
    return thread


def _prebuilt(source: Path, arch: str) -> Path | None:
    shipped = prebuilt_dir()
    if shipped is None or arch == NATIVE:
        return None
    library = shipped / library_name(source, arch)
    return library if library.exists() else None


def _built(source: Path, arch: str) -> Path:
    """This machine's cached library of `source`, compiled now unless it is there (or once another
    thread or process compiling it now is done)."""
    compiler = _compiler()
    library = cache_dir() / f"{source.stem}-{_key(source, arch, compiler)}.so"
    if library.exists():
        return library
    with _building(library):
        if not library.exists():
            _compile(compiler, source, library, arch)
    return library


@contextmanager
def _building(library: Path) -> Iterator[None]:
    """Holds `library`'s lock file (none where its folder is not writable: the compile says so)."""
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        lock = open(library.parent / f".{library.stem}.lock", "a")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prebuild(sources: list[Path], into: Path, arch: str) -> list[Path]:
    """Builds every one of `sources` for -march=`arch` into `into`, named as load_library looks
    for them there when `arch` is its target: the image's step (`pdserve kernels`)."""
    if arch == NATIVE:
        raise NativeBuildError("a prebuilt kernel needs an explicit target: set PDSERVE_NATIVE_ARCH to the "
                               "oldest CPU it runs on (e.g. x86-64-v3), not native")
    compiler = _compiler()
    built = [into / library_name(source, arch) for source in sources]
    for source, library in zip(sources, built):
        _compile(compiler, source, library, arch)
    return built


def library_name(source: Path, arch: str) -> str:
    """A prebuilt library's name: its source, flags and target, not the compiler that built it
    (a pod may have none)."""
    return f"{source.stem}-{_digest(source, arch).hexdigest()[:16]}.so"


def prebuilt_dir() -> Path | None:
    named = os.environ.get("PDSERVE_NATIVE_PREBUILT")
    return Path(named) if named else None


def function_address(function: ctypes._CFuncPtr) -> int:
    """A loaded library's function as an address another C function can call it through."""
    return ctypes.cast(function, ctypes.c_void_p).value


def cache_dir() -> Path:
    explicit = os.environ.get("PDSERVE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pdserve"


def _open(library: Path, arch: str) -> ctypes.CDLL:
    missing = lacking(read_needs(library))
    if missing:
        raise NativeBuildError(f"{library.name} is built for -march={arch}, which needs {' '.join(missing)}: "
                               "this CPU lacks them")
    try:
        return ctypes.CDLL(str(library))
    except OSError as exc:
        raise NativeBuildError(f"loading {library} failed: {exc}") from exc


def _compiler() -> str:
    """The compiler's resolved path: $CC (a name on PATH or a path), else cc, else gcc."""
    named = os.environ.get("CC")
    found = shutil.which(named) if named else shutil.which("cc") or shutil.which("gcc")
    if found is None:
        raise NativeBuildError(f"no C compiler ({named} not found)" if named else
                               "no C compiler (cc, gcc or $CC) on this machine")
    return found


def _digest(source: Path, arch: str):
    digest = hashlib.sha256(source.read_bytes())
    digest.update(" ".join((*_compile_flags(arch), *LINK_FLAGS, *LIBS)).encode())
    return digest


def _key(source: Path, arch: str, compiler: str) -> str:
    digest = _digest(source, arch)
    digest.update(_compiler_identity(compiler).encode())
    if arch == NATIVE:
        digest.update(f"{platform.machine()} {cpu_features_line()}".encode())
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


def _compile_flags(arch: str) -> tuple[str, ...]:
    return (f"-march={arch}", *COMPILE_FLAGS)


def _compile(compiler: str, source: Path, library: Path, arch: str) -> None:
    version = _run([compiler, "--version"]).partition("\n")[0]
    log.info("building %s for -march=%s with %s (%s) into %s", source.name, arch, compiler, version, library.parent)
    try:
        needs = needs_of(compiler, arch, COMPILE_TIMEOUT_S)
    except TargetError as exc:
        raise NativeBuildError(str(exc)) from exc
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=library.parent, prefix=f".{library.stem}-")
    except OSError as exc:
        raise NativeBuildError(f"the folder {library.parent} is not writable: {exc}") from exc
    obj, partial = os.path.join(scratch, "kernel.o"), Path(scratch) / library.name
    try:
        _run([compiler, *_compile_flags(arch), "-o", obj, str(source)])
        _run([compiler, *LINK_FLAGS, "-o", str(partial), obj, *LIBS])
        write_needs(partial, needs)
        os.replace(needs_path(partial), needs_path(library))  # before the library: never one without its needs
        os.replace(partial, library)
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
