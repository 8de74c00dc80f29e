"""Opening the delay service: the buckets on disk, and deliveries the log shows that the
bucket files do not (the broker stopped between appending a stamped batch and recording
it). docs/design/delay.md has the argument; :mod:`.service` the rest of the service."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from headwater.broker.delay.buckets import OPEN, Bucket, Entry, replay
from headwater.broker.delay.lifecycle import State
from headwater.errors import CorruptDataError, StorageError
from headwater.model.batch import BatchHeader
from headwater.model.delay import DELAYED_PARTITION_BIT, delay_offset
from headwater.model.producer_state import ProducerStateTable
from headwater.storage.schedule import DELIVERED, DispatchCheckpoint, ScheduleFile, encode_record

__all__ = ["DelayRecovery"]

log = logging.getLogger("headwater.delay")


class _Idem(NamedTuple):  # the fields ProducerStateTable.record reads from a header
    producer_id: int
    base_sequence: int
    producer_epoch: int
    count: int


class DelayRecovery:
    """The part of :class:`~headwater.broker.delay.service.DelayService` that runs when it
    opens (its state is the service's)."""

    def _recover(self) -> None:
        """Read the checkpoint and every bucket file; record deliveries the log shows that
        the files do not (a crash between the two)."""
        store = self._store
        if not self._schedule.exists():  # never used: nothing was ever stamped
            return
        now = self.now_ms()
        try:
            ckpt = self._schedule.read_checkpoint()
        except CorruptDataError as e:
            self.report.append(f"{e}; reading the whole log for deliveries")
            log.warning("%s; reading the whole log for deliveries", e)
            ckpt = None
        if ckpt is None:
            ckpt = DispatchCheckpoint(0, now, 0, b"")
        else:
            self._last_ckpt = ckpt  # until a newer one is written, this one stands
        if ckpt.producers:
            self._producers = ProducerStateTable.from_bytes(
                ckpt.producers, store.config.producer_expiry_ms, "the delay producer table"
            )
        self._floor_ms = ckpt.floor_ms
        self._accept_seq = ckpt.accept_seq
        stamps = {h.broker_reserved: h for h in store.stamped_batches(min(ckpt.log_position, store.end_position))}
        later: list[tuple[int, int, Entry]] = []  # acceptances after the checkpoint's table
        for f in self._schedule.open_buckets(store.store_id, self.report, read_only=self.read_only):
            entries: dict[int, Entry] = {}
            replay(f.scan(cut=not self.read_only, problems=self.report), entries, [])
            for e in entries.values():
                self._note_adopted_locked(e, f.bucket_start_ms)
                if e.is_open:
                    self._partitions.add((e.queue_id, e.partition))
                if e.accept_seq > ckpt.accept_seq:
                    later.append((e.accept_seq, f.bucket_start_ms, e))
                self._accept_seq = max(self._accept_seq, e.accept_seq)
            self._redo_deliveries(f, entries.values(), stamps)
            b = Bucket(f)
            b.set_summary(entries.values())
            f.close()
            self._buckets[b.start_ms] = b
            self._order.append(b.start_ms)
        later.sort(key=lambda t: t[0])
        for _, start, e in later:  # the idempotence table, up to the last acceptance
            if e.producer is not None and e.producer[0] >= 0:
                pid, seq, epoch = e.producer
                self._producers.record(
                    _Idem(pid, seq, epoch, e.count),
                    e.queue_id,
                    e.partition | DELAYED_PARTITION_BIT,
                    e.origin if e.origin is not None else delay_offset(start, e.number),
                    e.accepted_ms,
                )
        try:
            self._write_checkpoint(store.end_position)
        except StorageError as e:  # a full disk: the previous checkpoint stands (it is older, not wrong)
            self._cannot_write(f"the dispatch checkpoint could not be moved ({e})")

    def _redo_deliveries(self, f: ScheduleFile, entries: Iterable[Entry], stamps: dict[int, BatchHeader]) -> None:
        """Mark delivered the runs of ``f`` whose stamped batches the log holds (the broker
        stopped between appending them and recording it), in memory and, where the disk
        has room, in the file."""
        redone: list[bytes | bytearray | memoryview] = []
        count = 0
        for e in entries:
            for g in e.runs:
                h = stamps.get(delay_offset(f.bucket_start_ms, e.number + g.first))
                if h is not None and g.state in OPEN:
                    redone += encode_record(
                        DELIVERED, e.queue_id, e.partition, g.first, e.number, h.timestamp_ms, h.base_offset
                    )
                    e.close_run(g, State.DELIVERED)
                    g.delivered_offset = h.base_offset
                    count += 1
        if not count or self.read_only:  # read-only: known in memory, the file stays as it is
            return
        try:
            f.append(redone)
            f.sync()
        except StorageError as e:  # known in memory; the next start finds them in the log again
            self._cannot_write(f"deliveries found in the log could not be recorded in {f.path.name} ({e})")
            return
        self.report.append(f"{f.path.name}: recorded {count} deliveries found in the log")

    def _cannot_write(self, what: str) -> None:
        """Opening goes on without a write the schedule could not take (a full disk): reads
        and deliveries work, and a delayed send fails with the disk's error until there is
        room again."""
        message = f"delay: {what}; starting anyway"
        self.report.append(message)
        log.warning("%s", message)
