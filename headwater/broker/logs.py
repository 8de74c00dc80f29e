"""Structured logs: :class:`JsonFormatter` writes each log record as one JSON object per line
(``headwater serve --log-format json``), for log shippers that parse lines (Vector, Fluent
Bit, Loki's promtail, the ELK stack).

Every line has ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message`` (the formatted message); ``exc`` holds a traceback when there is one; any field
passed with ``extra=`` comes as a key of its own (a value JSON cannot hold as it is is
written as its ``str``).

>>> import logging
>>> rec = logging.LogRecord("headwater.server", logging.INFO, __file__, 1, "serving %s", ("q",), None)
>>> rec.created, rec.peer = 0.0, "127.0.0.1:5000"
>>> print(JsonFormatter().format(rec).replace(',"message"', ',\\n "message"'))
{"ts":"1970-01-01T00:00:00.000Z","level":"info","logger":"headwater.server",
 "message":"serving q","peer":"127.0.0.1:5000"}
"""

from __future__ import annotations

import logging
import time

import msgspec

__all__ = ["JsonFormatter", "LOG_FORMATS", "configure_logging"]

#: The values of ``headwater serve --log-format``.
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# what every LogRecord has: anything else on a record came from extra=
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
_encoder = msgspec.json.Encoder(enc_hook=str)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message``, ``exc`` when
    there is a traceback, and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, object] = {
            "ts": f"{ts}.{int(record.created * 1000) % 1000:03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in doc:
                doc[key] = value
        return _encoder.encode(doc).decode()


def configure_logging(level: str, log_format: str, stream: object) -> None:
    """Log at ``level`` to ``stream`` in ``log_format`` (``text`` or ``json``), the way
    ``headwater serve`` does; ValueError naming the choices for another format."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}: use one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream)  # type: ignore[arg-type]  # any object with write() and flush()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
