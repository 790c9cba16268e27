"""Hypothesis strategies for any protobuf message, read off its descriptor.

    messages(Type)          a message with random values in random fields (edge values favoured)
    mutations(Type)         edits of a valid message: one field set to an edge value, cleared,
                            a repeated field emptied or made huge, another member of a oneof set
    wire_bytes(valid)       bytes for the wire: random, or the valid message truncated, flipped,
                            or with junk after it

An edit is data (a path and a value) so that a failing example prints what was sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

HUGE_LISTS = (4096, 300_000)  # a long prompt, and one past --max-prompt-tokens
UINT32 = (0, 1, 2, 15, 16, 17, 127, 49151, 49152, 65535, 2**31 - 1, 2**31, 2**32 - 1)
INT32 = (0, 1, -1, 2, 2**31 - 1, -(2**31))
UINT64 = (0, 1, 2**32, 2**63, 2**64 - 1)
INT64 = (0, 1, -1, 2**63 - 1, -(2**63))
FLOATS = (0.0, -0.0, 1e-30, 0.001, 0.5, 1.0, -1.0, 2.0, 100.0, 1e30, 3.4e38, math.inf, -math.inf, math.nan)
STRINGS = ("", " ", "\x00", "\n", "user", "system", "assistant", "decode", "prefill", "ucx", "inprocess",
           "<|im_start|>system", "<|im_end|>", "é" * 300, "\u202e", "x" * 5000, "y" * 300_000,
           "127.0.0.1:1", "[::1]:0", "unix:/nonexistent", "dns:///localhost:1", "localhost", ":", "a:b:c")
BYTES = (b"", b"\x00", b"\xff" * 64, b"\x00" * 4096)


def _scalars(field: FieldDescriptor, small: bool = False) -> st.SearchStrategy:
    """`small`: short strings and bytes only (the elements of a list made huge)."""
    t = field.type
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.sampled_from(UINT32) | st.integers(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return st.sampled_from(INT32) | st.integers(-(2**31), 2**31 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.sampled_from(UINT64) | st.integers(0, 2**64 - 1)
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return st.sampled_from(INT64) | st.integers(-(2**63), 2**63 - 1)
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.sampled_from(FLOATS) | st.floats(width=32)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return st.text(max_size=4) if small else st.sampled_from(STRINGS) | st.text(max_size=40)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=4) if small else st.sampled_from(BYTES) | st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from(known) | st.sampled_from(INT32)
    raise TypeError(f"no strategy for field {field.full_name} of type {t}")


def _values(field: FieldDescriptor, depth: int, small: bool = False) -> st.SearchStrategy:
    """A value for the field as a whole: a list for a repeated field, a message for a message field."""
    def one(small_: bool) -> st.SearchStrategy:
        if field.message_type:
            return st.deferred(lambda: messages(field.message_type, depth + 1, small_))
        return _scalars(field, small_)

    if not field.is_repeated:
        return one(small)
    few = st.lists(one(small), max_size=8)
    if small:
        return few
    counts = (600, 5000) if field.message_type or field.type == FieldDescriptor.TYPE_STRING else HUGE_LISTS
    return few | st.builds(lambda v, n: [v] * n, one(True), st.sampled_from(counts))


@st.composite
def messages(draw, descriptor: Descriptor, depth: int = 0, small: bool = False) -> Message:
    """A message of `descriptor`'s type with random fields set (nesting stops after 3 levels)."""
    message = _new(descriptor)
    fields = [f for f in descriptor.fields if depth < 3 or not f.message_type]
    for field in draw(st.lists(st.sampled_from(fields), max_size=len(fields), unique=True)) if fields else []:
        SetField((field.name,), draw(_values(field, depth, small))).apply(message)
    return message


@dataclass(frozen=True)
class SetField:
    """Set the field at `path` (names from the top message down) to `value`."""

    path: tuple[str, ...]
    value: Any

    def apply(self, message: Message) -> None:
        *parents, name = self.path
        for parent in parents:
            message = getattr(message, parent)
        field = message.DESCRIPTOR.fields_by_name[name]
        if field.is_repeated:
            message.ClearField(name)
            getattr(message, name).extend(self.value)
        elif field.message_type:
            getattr(message, name).CopyFrom(self.value)
        else:
            setattr(message, name, self.value)

    def __repr__(self) -> str:
        return f"SetField({'.'.join(self.path)}={_short(self.value)})"


@dataclass(frozen=True)
class ClearField:
    path: tuple[str, ...]

    def apply(self, message: Message) -> None:
        *parents, name = self.path
        for parent in parents:
            message = getattr(message, parent)
        message.ClearField(name)

    def __repr__(self) -> str:
        return f"ClearField({'.'.join(self.path)})"


Edit = SetField | ClearField


def _paths(descriptor: Descriptor, prefix: tuple[str, ...] = (), depth: int = 0):
    """Every field reachable through singular message fields, with its path, to 3 levels."""
    for field in descriptor.fields:
        path = (*prefix, field.name)
        yield path, field, depth
        if field.message_type and not field.is_repeated and depth < 2:
            yield from _paths(field.message_type, path, depth + 1)


def _edit(path: tuple[str, ...], field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    return st.builds(SetField, st.just(path), _values(field, depth)) | st.just(ClearField(path))


def mutations(descriptor: Descriptor) -> st.SearchStrategy:
    """One to three edits of a message of `descriptor`'s type, each at a field drawn evenly
    from every nesting level (none for a message without fields)."""
    edits = [_edit(*found) for found in _paths(descriptor)]
    if not edits:
        return st.just([])
    return st.lists(st.one_of(edits), min_size=1, max_size=3)


def mutated(valid: Message, edits: list[Edit]) -> Message:
    message = type(valid)()
    message.CopyFrom(valid)
    for edit in edits:
        edit.apply(message)
    return message


@st.composite
def wire_bytes(draw, valid: bytes) -> bytes:
    """Random bytes, or the valid encoding cut short, with a byte changed, or with junk after it.
    Places are drawn apart from `valid`'s length, which may differ between runs (ids grow)."""
    kind = draw(st.sampled_from(("random", "truncated", "flipped", "appended")))
    at = draw(st.integers(0, 1 << 16)) % max(1, len(valid))
    if kind == "random" or not valid:
        return draw(st.binary(max_size=512))
    if kind == "truncated":
        return valid[:at]
    if kind == "flipped":
        return valid[:at] + bytes([draw(st.integers(0, 255))]) + valid[at + 1:]
    return valid + draw(st.binary(min_size=1, max_size=64))


def _new(descriptor: Descriptor) -> Message:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)()


def _short(value: Any) -> str:
    if isinstance(value, (list, str, bytes)) and len(value) > 12:
        return f"{type(value).__name__}[{len(value)}]({value[:3]!r}...)"
    return repr(value)
