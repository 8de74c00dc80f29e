"""The rows Headwater reads into Spark and the columns it writes from.

Reading, every row is one message::

    key         binary                  null when the message has no key
    value       binary                  the body
    queue       string
    partition   int
    offset      bigint
    timestamp   timestamp               the broker's append time (UTC, millisecond precision)
    tag         string                  null when untagged
    properties  map<string, string>     null when the message has none
    message_id  string                  '0000002a-00000003-000000000001e240'

Writing, a dataframe has ``value`` (binary, required) and optionally ``key`` (binary or
string), ``tag`` (string), ``partition`` (an integer type), ``properties``
(map<string, string>), ``queue`` (string) and ``deliver_at`` (timestamp). The read-only
columns ``offset``, ``timestamp`` and ``message_id`` are ignored, so the rows of one queue
can be written to another as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from headwater.errors import InvalidArgumentError

__all__ = ["READ_SCHEMA", "READ_SCHEMA_DDL", "arrow_schema", "check_write_schema", "WriteColumns"]

READ_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("queue", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("tag", StringType(), True),
        StructField("properties", MapType(StringType(), StringType(), True), True),
        StructField("message_id", StringType(), True),
    ]
)
READ_SCHEMA_DDL = READ_SCHEMA.simpleString()

_READ_ONLY = ("offset", "timestamp", "message_id")
_WRITE_COLUMNS = ("value", "key", "tag", "partition", "properties", "queue", "deliver_at")
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


def arrow_schema(schema: StructType):
    """The Arrow schema Spark expects for ``schema``: batches must match it exactly
    (int32 for INT, microsecond UTC timestamps, the map's non-null key field)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class WriteColumns:
    """The columns of a dataframe to write: ``names`` maps each column Headwater writes
    (lower case) to its name in the dataframe. Picklable: it travels to the workers."""

    def __init__(self, names: dict[str, str], key_is_string: bool) -> None:
        self.names = names
        self.key_is_string = key_is_string

    def __contains__(self, name: str) -> bool:
        return name in self.names


def _type_name(t: DataType) -> str:
    return t.simpleString()


def _is_string_map(t: DataType) -> bool:
    return isinstance(t, MapType) and isinstance(t.keyType, StringType) and isinstance(t.valueType, StringType)


# each column a dataframe may write: the types accepted, the type named in the error, the fix
_COLUMN_TYPES: dict[str, tuple[Callable[[DataType], bool], str, str]] = {
    "value": (
        lambda t: isinstance(t, BinaryType),
        "binary",
        "cast it, e.g. col('value').cast('binary') (a string becomes its UTF-8 bytes), "
        "or serialize structured data first, e.g. to_json(...).cast('binary')",
    ),
    "key": (
        lambda t: isinstance(t, (BinaryType, StringType)),
        "binary (or string, sent as UTF-8)",
        "cast it, e.g. col('key').cast('binary')",
    ),
    "tag": (lambda t: isinstance(t, StringType), "string", "cast it, e.g. col('tag').cast('string')"),
    "queue": (lambda t: isinstance(t, StringType), "string", "cast it, e.g. col('queue').cast('string')"),
    "partition": (lambda t: isinstance(t, _INTEGERS), "an integer", "cast it, e.g. col('partition').cast('int')"),
    "properties": (
        _is_string_map,
        "map<string,string>",
        "build it with create_map(lit('k'), col('v').cast('string'), ...)",
    ),
    "deliver_at": (
        lambda t: isinstance(t, (TimestampType, TimestampNTZType)),
        "a timestamp",
        "cast it, e.g. col('deliver_at').cast('timestamp')",
    ),
}


def check_write_schema(schema: StructType, *, queue_option: str | None) -> WriteColumns:
    """Check the columns of a dataframe to write; raise naming the column and the fix."""
    by_name = {f.name.lower(): f for f in schema.fields}
    if "value" not in by_name:
        raise InvalidArgumentError(
            f"the dataframe has no 'value' column (columns: {', '.join(schema.fieldNames()) or 'none'}); "
            f"a message needs a body: select one as value, e.g. df.select(col('payload').alias('value'))"
        )
    unknown = [
        f.name for f in schema.fields if f.name.lower() not in _WRITE_COLUMNS and f.name.lower() not in _READ_ONLY
    ]
    if unknown:
        raise InvalidArgumentError(
            f"the dataframe has column{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"that Headwater does not write; columns it writes: {', '.join(_WRITE_COLUMNS)} "
            f"(value required); drop the others or fold them into value or properties"
        )

    for name, (ok, want, fix) in _COLUMN_TYPES.items():
        if name in by_name and not ok(by_name[name].dataType):
            raise InvalidArgumentError(
                f"column {name!r} is {_type_name(by_name[name].dataType)}, but Headwater writes it as {want}; {fix}"
            )
    key_is_string = "key" in by_name and isinstance(by_name["key"].dataType, StringType)
    if queue_option is None and "queue" not in by_name:
        raise InvalidArgumentError(
            "no queue to write to: set .option('queue', 'events'), or add a string column "
            "'queue' naming each row's queue"
        )
    names = {n: f.name for n, f in by_name.items() if n in _WRITE_COLUMNS}
    if queue_option is not None:
        names.pop("queue", None)  # the option wins over a column, as Kafka's topic option does
    return WriteColumns(names, key_is_string)
