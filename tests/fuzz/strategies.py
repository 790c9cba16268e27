"""Hypothesis strategies for any protobuf message, read off its descriptor.

    messages(Type)          a message with random values in random fields (edge values favoured)
    mutations(Type)         edits of a valid message: one field set to an edge value, cleared,
                            a repeated field emptied or made huge, another member of a oneof set
    payloads(Type)          what to send instead of a valid message: a random one, the valid one
                            edited, or its bytes garbled (cut short, a byte changed, junk after)

Edits and payloads are data (paths and values) so that a failing example prints what was sent.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from google.protobuf import text_format
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
           "<|im_start|>system", "<|im_end|>", "é" * 300, "\u202e",
           "127.0.0.1:1", "[::1]:0", "unix:/nonexistent", "dns:///localhost:1", "localhost", ":", "a:b:c")
LONG_STRINGS = (5000, 300_000)  # characters: past the stop and id limits, and past one prompt's tokens
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
        if small:
            return st.text(max_size=4)
        return st.sampled_from(STRINGS) | st.text(max_size=40) | st.sampled_from(LONG_STRINGS).map(lambda n: "y" * n)
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
    if _is_map(field):  # a map of scalars: keys and values as the entry's fields
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        entries = st.dictionaries(_scalars(key, True), _scalars(value, True), max_size=8)
        return entries if small else entries | st.dictionaries(_scalars(key, True), _scalars(value, True),
                                                                min_size=300, max_size=400)
    few = st.lists(one(small), max_size=8)
    if small:
        return few
    counts = (600, 5000) if field.message_type or field.type == FieldDescriptor.TYPE_STRING else HUGE_LISTS
    return few | st.builds(lambda v, n: [v] * n, one(True), st.sampled_from(counts))


def _is_map(field: FieldDescriptor) -> bool:
    return field.is_repeated and field.message_type is not None and field.message_type.GetOptions().map_entry


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
        if _is_map(field):
            message.ClearField(name)
            getattr(message, name).update(self.value)
        elif field.is_repeated:
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
    """Clear the field at `path` (a oneof member: the whole oneof)."""

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


class Payload(ABC):
    """What to send in place of a valid message; drawn before the valid message exists (it may
    name a live reservation), so that a replayed example draws exactly what it drew before."""

    @abstractmethod
    def render(self, valid: Message) -> bytes:
        """The bytes to send, made from `valid` (which is not changed)."""


@dataclass(frozen=True)
class AsIs(Payload):
    def render(self, valid: Message) -> bytes:
        return valid.SerializeToString()


@dataclass(frozen=True)
class Fresh(Payload):
    """A random message of the request type, whatever the valid one was."""

    message: Message

    def render(self, valid: Message) -> bytes:
        return self.message.SerializeToString()

    def __repr__(self) -> str:
        return f"Fresh({_short(self.message)})"


@dataclass(frozen=True)
class Edited(Payload):
    edits: tuple[Edit, ...]

    def render(self, valid: Message) -> bytes:
        message = type(valid)()
        message.CopyFrom(valid)
        for edit in self.edits:
            edit.apply(message)
        return message.SerializeToString()


@dataclass(frozen=True)
class Garbled(Payload):
    """The valid encoding cut short at `at`, with the byte at `at` replaced, or with `junk`
    after it; or `junk` alone. `at` is taken modulo the encoding's length."""

    kind: str  # "random" | "truncated" | "flipped" | "appended"
    at: int
    byte: int
    junk: bytes

    def render(self, valid: Message) -> bytes:
        encoded = valid.SerializeToString()
        at = self.at % max(1, len(encoded))
        if self.kind == "random" or not encoded:
            return self.junk
        if self.kind == "truncated":
            return encoded[:at]
        if self.kind == "flipped":
            return encoded[:at] + bytes([self.byte]) + encoded[at + 1:]
        return encoded + self.junk


def payloads(descriptor: Descriptor, as_is: bool = False) -> st.SearchStrategy[Payload]:
    """A random message, the valid one edited (the likeliest), or garbled bytes; `as_is` adds
    the valid message unchanged as just as likely as the rest together."""
    garbled = st.builds(Garbled, st.sampled_from(("random", "truncated", "flipped", "appended")),
                        st.integers(0, 1 << 16), st.integers(0, 255), st.binary(min_size=1, max_size=256))
    edited = st.builds(Edited, mutations(descriptor).map(tuple))
    fuzzed = st.one_of(st.builds(Fresh, messages(descriptor)), edited, edited, garbled)
    return st.one_of(st.just(AsIs()), fuzzed) if as_is else fuzzed


def _new(descriptor: Descriptor) -> Message:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)()


def _short(value: Any) -> str:
    if isinstance(value, Message):
        return _cut(text_format.MessageToString(value, as_one_line=True))
    if isinstance(value, list) and value and isinstance(value[0], Message):
        return f"[{len(value)} messages, the first {_short(value[0])}]"
    if isinstance(value, (list, str, bytes)) and len(value) > 12:
        return f"{type(value).__name__}[{len(value)}]({value[:3]!r}...)"
    return repr(value)


def _cut(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
