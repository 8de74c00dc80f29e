"""LocalOffsets: a broadcast member's positions, kept in a file of its own.

Broadcast members each read everything, so their positions belong to them, not to the
group (EQueue keeps them on the consumer's disk for the same reason).

Format: one JSON object, ``{"format": 1, "group": NAME, "queues": {QUEUE: {"queue_id": ID,
"offsets": {"PARTITION": OFFSET}}}}``. The queue id is kept so that offsets of a queue that
was deleted and created again under the same name are not applied to the new one.

Crash policy: a save writes a temporary file next to the target, fsyncs it, renames it over
the target and fsyncs the directory, so after a crash the file holds either the previous or
the new positions, never a mix or a torn write. A file that does not parse is an error (the
member refuses to start rather than silently re-reading everything).

Thread-safety: none; the consumer that owns it uses it from one thread.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from headwater.errors import InvalidArgumentError

__all__ = ["LocalOffsets"]

FORMAT = 1


class LocalOffsets:
    def __init__(self, path: str | os.PathLike[str], group: str) -> None:
        self.path = Path(path)
        self.group = group
        self._queues: dict[str, dict] = {}
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            if doc.get("format") != FORMAT or not isinstance(doc.get("queues"), dict):
                raise ValueError(f"format {doc.get('format')!r}")
            self._queues = {
                q: {"queue_id": int(v["queue_id"]), "offsets": {int(p): int(o) for p, o in v["offsets"].items()}}
                for q, v in doc["queues"].items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidArgumentError(
                f"{self.path} is not a Headwater offsets file ({e}); move it away to start over"
            ) from e

    def get(self, queue: str, queue_id: int) -> dict[int, int]:
        """The saved ``{partition: offset}`` of ``queue`` (empty if none, or if they belong to an
        earlier queue of that name)."""
        entry = self._queues.get(queue)
        if entry is None or entry["queue_id"] != queue_id:
            return {}
        return dict(entry["offsets"])

    def save(self, offsets: dict[tuple[str, int], int], queue_ids: dict[str, int]) -> None:
        """Merge ``{(queue, partition): offset}`` in and write the file crash-safely."""
        for (queue, part), off in offsets.items():
            qid = queue_ids[queue]
            entry = self._queues.get(queue)
            if entry is None or entry["queue_id"] != qid:
                entry = self._queues[queue] = {"queue_id": qid, "offsets": {}}
            entry["offsets"][part] = off
        doc = {
            "format": FORMAT,
            "group": self.group,
            "queues": {
                q: {"queue_id": v["queue_id"], "offsets": {str(p): o for p, o in sorted(v["offsets"].items())}}
                for q, v in sorted(self._queues.items())
            },
        }
        data = json.dumps(doc, indent=1).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # unique per save: two saves of one file (two members in one process) never share
        # a temp file, so neither renames the other's away
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
