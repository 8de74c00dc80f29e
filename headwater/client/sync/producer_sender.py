"""The sending half of the thread-based :class:`~headwater.client.sync.producer.Producer`: how
the batches its core puts in flight leave, and how their answers come back. One class in
two files (:class:`ProducerSender` is a mixin of ``Producer`` and works on its state, under
its locks; ``producer.py`` says which lock guards what).

A batch leaves from the thread that put it in flight: the caller of ``send()``, the thread
that read the answer freeing its partition's slot (the client's I/O thread over the
network), or the sender thread ("headwater-producer"), which only sends what lingered or
waited for a backoff, and settles answers that run send callbacks, fail or go again. An
idle sender thread ends after ``SENDER_IDLE_EXIT_S``; the next batch to time starts another.
Unless another thread is sending already: then that one sends it too (``_send_queued``).
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
import weakref
from collections import deque
from typing import Any

from headwater.client.core.outcomes import Step
from headwater.client.core.producer import Batch

__all__ = ["ProducerSender", "SENDER_IDLE_EXIT_S"]

SENDER_IDLE_EXIT_S = 5.0  # an idle sender thread ends; the next send() starts another


def _now_ms() -> float:
    return time.monotonic() * 1000


class ProducerSender:
    """The Producer's sending half (see the module's docstring)."""

    _lock: threading.Lock
    _wire: threading.Lock
    _outbox: deque[Batch]
    _wakeup: threading.Condition
    _sender: threading.Thread | None
    _pool: concurrent.futures.ThreadPoolExecutor | None
    _finish: Any  # Producer._finish(batch, result, error)
    _encode_for_send: Any  # common.producer.ProducerBase._encode_for_send(batch)
    _hurry_locked: Any  # Producer._hurry_locked()

    def _wake_locked(self, start: bool = True) -> None:
        if self._sender is not None:
            self._wakeup.notify()
        elif start and (self._core.sendable or self._completions or self._core.recovering):
            self._sender = threading.Thread(target=self._run_sender, name="headwater-producer", daemon=True)
            self._sender.start()

    def _run_sender(self) -> None:
        while True:
            with self._lock:
                work = self._await_work_locked()
                if work is None:
                    return
                completions, batches = work
                self._outbox.extend(batches)
            if batches:
                self._send_queued()
            for b, f in completions:
                self._on_completed(b, f)

    def _await_work_locked(self) -> tuple[list, list[Batch]] | None:
        """Wait for completions or batches to send; None when the thread should end."""
        idle_since: float | None = None
        while True:
            completions = list(self._completions)
            self._completions.clear()
            now = time.monotonic()
            batches, wake_at_ms = self._core.collect(now * 1000, self._hurry_locked())
            if completions or batches:
                return completions, batches
            if not self._core.busy():
                if self._closed or (idle_since is not None and now - idle_since >= SENDER_IDLE_EXIT_S):
                    self._sender = None
                    return None
                idle_since = idle_since or now
                timeout: float | None = SENDER_IDLE_EXIT_S
            else:
                idle_since = None
                timeout = None if wake_at_ms is None else max(wake_at_ms / 1000 - now, 0.0)
            self._wakeup.wait(timeout)

    def _send_queued(self) -> None:
        """Encode and hand the batches in ``_outbox`` to the connection, in order. Batches are
        put there under ``_lock`` in the order they went into flight, and taken out only
        under ``_wire``, so they are encoded (their sequences) and sent in that order. A
        thread that finds ``_wire`` taken leaves its batches to the holder, which looks
        again after letting go: so ``send()`` never waits while other batches are encoded
        (it used to, when the thread finishing a batch held ``_lock`` waiting for ``_wire``:
        about a quarter of the wall time of 200,000 random-time delayed sends)."""
        while self._outbox:
            if not self._wire.acquire(blocking=False):
                return  # the holder sends them: it looks at the outbox after releasing
            sent = []
            try:
                while self._outbox:
                    b = self._outbox.popleft()
                    sent.append((b, *self._dispatch(b)))
            finally:
                self._wire.release()
            for b, fut, exc in sent:
                if fut is None:
                    self._finish(b, None, exc)
                else:
                    fut.add_done_callback(functools.partial(self._on_response, b))

    def _dispatch(self, b: Batch) -> tuple[concurrent.futures.Future | None, BaseException | None]:
        """Send a batch in flight (first attempt or retry) without waiting: its response's
        future, or the error that stopped it before it left. Runs under ``_wire`` only, so it
        finishes nothing itself (that takes ``_lock``)."""
        ps = b.part
        refused = self._encode_for_send(b)
        if refused is not None:
            return None, refused
        try:
            if self._produce_async is not None:
                return self._produce_async(ps.queue, ps.partition, b.encoded), None
            return self._embedded_pool().submit(self._service.produce, ps.queue, ps.partition, b.encoded), None
        except Exception as e:  # noqa: BLE001 - a closed service, a stopped pool
            fut: concurrent.futures.Future = concurrent.futures.Future()
            fut.set_exception(e)  # judged like a failed request: retried if retriable
            return fut, None

    def _embedded_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.send_threads, thread_name_prefix="headwater-producer-send"
            )
            weakref.finalize(self, self._pool.shutdown, wait=False)
        return self._pool

    def _on_response(self, b: Batch, f: concurrent.futures.Future) -> None:
        """Runs in whichever thread finished the request (the client's I/O thread over the
        network). A batch stored, with no send callbacks and nobody's done-callbacks on its
        futures, is settled right here, which spares a thread hand-off per request; the rest
        (callbacks, errors, retries) goes to the sender thread."""
        if not b.callbacks and f.exception() is None and not (b.outcome is not None and b.outcome.listened()):
            self._finish(b, f.result(), None)
            return
        with self._lock:
            self._completions.append((b, f))
            self._wake_locked()

    def _on_completed(self, b: Batch, f: concurrent.futures.Future) -> None:
        try:
            result = f.result()
        except BaseException as e:  # noqa: BLE001 - the request's error, judged by the core
            with self._lock:
                now_ms = _now_ms()
                verdict = self._judge(b, e, now_ms)
                if verdict.step is Step.RESEND or verdict.step is Step.REENCODE:
                    # its partition recovers: the batches in flight finish, then retries go in order
                    self._core.retry_later(b, verdict.delay_ms, now_ms)
                    self._wake_locked()
                    return
            self._finish(b, None, verdict.error)
            return
        self._finish(b, result, None)
