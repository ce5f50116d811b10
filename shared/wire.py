"""Typed messages in msgpack frames: the codec under the router <-> worker protocol
(shared/protocol.py) and the worker <-> worker KV channel (shared/kv_transfer.py).

A frame is a msgpack array `[tag, body]`: `tag` an int naming the message's dataclass, `body`
a map of its fields by name. A field may be a scalar, bytes, a nested dataclass, a tuple, a
map of strings, `X | None`, or a tagged union (a `[tag, body]` array, for the unions given to
the codec). Unknown body keys are ignored (a newer peer may add optional fields); a missing
field without a default, a wrong type, an unknown tag or bad msgpack raises ProtocolError."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing

import msgpack


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol."""


_SCALARS = (int, float, str, bool, bytes, type(None))


class Codec:
    """Encodes and decodes the messages of one table (tags are the wire contract: never
    renumber, only add); `unions` maps a union annotation to its own table of tags."""

    def __init__(
        self,
        messages: dict[int, type],
        unions: dict[object, dict[int, type]] | None = None,
        max_frame_bytes: int = 64 * 1024 * 1024,
    ):
        self.messages, self.unions = messages, unions or {}
        self.max_frame_bytes = max_frame_bytes
        self._tags = {cls: tag for tag, cls in messages.items()}
        self._union_tags = {
            cls: tag for table in self.unions.values() for tag, cls in table.items()
        }

    def encode(self, msg) -> bytes:
        """One message as a msgpack frame."""
        tag = self._tags.get(type(msg))
        if tag is None:
            raise TypeError(f"not a protocol message: {type(msg).__name__}")
        return msgpack.packb([tag, self._fields_to_wire(msg)], use_bin_type=True)

    def decode(self, frame: bytes):
        """Parse one frame; ProtocolError on anything that is not a valid message."""
        if len(frame) > self.max_frame_bytes:
            raise ProtocolError(f"frame of {len(frame)} bytes is over {self.max_frame_bytes}")
        try:
            raw = msgpack.unpackb(frame, raw=False, strict_map_key=True)
        except Exception as e:  # msgpack raises many types for garbage; all mean the same here
            raise ProtocolError(f"bad msgpack: {e}") from None
        cls, body = _tagged(raw, self.messages, "message")
        return self._from_wire_fields(cls, body, cls.__name__)

    # ------------------------------------------------------------ encoding

    def _fields_to_wire(self, obj) -> dict:
        return {f.name: self._to_wire(getattr(obj, f.name)) for f in dataclasses.fields(obj)}

    def _to_wire(self, value):
        if type(value) in _SCALARS:
            return value
        if type(value) in self._union_tags:
            return [self._union_tags[type(value)], self._fields_to_wire(value)]
        if dataclasses.is_dataclass(value):
            return self._fields_to_wire(value)
        if isinstance(value, tuple | list):
            # token ids (a Generate's bulk) as they are: walking them was 75% of routing CPU
            if all(type(v) is int for v in value):
                return value
            return [self._to_wire(v) for v in value]
        return value

    # ------------------------------------------------------------ decoding

    def _from_wire_fields(self, cls: type, body: dict, path: str):
        hints = _hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name in body:
                kwargs[f.name] = self._from_wire(hints[f.name], body[f.name], f"{path}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{path}: missing field {f.name!r}")
        return cls(**kwargs)

    def _from_wire(self, annotation, value, path: str):
        """Check `value` against `annotation`, converting lists and maps to their Python types."""
        if annotation in self.unions:  # a tagged union, unlike the `X | None` unions
            cls, body = _tagged(value, self.unions[annotation], f"{path} event")
            return self._from_wire_fields(cls, body, f"{path}.{cls.__name__}")
        origin = typing.get_origin(annotation)
        if origin in (types.UnionType, typing.Union):
            return self._from_wire_union(typing.get_args(annotation), value, path)
        if origin is tuple:
            if not isinstance(value, list):
                raise ProtocolError(f"{path}: expected an array, got {type(value).__name__}")
            return tuple(self._from_wire(typing.get_args(annotation)[0], v, path) for v in value)
        if origin is dict:  # of strings (a trace context)
            if isinstance(value, dict) and all(type(x) is str for kv in value.items() for x in kv):
                return value
            raise ProtocolError(f"{path}: expected a map of strings")
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            if not isinstance(value, dict):
                raise ProtocolError(f"{path}: expected a map, got {type(value).__name__}")
            return self._from_wire_fields(annotation, value, path)
        return _scalar(annotation, value, path)

    def _from_wire_union(self, options: tuple, value, path: str):
        if value is None:
            if type(None) in options:
                return None
            raise ProtocolError(f"{path}: must not be null")
        (inner,) = [o for o in options if o is not type(None)]  # only `X | None` is used
        return self._from_wire(inner, value, path)


def _tagged(raw, table: dict[int, type], what: str) -> tuple[type, dict]:
    if not (isinstance(raw, list) and len(raw) == 2):
        raise ProtocolError(f"{what} must be a [tag, body] array")
    tag, body = raw
    if type(tag) is not int or tag not in table:
        raise ProtocolError(f"unknown {what} tag {tag!r}")
    if not isinstance(body, dict):
        raise ProtocolError(f"{what} body must be a map")
    return table[tag], body


@functools.cache
def _hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def _scalar(annotation, value, path: str):
    if annotation is float and type(value) in (int, float):
        return float(value)
    if annotation in (int, str, bool, bytes) and type(value) is annotation:
        return value
    expected = getattr(annotation, "__name__", str(annotation))
    raise ProtocolError(f"{path}: expected {expected}, got {type(value).__name__}")
