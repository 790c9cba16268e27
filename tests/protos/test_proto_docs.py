"""Every message, field, enum, value, service and rpc of the public API has a doc comment."""

import importlib.resources

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from proto_helpers import REPO_ROOT

# FileDescriptorProto / DescriptorProto / ... field numbers used in SourceCodeInfo paths.
MESSAGE, ENUM, SERVICE = 4, 5, 6
FIELD, NESTED_ENUM, ONEOF = 2, 4, 8
VALUE, METHOD = 2, 2


def _source_info(tmp_path):
    out = tmp_path / "generation.pb"
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    status = protoc.main([
        "protoc", f"-I{REPO_ROOT / 'protos'}", f"-I{well_known}", "--include_source_info",
        f"--descriptor_set_out={out}", "pdserve/v1/generation.proto",
    ])
    assert status == 0
    file_set = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return file_set.file[0]


def _documented_paths(proto):
    return {
        tuple(loc.path)
        for loc in proto.source_code_info.location
        if loc.leading_comments.strip()
    }


def _required_paths(proto):
    for m, message in enumerate(proto.message_type):
        yield (MESSAGE, m), message.name
        for f, field in enumerate(message.field):
            yield (MESSAGE, m, FIELD, f), f"{message.name}.{field.name}"
        for o, oneof in enumerate(message.oneof_decl):
            if not oneof.name.startswith("_"):
                yield (MESSAGE, m, ONEOF, o), f"{message.name}.{oneof.name}"
    for e, enum in enumerate(proto.enum_type):
        yield (ENUM, e), enum.name
        for v, value in enumerate(enum.value):
            yield (ENUM, e, VALUE, v), value.name
    for s, service in enumerate(proto.service):
        yield (SERVICE, s), service.name
        for r, method in enumerate(service.method):
            yield (SERVICE, s, METHOD, r), f"{service.name}.{method.name}"


def test_every_declaration_has_a_doc_comment(tmp_path):
    proto = _source_info(tmp_path)
    documented = _documented_paths(proto)
    missing = [name for path, name in _required_paths(proto) if path not in documented]
    assert missing == []
    assert len(list(_required_paths(proto))) > 50


def test_sampling_defaults_are_documented(tmp_path):
    proto = _source_info(tmp_path)
    comments = {tuple(loc.path): loc.leading_comments for loc in proto.source_code_info.location}
    index = [m.name for m in proto.message_type].index("SamplingParams")
    sampling = proto.message_type[index]
    for f, field in enumerate(sampling.field):
        assert "Default" in comments[(MESSAGE, index, FIELD, f)], field.name
