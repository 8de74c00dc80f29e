"""The dispatcher: one thread that delivers delayed batches when they come due.

Each turn it loads the buckets entering the lookahead, takes the runs due by the wall clock
(the store's injected clock) and appends each to its partition with its delay stamp, goes
on appending what comes due meanwhile (a round lasts at most ``ROUND_S``), then waits for
one fsync covering the whole round and records it in the bucket files.
Between turns it sleeps until the next due time, the next bucket to load or the next
checkpoint, at most ``poll_ms``: an arrival due sooner wakes it, and a clock that jumps is
noticed within ``poll_ms``. A jump forward delivers what became due at once; a jump back
holds deliveries until the clock reaches their time again. Nothing is taken twice: a batch
leaves PENDING only here, and only once it is recorded does it leave DISPATCHING. On a
cluster a batch is appended only inside the gate's ``delivering`` (:mod:`.handoff`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from headwater.errors import NotLeaderError, QueueDisabledError, QueueNotFoundError, UsageError
from headwater.model.batch import decode_header, decode_payload
from headwater.model.delay import delay_offset, prepare_delivery
from headwater.storage.api import Store

if TYPE_CHECKING:
    from headwater.broker.delay.service import DelayService

__all__ = ["Dispatcher"]

log = logging.getLogger("headwater.delay")

DECODED_MAX = 4096  # batches of several runs kept decoded between rounds
ROUND_S = 0.05  # a round appends what comes due for at most this long before its fsync


class Dispatcher(threading.Thread):
    def __init__(self, service: DelayService, store: Store) -> None:
        super().__init__(name="headwater-delay", daemon=True)
        self._svc = service
        self._store = store
        self.rounds = 0
        # batches of several deliver times being delivered run by run, decoded once
        self._decoded: OrderedDict[tuple[int, int], tuple[bytes, list]] = OrderedDict()

    def run(self) -> None:
        svc = self._svc
        interval_s = svc.limits.checkpoint_interval_ms / 1000
        next_ckpt = time.monotonic() + interval_s
        while not svc.closed:
            try:
                now = svc.now_ms()
                while (job := svc.begin_load(now)) is not None:
                    svc.finish_load(*job)
                due = svc.take_due(now)
                if due:
                    self._round(due)
                    self.rounds += 1
                if time.monotonic() >= next_ckpt:
                    svc.checkpoint(svc.now_ms())
                    next_ckpt = time.monotonic() + interval_s
                if due:
                    continue  # maybe more is due: look again before sleeping
                self._sleep(now, next_ckpt)
            except Exception:  # noqa: BLE001 - keep delivering; the next turn retries
                log.exception("delay dispatcher turn failed")
                time.sleep(svc.limits.poll_ms / 1000)

    def _sleep(self, now: int, next_ckpt: float) -> None:
        svc = self._svc
        wake = svc.next_wake_ms(now)
        timeout = min(svc.limits.poll_ms / 1000, max(next_ckpt - time.monotonic(), 0.0))
        if wake is not None:
            timeout = min(timeout, (wake - now) / 1000)
        with svc.wakeup:
            if svc.closed or (wake is not None and svc.wake_at_ms is not None and svc.wake_at_ms < wake):
                return  # something due sooner arrived since next_wake_ms
            svc.wakeup.wait(max(timeout, 0.0005))

    def _round(self, due: list) -> None:
        """Append what is due, and what comes due meanwhile (up to ROUND_S), then wait for one
        fsync covering all of it and record it: appends never wait behind an fsync for long."""
        svc = self._svc
        acc: tuple[list, list, list, list] = ([], [], [], [])
        started = time.monotonic()
        while due:
            self._append(due, *acc)
            if time.monotonic() - started > ROUND_S or svc.closed:
                break
            due = svc.take_due(svc.now_ms())
        self._settle(*acc)

    def _append(self, due: list, delivered: list, dropped: list, retry: list, ends: list) -> None:
        svc, store = self._svc, self._store
        for b, e, g in due:
            try:
                batch = self._prepare(b, e, g)
                if batch is None:  # every message cancelled (the cancel made it CANCELLED first)
                    dropped.append((b, e, g))
                    continue
                stamp = delay_offset(b.start_ms, e.number + g.first)  # names the run: its first message
                if svc.gate is None:
                    res, end = store.append_stamped(e.queue_id, e.partition, batch, stamp)
                else:  # on a cluster: a move's fence waits for this append, or refuses it
                    with svc.gate.delivering(e.queue_id, e.partition):
                        res, end = store.append_stamped(e.queue_id, e.partition, batch, stamp)
            except (QueueDisabledError, NotLeaderError):  # NotLeaderError: held until this broker leads it
                retry.append((b, e, g))
            except QueueNotFoundError:
                log.warning(
                    "dropping delayed batch %d of bucket %d: queue id %d no longer exists",
                    e.number,
                    b.start_ms,
                    e.queue_id,
                )
                dropped.append((b, e, g))
            except UsageError as ex:
                log.error("dropping delayed batch %d of bucket %d: %s", e.number, b.start_ms, ex)
                dropped.append((b, e, g))
            except Exception:  # noqa: BLE001 - the disk: try again later
                if not store.fsync_failed:  # (that was logged once, and holds until a restart)
                    log.exception("delivering delayed batch %d of bucket %d failed; will retry", e.number, b.start_ms)
                retry.append((b, e, g))
            else:
                delivered.append((b, e, g, res, svc.now_ms()))  # lateness by the clock, not the
                ends.append(end)  # append time (which never goes back when the clock does)

    def _settle(self, delivered: list, dropped: list, retry: list, ends: list) -> None:
        svc, store = self._svc, self._store
        if ends:
            try:
                store.wait_durable(max(ends))  # one fsync for the round, shared with producers
            except Exception:  # noqa: BLE001 - any failure: left DISPATCHING, as below
                # Appended but maybe not durable: recording DELIVERED now could lose them on a
                # power loss, retrying could deliver twice. Leave them DISPATCHING; on the next
                # open the log says which made it (the checkpoint stays before them).
                log.exception("fsync after delivering %d delayed batches failed", len(delivered))
                svc.limbo = True
                delivered = []
        svc.settle(delivered, dropped, retry, svc.now_ms())

    def _prepare(self, b, e, g) -> bytearray | None:
        """The run's batch as appended (see prepare_delivery); a batch of several runs is read
        and decoded once, then kept while its runs come due (at most DECODED_MAX batches)."""
        if len(e.runs) == 1:
            return prepare_delivery(self._svc.read_batch(b, e), e.cancelled or ())
        key = (b.start_ms, e.number)
        got = self._decoded.get(key)
        if got is None:
            raw = self._svc.read_batch(b, e)
            got = self._decoded[key] = (raw, decode_payload(raw, decode_header(raw)))
            while len(self._decoded) > DECODED_MAX:
                self._decoded.popitem(last=False)
        if g is e.runs[-1]:
            self._decoded.pop(key, None)
        return prepare_delivery(got[0], e.cancelled or (), g.first, g.end, payload=got[1])
