"""Options of ``format("headwater")``: names, defaults, parsing and validation.

The names follow Spark's Kafka connector wherever the idea is the same (``startingOffsets``,
``endingOffsets``, ``startingTimestamp``, ``minPartitions``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``), so a Spark user feels at home. Spark hands options over with their
names lower-cased; this module maps them back to the documented spelling, and refuses an
unknown name with the list of valid ones (a misspelt ``startingOffset`` must not silently
read from the default position).

Pure Python: no pyspark, no pyarrow, no network. The driver parses options once and ships
the parsed values to the workers inside each input partition.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from headwater.errors import InvalidArgumentError
from headwater.model.config import PARTITIONS_MAX, validate_queue_name
from headwater.model.message import datetime_ms

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "ReadOptions",
    "WriteOptions",
    "READ_OPTIONS",
    "WRITE_OPTIONS",
    "parse_read_options",
    "parse_write_options",
]

EARLIEST = -2  # Kafka's markers inside a JSON offsets map
LATEST = -1

FETCH_BYTES_DEFAULT = 4 * 1024 * 1024
BATCH_BYTES_MAX_DEFAULT = 4 * 1024 * 1024
BATCH_BYTES_LIMIT = 48 * 1024 * 1024  # under the 64 MiB batch and frame limits, with headroom
CONNECT_TIMEOUT_MS_DEFAULT = 10_000
REQUEST_TIMEOUT_MS_DEFAULT = 60_000

# Spark adds these itself; they are accepted and not ours to judge.
_SPARK_OWNED = {"checkpointlocation", "queryname"}

# Spark's Kafka connector's names where Headwater's differ: a job moved from format("kafka")
# is told what each one is called here (see docs/spark.md, Differences).
_KAFKA_NAMES = {
    "kafka.bootstrap.servers": "here: 'servers'",
    "subscribe": "here: 'queue'",
    "topic": "here: 'queue'",
    "assign": "here: 'queue' and 'partitions'",
    "subscribepattern": "here: one 'queue' a read",
    "startingoffsetsbytimestamp": "here: 'startingTimestamp'",
    "endingoffsetsbytimestamp": "here: 'endingTimestamp'",
    "includeheaders": "here: the 'properties' column is always there",
}

_COMMON = ("servers", "queue", "connectTimeoutMs", "requestTimeoutMs")
READ_OPTIONS = _COMMON + (
    "partitions",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "tags",
    "minPartitions",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "fetchBytes",
)
WRITE_OPTIONS = _COMMON + ("partitioner", "maxBatchBytes", "compression")
PARTITIONERS = ("default", "key", "round_robin", "random")


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends: ``"earliest"``, ``"latest"``, or an offset per partition
    (a partition missing from ``offsets`` takes ``default``, itself earliest or latest)."""

    kind: str  # "earliest" | "latest" | "offsets"
    offsets: Mapping[int, int] = field(default_factory=dict)  # values may be EARLIEST/LATEST
    default: str = "earliest"

    def for_partition(self, partition: int) -> int:
        """An offset, or EARLIEST / LATEST for the caller to resolve against the queue."""
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        return self.offsets.get(partition, EARLIEST if self.default == "earliest" else LATEST)


@dataclass(frozen=True)
class ReadOptions:
    servers: str
    queue: str
    partitions: tuple[int, ...] | None = None
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    tags: tuple[str, ...] | None = None
    min_partitions: int | None = None
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    fetch_bytes: int = FETCH_BYTES_DEFAULT
    connect_timeout_s: float = CONNECT_TIMEOUT_MS_DEFAULT / 1000
    request_timeout_s: float = REQUEST_TIMEOUT_MS_DEFAULT / 1000


@dataclass(frozen=True)
class WriteOptions:
    servers: str
    queue: str | None = None  # None: every row names its queue in a ``queue`` column
    partitioner: str = "default"
    batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT
    compression: str | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_MS_DEFAULT / 1000
    request_timeout_s: float = REQUEST_TIMEOUT_MS_DEFAULT / 1000


# -- the names ------------------------------------------------------------------------


def _canonical(options: Mapping[str, str], valid: tuple[str, ...], what: str) -> dict[str, str]:
    """Options under their documented names; unknown names are an error naming them all."""
    by_lower = {name.lower(): name for name in valid}
    out: dict[str, str] = {}
    unknown: list[str] = []
    path: str | None = None
    for raw, value in options.items():
        low = raw.lower()
        if low in _SPARK_OWNED:
            continue
        if low == "path":  # load("events") / save("events") name the queue
            path = value
            continue
        name = by_lower.get(low)
        if name is None:
            unknown.append(raw)
        else:
            out[name] = value
    if unknown:
        hints = []
        for u in unknown:
            kafka = _KAFKA_NAMES.get(u.lower())
            if kafka is None and u.lower().startswith("kafka."):
                kafka = "Headwater takes no kafka.* options"
            close = difflib.get_close_matches(u.lower(), list(by_lower), n=1, cutoff=0.6)
            if kafka is not None:
                hints.append(f"{u!r} (Kafka's; {kafka})")
            else:
                hints.append(f"{u!r}" + (f" (did you mean {by_lower[close[0]]!r}?)" if close else ""))
        raise InvalidArgumentError(
            f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(hints)} for {what} "
            f"format('headwater'); valid options: {', '.join(valid)} (names are case-insensitive)"
        )
    if path is not None:
        if out.setdefault("queue", path) != path:
            raise InvalidArgumentError(
                f"the queue is named twice: load/save({path!r}) and option queue {out['queue']!r}; give one of them"
            )
    return out


def _required(opts: Mapping[str, str], name: str, example: str) -> str:
    value = opts.get(name)
    if value is None or not str(value).strip():
        raise InvalidArgumentError(f"option {name!r} is required, e.g. .option({name!r}, {example!r})")
    return str(value).strip()


def _servers(opts: Mapping[str, str]) -> str:
    value = _required(opts, "servers", "127.0.0.1:7070")
    for address in value.split(","):
        host, sep, port = address.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgumentError(f"option 'servers' is 'host:port' (several separated by commas), got {value!r}")
    return value


def _int(opts: Mapping[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidArgumentError(f"option {name!r} is a whole number, got {raw!r}") from None
    if value < minimum:
        raise InvalidArgumentError(f"option {name!r} must be at least {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise InvalidArgumentError(f"option {name!r} is 'true' or 'false', got {raw!r}")


def _timeout_s(opts: Mapping[str, str], name: str, default_ms: int) -> float:
    return _int(opts, name, default_ms, minimum=1) / 1000  # type: ignore[operator]  # _int returns an int when it has a default


# -- read options ---------------------------------------------------------------------


def parse_partitions(raw: str) -> tuple[int, ...]:
    """``"0,2,5"`` or ranges ``"0-3,7"`` -> sorted partition numbers."""
    out: set[int] = set()
    for part in str(raw).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise InvalidArgumentError(
                f"option 'partitions' lists partition numbers and ranges like '0,2,4-7', got {raw!r}"
            ) from None
        if a < 0 or b < a:
            raise InvalidArgumentError(f"option 'partitions': bad range {part!r} in {raw!r}")
        if b >= PARTITIONS_MAX:  # and a range of billions would fill the memory first
            raise InvalidArgumentError(
                f"option 'partitions': {part!r} in {raw!r} goes past the last partition a queue "
                f"can have ({PARTITIONS_MAX - 1})"
            )
        out.update(range(a, b + 1))
    if not out:
        raise InvalidArgumentError("option 'partitions' names no partition")
    return tuple(sorted(out))


def parse_offsets(
    raw: str,
    name: str,
    queue: str,
    *,
    allow_earliest: bool = True,
    allow_latest: bool = True,
    default: str = "earliest",
) -> OffsetSpec:
    """``"earliest"``, ``"latest"``, or JSON: ``{"0": 42, "1": -2}`` (-2 earliest, -1 latest),
    Kafka's ``{"<queue>": {"0": 42}}``, or an offset as a streaming checkpoint stores it.

    >>> spec = parse_offsets('{"0": 42, "1": -2}', "startingOffsets", "events")
    >>> spec.for_partition(0), spec.for_partition(1), spec.for_partition(7) == EARLIEST
    (42, -2, True)
    """
    text = str(raw).strip()
    low = text.lower()
    if low in ("earliest", "latest"):
        if (low == "earliest" and not allow_earliest) or (low == "latest" and not allow_latest):
            raise InvalidArgumentError(f"option {name!r} cannot be {low!r}")
        return OffsetSpec(low)
    try:
        doc = json.loads(text)
    except ValueError:
        raise InvalidArgumentError(
            f"option {name!r} is 'earliest', 'latest' or JSON like '{{\"0\": 42, \"1\": -2}}' "
            f"(an offset per partition; -2 earliest, -1 latest), got {raw!r}"
        ) from None
    if isinstance(doc, dict) and set(doc) >= {"queue", "offsets"}:  # a checkpoint's offset
        if doc["queue"] != queue:
            raise InvalidArgumentError(f"option {name!r} is for queue {doc['queue']!r}, not {queue!r}")
        doc = doc["offsets"]
    elif isinstance(doc, dict) and len(doc) == 1 and isinstance(next(iter(doc.values())), dict):
        ((q, doc),) = doc.items()  # Kafka's {"topic": {"0": 42}}
        if q != queue:
            raise InvalidArgumentError(f"option {name!r} is for queue {q!r}, not {queue!r}")
    if not isinstance(doc, dict) or not doc:
        raise InvalidArgumentError(f"option {name!r} must map partitions to offsets, got {raw!r}")
    offsets: dict[int, int] = {}
    for k, v in doc.items():
        try:
            p = int(k)
        except ValueError:
            raise InvalidArgumentError(f"option {name!r}: {k!r} is not a partition number") from None
        if p < 0:
            raise InvalidArgumentError(f"option {name!r}: {k!r} is not a partition number (they count from 0)")
        if isinstance(v, bool) or not isinstance(v, int) or v < EARLIEST:
            raise InvalidArgumentError(
                f"option {name!r}: the offset of partition {k} must be an int >= 0, or -2 "
                f"(earliest) or -1 (latest); got {v!r}"
            )
        if (v == EARLIEST and not allow_earliest) or (v == LATEST and not allow_latest):
            raise InvalidArgumentError(
                f"option {name!r}: partition {k} cannot be {'earliest (-2)' if v == EARLIEST else 'latest (-1)'}"
            )
        offsets[p] = v
    return OffsetSpec("offsets", offsets, default)


def parse_timestamp_ms(raw: str, name: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (naive means UTC)."""
    text = str(raw).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgumentError(
            f"option {name!r} is milliseconds since the epoch or an ISO 8601 time like "
            f"'2024-05-01T12:00:00Z', got {raw!r}"
        ) from None
    return datetime_ms(when)  # naive means UTC; a fraction of a ms rounds up


def check_read_options(options: Mapping[str, str]) -> None:
    """Names and values, all but which ones belong to batch or streaming: what the data
    source checks when ``load()`` is called, before it knows which it is. (A streaming
    query parses its options again only once it runs, in the background, where an error
    reaches the user late and wrapped in Spark's own.)"""
    parse_read_options(options, streaming=None)


def parse_read_options(options: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Parse and check the options of ``spark.read`` (``streaming=False``) or
    ``spark.readStream`` (``streaming=True``); ``None``: either, not known yet."""
    what = {True: "spark.readStream with", False: "spark.read with", None: "reading with"}[streaming]
    o = _canonical(options, READ_OPTIONS, what)
    queue = _required(o, "queue", "events")
    validate_queue_name(queue)
    if streaming:
        for batch_only in ("endingOffsets", "endingTimestamp"):
            if batch_only in o:
                raise InvalidArgumentError(
                    f"option {batch_only!r} is for batch reads (spark.read); a streaming query "
                    f"runs on; stop it, or use Trigger.AvailableNow to stop at the data present now"
                )
    elif streaming is False and "maxOffsetsPerTrigger" in o:
        raise InvalidArgumentError(
            "option 'maxOffsetsPerTrigger' is for streaming reads (spark.readStream); a batch "
            "read takes its range from startingOffsets/endingOffsets"
        )
    default_start = "latest" if streaming else "earliest"
    starting = (
        parse_offsets(o["startingOffsets"], "startingOffsets", queue, default=default_start)
        if "startingOffsets" in o
        else OffsetSpec(default_start)
    )
    ending = (
        parse_offsets(o["endingOffsets"], "endingOffsets", queue, allow_earliest=False, default="latest")
        if "endingOffsets" in o
        else OffsetSpec("latest")
    )
    start_ms = parse_timestamp_ms(o["startingTimestamp"], "startingTimestamp") if "startingTimestamp" in o else None
    end_ms = parse_timestamp_ms(o["endingTimestamp"], "endingTimestamp") if "endingTimestamp" in o else None
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise InvalidArgumentError(f"endingTimestamp {end_ms} is before startingTimestamp {start_ms}")
    tags = None
    if "tags" in o:
        tags = tuple(sorted({t.strip() for t in o["tags"].split(",") if t.strip()}))
        if not tags:
            raise InvalidArgumentError("option 'tags' lists tags separated by commas, e.g. 'paid,refund'")
        if "*" in tags:
            tags = None
    return ReadOptions(
        servers=_servers(o),
        queue=queue,
        partitions=parse_partitions(o["partitions"]) if "partitions" in o else None,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=start_ms,
        ending_timestamp_ms=end_ms,
        tags=tags,
        min_partitions=_int(o, "minPartitions", None, minimum=1),
        max_offsets_per_trigger=_int(o, "maxOffsetsPerTrigger", None, minimum=1),
        fail_on_data_loss=_bool(o, "failOnDataLoss", True),
        fetch_bytes=_int(o, "fetchBytes", FETCH_BYTES_DEFAULT, minimum=1024),  # type: ignore[arg-type]  # _int returns an int when it has a default
        connect_timeout_s=_timeout_s(o, "connectTimeoutMs", CONNECT_TIMEOUT_MS_DEFAULT),
        request_timeout_s=_timeout_s(o, "requestTimeoutMs", REQUEST_TIMEOUT_MS_DEFAULT),
    )


# -- write options --------------------------------------------------------------------


def parse_write_options(options: Mapping[str, str], *, streaming: bool) -> WriteOptions:
    """Parse and check the options of ``df.write`` or ``df.writeStream``."""
    what = "df.writeStream with" if streaming else "df.write with"
    o = _canonical(options, WRITE_OPTIONS, what)
    queue = o.get("queue")
    if queue is not None:
        queue = queue.strip()
        validate_queue_name(queue)
    partitioner = o.get("partitioner", "default").strip().lower()
    if partitioner not in PARTITIONERS:
        raise InvalidArgumentError(
            f"option 'partitioner' is one of {', '.join(PARTITIONERS)}, got {o['partitioner']!r}"
        )
    compression = o.get("compression", "none").strip().lower()
    if compression not in ("none", "zstd", "lz4"):
        raise InvalidArgumentError(f"option 'compression' is none, zstd or lz4, got {o['compression']!r}")
    batch_bytes = _int(o, "maxBatchBytes", BATCH_BYTES_MAX_DEFAULT, minimum=1024)
    if batch_bytes > BATCH_BYTES_LIMIT:  # type: ignore[operator]  # _int returns an int when it has a default
        raise InvalidArgumentError(f"option 'maxBatchBytes' can be at most {BATCH_BYTES_LIMIT}, got {batch_bytes}")
    return WriteOptions(
        servers=_servers(o),
        queue=queue,
        partitioner=partitioner,
        batch_bytes_max=batch_bytes,  # type: ignore[arg-type]  # _int returns an int when it has a default
        compression=None if compression == "none" else compression,
        connect_timeout_s=_timeout_s(o, "connectTimeoutMs", CONNECT_TIMEOUT_MS_DEFAULT),
        request_timeout_s=_timeout_s(o, "requestTimeoutMs", REQUEST_TIMEOUT_MS_DEFAULT),
    )
