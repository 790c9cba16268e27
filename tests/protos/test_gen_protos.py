import os
import subprocess
import sys

from proto_helpers import REPO_ROOT


def _copy_protos(tmp_path):
    dest = tmp_path / "protos" / "pdserve" / "v1"
    dest.mkdir(parents=True)
    source = REPO_ROOT / "protos" / "pdserve" / "v1" / "generation.proto"
    (dest / "generation.proto").write_text(source.read_text())
    return dest / "generation.proto"


def test_generate_writes_stubs_and_init_files(gen_protos, tmp_path):
    _copy_protos(tmp_path)
    result = gen_protos.generate(tmp_path, out=tmp_path / "out")
    assert result.ran_protoc
    names = sorted(p.name for p in (tmp_path / "out" / "pdserve" / "v1").iterdir())
    assert names == [
        "__init__.py",
        "generation_pb2.py",
        "generation_pb2.pyi",
        "generation_pb2_grpc.py",
    ]
    assert (tmp_path / "out" / "pdserve" / "__init__.py").exists()
    assert all(p.exists() for p in result.outputs)


def test_generate_skips_fresh_outputs_and_reruns_on_newer_proto(gen_protos, tmp_path):
    proto = _copy_protos(tmp_path)
    gen_protos.generate(tmp_path)
    assert not gen_protos.generate(tmp_path).ran_protoc
    future = proto.stat().st_mtime + 10
    os.utime(proto, (future, future))
    assert gen_protos.generate(tmp_path).ran_protoc
    assert gen_protos.generate(tmp_path, force=True).ran_protoc


def test_generate_keeps_existing_init(gen_protos, tmp_path):
    _copy_protos(tmp_path)
    package = tmp_path / "pdserve"
    package.mkdir()
    (package / "__init__.py").write_text("MARK = 1\n")
    gen_protos.generate(tmp_path)
    assert (package / "__init__.py").read_text() == "MARK = 1\n"


def test_generated_package_imports_from_its_root(gen_protos, tmp_path):
    _copy_protos(tmp_path)
    gen_protos.generate(tmp_path, out=tmp_path / "out")
    code = "import pdserve.v1.generation_pb2_grpc as g; print(g.GenerationStub.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path / "out",
        env={**os.environ, "PYTHONPATH": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "GenerationStub"


def test_script_entry_point_reports_up_to_date(tmp_path):
    _copy_protos(tmp_path)
    script = REPO_ROOT / "tools" / "gen_protos.py"
    run = [sys.executable, str(script), "--root", str(tmp_path)]
    first = subprocess.run(run, capture_output=True, text=True, timeout=60)
    second = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.startswith("generated 3 files from 1 protos")
    assert second.stdout.startswith("up to date")
