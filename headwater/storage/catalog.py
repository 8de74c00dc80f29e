"""Catalog: the store's identity and its queues, in one JSON file (``headwater.json``).

The file doubles as the marker that a directory is a Headwater store. It is small and
changes only on admin operations and retention, so it is rewritten whole: temp file, fsync,
rename, fsync the folder. A crash leaves either the old or the new version, never a mix.

Its last field, ``checksum``, is the CRC32C (hex) of the file as written with that field
empty: a byte changed by a disk or an edit by hand (a queue id swapped for another's, which
would silently serve that queue's partitions as empty) is refused when the store opens,
naming the file. A catalog written before the field existed has it empty and is accepted;
the next save adds it.

Thread-safety: mutated only under the store's lock.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
from crc32c import crc32c

from headwater.errors import CorruptDataError, NotADataDirectoryError, UnsupportedFormatError
from headwater.model.config import QueueConfig
from headwater.storage.segment import write_atomically

__all__ = ["Catalog", "QueueEntry", "CATALOG_FILE", "FORMAT_NAME", "FORMAT_VERSION"]

CATALOG_FILE = "headwater.json"
FORMAT_NAME = "headwater-store"
FORMAT_VERSION = 1


class QueueEntry(msgspec.Struct, kw_only=True):
    name: str
    queue_id: int
    config: QueueConfig
    enabled: bool = True
    created_ms: int
    # first retained offset of each partition (moved by truncate and by retention)
    start_offsets: list[int]


class Catalog(msgspec.Struct, kw_only=True):
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    store_id: str
    created_ms: int
    next_queue_id: int = 1
    queues: dict[str, QueueEntry] = {}
    checksum: str = ""  # see the module's docstring; last, so the rest reads as before

    @property
    def store_id_bytes(self) -> bytes:
        return uuid.UUID(self.store_id).bytes

    @classmethod
    def new(cls, created_ms: int) -> Catalog:
        return cls(store_id=str(uuid.uuid4()), created_ms=created_ms)

    @classmethod
    def load(cls, path: Path) -> Catalog:
        raw = path.read_bytes()
        try:
            probe = msgspec.json.decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError) as e:  # (invalid UTF-8 raises the latter)
            raise NotADataDirectoryError(
                f"{path} is not a Headwater catalog (not JSON: {e}); is this directory someone else's?"
            ) from e
        if not isinstance(probe, dict) or probe.get("format") != FORMAT_NAME:
            raise NotADataDirectoryError(f"{path} is not a Headwater catalog; choose an empty or new data directory")
        if probe.get("version") != FORMAT_VERSION:
            raise UnsupportedFormatError(
                f"{path.parent} was written in store format {probe.get('version')}; this "
                f"Headwater reads format {FORMAT_VERSION}"
            )
        try:
            cat = msgspec.json.decode(raw, type=cls)
        except msgspec.ValidationError as e:
            raise UnsupportedFormatError(f"{path} does not match the catalog format: {e}") from e
        if cat.checksum and cat.checksum != cat._sum():
            raise CorruptDataError(
                f"{path} is damaged: its checksum does not match its content (a disk error, or an "
                f"edit by hand); restore the file from a backup"
            )
        cat._check(path)
        return cat

    def _check(self, path: Path) -> None:
        """Refuse a catalog whose fields disagree with each other (a damaged or hand-edited
        file) with an error naming it, rather than fail later with a bare ValueError or
        serve partitions that are not there."""
        try:
            uuid.UUID(self.store_id)
        except ValueError:
            raise CorruptDataError(f"{path} is damaged: store_id {self.store_id!r} is not a UUID") from None
        owners: dict[int, str] = {}
        for name, e in self.queues.items():
            other = owners.setdefault(e.queue_id, name)
            if other != name:
                raise CorruptDataError(
                    f"{path} is damaged: queues {other!r} and {name!r} both have id {e.queue_id}; "
                    f"restore the file from a backup"
                )
            if e.name != name or len(e.start_offsets) != e.config.partitions or min(e.start_offsets, default=0) < 0:
                raise CorruptDataError(
                    f"{path} is damaged: queue {name!r} disagrees with itself (name, partitions "
                    f"or start offsets); restore the file from a backup"
                )
            if e.queue_id >= self.next_queue_id:
                raise CorruptDataError(
                    f"{path} is damaged: queue {name!r} has id {e.queue_id}, not below "
                    f"next_queue_id {self.next_queue_id}; restore the file from a backup"
                )

    def _encoded(self, checksum: str) -> bytes:
        return msgspec.json.format(msgspec.json.encode(msgspec.structs.replace(self, checksum=checksum)), indent=2)

    def _sum(self) -> str:
        return f"{crc32c(self._encoded('')):08x}"

    def to_bytes(self) -> bytes:
        """The file's bytes, with the checksum of what they say."""
        return self._encoded(self._sum())

    def save(self, path: Path) -> None:
        write_atomically(path, self.to_bytes())
