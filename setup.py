"""Build hook: generate the gRPC stubs from protos/ before building Python packages.

Metadata lives in pyproject.toml. This file only swaps in a `build_py` that runs
tools/gen_protos.py first, so `pip install .` and `pip install -e .` both ship
`pdserve.v1.generation_pb2` (needs grpcio-tools in the build requirements).
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
GENERATOR = ROOT / "tools" / "gen_protos.py"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _package_name(folder: Path) -> str:
    return ".".join(folder.relative_to(ROOT).parts)


class BuildPyWithProtos(build_py):
    """`build_py` that generates every protos/**/*.proto into its package first."""

    def run(self):
        if not GENERATOR.exists():  # an sdist built without tools/: stubs shipped pre-generated
            return super().run()
        generator = _load_generator()
        generator.generate(ROOT)
        layout = generator.ProtoLayout(proto_root=ROOT / "protos", out_root=ROOT)
        for folder in layout.package_dirs():
            self._add_package(_package_name(folder))
        super().run()

    def _add_package(self, name: str) -> None:
        if name not in self.packages:
            self.packages.append(name)
        self.package_data.setdefault(name, []).append("*.pyi")
        self.__dict__.pop("data_files", None)


setup(cmdclass={"build_py": BuildPyWithProtos})
