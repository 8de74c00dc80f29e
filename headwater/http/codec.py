"""JSON in and out of the HTTP API: request bodies as msgspec structs, records as JSON objects.

Bodies and keys are bytes. In a request, ``value`` (and ``key``) are text sent as UTF-8
unless ``encoding`` (``key_encoding``) is ``"base64"``. In an answer, a value that is UTF-8
text (no control characters but tab and line ends) is given as text, any other as base64
with ``"encoding": "base64"`` beside it (the same for keys, with ``key_encoding``);
``?encoding=base64`` on a read gives every value and key as base64, for clients that want
one shape.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import msgspec

from headwater.errors import InvalidArgumentError
from headwater.model.message import Record

__all__ = [
    "ENCODINGS",
    "MessageIn",
    "ProduceBatch",
    "record_json",
    "decode_body",
    "bytes_of",
    "plain",
]

ENCODINGS = ("utf-8", "base64")


class MessageIn(msgspec.Struct, forbid_unknown_fields=True):
    """One message to produce. ``value`` is text (UTF-8) or, with ``"encoding": "base64"``,
    base64 of any bytes; ``key`` likewise with ``key_encoding``. ``partition``: send there
    (default: by the key's hash, else round robin). ``delay_ms`` or ``deliver_at_ms`` (epoch
    ms) make it a delayed message."""

    value: str
    encoding: str = "utf-8"
    key: str | None = None
    key_encoding: str = "utf-8"
    tag: str | None = None
    properties: dict[str, str] | None = None
    partition: int | None = None
    delay_ms: int | None = None
    deliver_at_ms: int | None = None


class ProduceBatch(msgspec.Struct, forbid_unknown_fields=True):
    """A batch to produce: ``{"messages": [MessageIn, ...]}`` (1 to 10,000 messages)."""

    messages: list[MessageIn]


def decode_body(raw: bytes, cls: type[Any]) -> Any:
    """``raw`` (a request body) as a ``cls``; InvalidArgumentError naming the field that is
    wrong or missing, or saying the body is not JSON."""
    if not raw.strip():
        raise InvalidArgumentError(f"the request needs a JSON body ({cls.__name__})")
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as e:
        raise InvalidArgumentError(f"bad request body: {e}") from None
    except msgspec.DecodeError as e:
        raise InvalidArgumentError(f"the request body is not valid JSON: {e}") from None


def bytes_of(text: str, encoding: str, field: str) -> bytes:
    """The bytes a request field carries; InvalidArgumentError naming ``field`` if its
    encoding is unknown or its base64 is broken."""
    if encoding == "utf-8":
        return text.encode()
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgumentError(f"{field} is not valid base64") from None
    raise InvalidArgumentError(f"{field}: encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")


# control characters other than tab and line ends: bytes that are UTF-8 but not text
_BINARY = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _text_or_base64(data: bytes, force_base64: bool) -> tuple[str, bool]:
    if not force_base64 and not _BINARY.search(data):
        try:
            return data.decode(), False
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode(), True


def record_json(r: Record, force_base64: bool = False) -> dict[str, Any]:
    """A record as the API answers it (see the module docstring for the encodings)."""
    value, b64 = _text_or_base64(r.body, force_base64)
    out: dict[str, Any] = {
        "queue": r.queue,
        "partition": r.partition,
        "offset": r.offset,
        "id": str(r.message_id),
        "timestamp_ms": r.timestamp_ms,
        "value": value,
    }
    if b64:
        out["encoding"] = "base64"
    if r.key is not None:
        key, kb64 = _text_or_base64(r.key, force_base64)
        out["key"] = key
        if kb64:
            out["key_encoding"] = "base64"
    if r.tag is not None:
        out["tag"] = r.tag
    if r.properties:
        out["properties"] = r.properties
    if r.scheduled_ms is not None:
        out["scheduled_ms"] = r.scheduled_ms
    return out


def plain(obj: Any) -> Any:
    """A model value (structs, also array-like ones, named tuples, enums, dicts) as JSON-ready
    builtins with field names kept: ``msgspec.to_builtins`` turns array-like structs into
    lists, which would leave an API reader guessing what each position means."""
    if isinstance(obj, msgspec.Struct):
        return {f: plain(getattr(obj, f)) for f in obj.__struct_fields__}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {f: plain(getattr(obj, f)) for f in obj._fields}
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [plain(v) for v in obj]
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode()
    return msgspec.to_builtins(obj)
