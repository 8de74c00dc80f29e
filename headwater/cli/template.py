"""``--format``: records printed through a template, as kcat's ``-f`` prints them.

A template is text with tokens; each record is written as the template with every token
replaced, as bytes (binary-safe: a value is written as stored, not decoded). No newline is
added: end the template with ``\\n`` to get one record a line. The tokens:

=========  ==========================================================================
``%v``     the value (message body), as stored; kcat's ``%s`` is the same
``%S``     the value's length in bytes
``%k``     the key, as stored (empty when none)
``%K``     the key's length in bytes (-1 when none, as kcat)
``%t``     the queue (kcat's topic)
``%p``     the partition
``%o``     the offset
``%i``     the message id (``00000001-00000002-0000000000000064``)
``%T``     the append time, milliseconds since the epoch
``%I``     the append time, ISO-8601 UTC
``%g``     the tag (empty when none)
``%h``     the properties (kcat's headers) as ``k=v,k=v`` (empty when none)
``%%``     a ``%``
``\\n``      newline; ``\\t`` tab, ``\\r`` carriage return, ``\\0`` a NUL byte, ``\\\\`` a backslash
=========  ==========================================================================

>>> from headwater.model.message import Record
>>> render = compile_template(r"%p:%o %k=%v\\n")
>>> render(Record("q", 2, 7, 0, b"hi", key=b"k1"))
b'2:7 k1=hi\\n'
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from headwater.errors import InvalidArgumentError
from headwater.model.message import Record

__all__ = ["compile_template", "RAW_TEMPLATE", "TOKENS"]

RAW_TEMPLATE = "%v\\n"  # --raw: the values alone, one a line


def _iso(ms: int) -> bytes:
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z").encode()


def _props(r: Record) -> bytes:
    return ",".join(f"{k}={v}" for k, v in (r.properties or {}).items()).encode()


#: What each ``%`` token writes for a record.
TOKENS: dict[str, Callable[[Record], bytes]] = {
    "v": lambda r: r.body,
    "s": lambda r: r.body,
    "S": lambda r: str(len(r.body)).encode(),
    "k": lambda r: r.key or b"",
    "K": lambda r: str(-1 if r.key is None else len(r.key)).encode(),
    "t": lambda r: r.queue.encode(),
    "p": lambda r: str(r.partition).encode(),
    "o": lambda r: str(r.offset).encode(),
    "i": lambda r: str(r.message_id).encode(),
    "T": lambda r: str(r.timestamp_ms).encode(),
    "I": lambda r: _iso(r.timestamp_ms),
    "g": lambda r: (r.tag or "").encode(),
    "h": _props,
}
_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "0": b"\0", "\\": b"\\"}


def compile_template(template: str, what: str = "--format") -> Callable[[Record], bytes]:
    """A function that renders one record through ``template`` (see the module's tokens).

    An unknown token or escape is an error that lists the known ones, so a typo is not
    printed a million times as literal text.
    """
    parts: list[bytes | Callable[[Record], bytes]] = []
    literal = bytearray()
    i = 0
    while i < len(template):
        c = template[i]
        if c in "%\\" and i + 1 == len(template):
            raise InvalidArgumentError(f"{what}: {template!r} ends with a lone {c!r}; write {c * 2} for the character")
        if c == "%":
            token = template[i + 1]
            if token == "%":
                literal += b"%"
            elif token in TOKENS:
                if literal:
                    parts.append(bytes(literal))
                    literal.clear()
                parts.append(TOKENS[token])
            else:
                known = " ".join(f"%{t}" for t in TOKENS)
                raise InvalidArgumentError(
                    f"{what}: unknown token %{token} in {template!r}; use {known} or %% (docs/cli.md, 'Formats')"
                )
            i += 2
        elif c == "\\":
            escape = template[i + 1]
            if escape not in _ESCAPES:
                raise InvalidArgumentError(
                    f"{what}: unknown escape \\{escape} in {template!r}; use \\n \\t \\r \\0 or \\\\"
                )
            literal += _ESCAPES[escape]
            i += 2
        else:
            literal += c.encode("utf-8", "surrogateescape")
            i += 1
    if literal:
        parts.append(bytes(literal))

    def render(record: Record) -> bytes:
        return b"".join(p if isinstance(p, bytes) else p(record) for p in parts)

    return render
