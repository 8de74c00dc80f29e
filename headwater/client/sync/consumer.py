"""Consumer: reads partitions you assign, from positions it keeps, with long polling, from
one thread (the reads and commits: :mod:`headwater.client.common.consumer`).

What is this kind's own is how it waits: a fetch is the transport's future (over the
network, where the polling thread reads the answers itself, see ``polling.wait_any``) or a
call on a pool of threads (embedded), and ``poll`` waits on those futures. ``commit_async``
hands its commits to one thread per consumer (made by the first), which sends them in order,
a blocking commit at a time; the application's thread runs their callbacks.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from headwater.client.common.closing import ClosesOnExit
from headwater.client.common.consumer import ConsumerBase
from headwater.client.common.positions import TP
from headwater.client.common.twins import BLOCKING
from headwater.client.core.commits import CommitCallback
from headwater.client.core.reads import POLL_MESSAGES_DEFAULT
from headwater.client.transport.fetch_stream import STREAM_WINDOW_BYTES
from headwater.client.transport.polling import wait_any
from headwater.client.transport.send_future import LazyFuture
from headwater.model.message import Record
from headwater.model.service import BrokerService, FetchesAsync, Leads

__all__ = ["Consumer", "POLL_MESSAGES_DEFAULT"]


class Consumer(ConsumerBase, ClosesOnExit, driver=BLOCKING):
    """Poll records from assigned partitions. Use from one thread.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("jobs", partitions=2)
    >>> _ = hw.send_batch("jobs", [b"a", b"b"], partition=1)
    >>> c = hw.consumer(group="workers")
    >>> c.assign("jobs")
    >>> [r.body for r in c.poll(timeout_ms=100)]
    [b'a', b'b']
    >>> c.commit(); c.close(); hw.close()

    The settings are :class:`~headwater.client.common.positions.ConsumerPositions`';
    ``fetch_threads_max`` bounds the threads that fetch when the broker is embedded.
    """

    _inflight: dict[TP, tuple[int, concurrent.futures.Future]]

    def __init__(
        self,
        service: BrokerService,
        *,
        group: str | None = None,
        auto_offset_reset: str = "earliest",
        fetch_bytes: int = 1024 * 1024,
        max_poll_messages: int = POLL_MESSAGES_DEFAULT,
        tags: str | Iterable[str] | None = None,
        fetch_threads_max: int = 16,
        stream: bool = True,
        stream_window_bytes: int = STREAM_WINDOW_BYTES,
    ) -> None:
        super().__init__(
            service,
            group=group,
            auto_offset_reset=auto_offset_reset,
            fetch_bytes=fetch_bytes,
            max_poll_messages=max_poll_messages,
            tags=tags,
            stream=stream,
            stream_window_bytes=stream_window_bytes,
        )
        self._fetch_async = service.fetch_async if isinstance(service, FetchesAsync) else None
        # over the network: read answers on this thread
        self._lead = service.lead if isinstance(service, Leads) else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._fetch_threads_max = fetch_threads_max
        self._commit_guard = threading.Condition()  # guards _commits: this thread and the sender's
        self._commit_sender: threading.Thread | None = None
        self._commit_stop = False

    def poll(self, max_messages: int | None = None, timeout_ms: int = 1000) -> list[Record]:
        # buffered records are handed out without driving the body: no generator a call
        return self._ready(max_messages, timeout_ms) or self._poll_waiting(max_messages, timeout_ms)

    poll.__doc__ = ConsumerBase.poll.__doc__

    def wakeup(self) -> None:
        """End the poll that waits now with :class:`~headwater.errors.WakeupError`, or the
        next poll if none waits (Kafka's ``wakeup()``): the one method another thread may
        call, to stop a consumer loop (``for record in consumer``) from outside. Each call
        raises once; positions and group membership are unchanged, so poll again or
        ``close()`` (which commits, for a group member)."""
        self._wake_blocking()

    _poll_waiting = ConsumerBase.poll  # the body, driven as a blocking method like the others

    def _launch_fetches(self, wait_ms: int) -> None:
        if self._fetch_async is None and len(self._fetch_pos) > self._fetch_threads_max:
            wait_ms = min(wait_ms, 50)  # let a few threads cycle over many partitions
        super()._launch_fetches(wait_ms)

    def _fetch(self, tp: TP, pos: int, wait_ms: int) -> concurrent.futures.Future:
        kwargs: dict[str, Any] = dict(max_bytes=self._fetch_bytes, tag_mask=self._mask, max_wait_ms=wait_ms)
        if self._fetch_async is not None:
            if self._lead is not None:
                kwargs["lead"] = True  # this thread reads the answer (polling.wait_any)
            return self._fetch_async(tp[0], tp[1], pos, **kwargs)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._fetch_threads_max, thread_name_prefix="headwater-consumer"
            )
        return self._pool.submit(self._service.fetch, tp[0], tp[1], pos, **kwargs)

    def _wait_any(self, futures: list[Any], timeout_s: float, *, lead: bool = True) -> None:
        wait_any(futures, max(0.0, timeout_s), lead=self._lead if lead else None, interrupt=self._wakeup)

    def _new_waiter(self) -> LazyFuture:
        return LazyFuture()  # no condition unless another thread leads

    def _cancel_reads(self, reads: list[Any]) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _enqueue_commit(self, chosen: dict[TP, int], callback: CommitCallback | None) -> None:
        assert self._commits is not None
        with self._commit_guard:
            self._commits.add(chosen, callback)
            if self._commit_sender is None:
                self._commit_stop = False
                self._commit_sender = threading.Thread(
                    target=self._send_commits, name=f"headwater-commits-{self.group}", daemon=True
                )
                self._commit_sender.start()
            self._commit_guard.notify_all()

    def _send_commits(self) -> None:
        """The sender's loop: one request at a time, in order (core.commits)."""
        commits, guard = self._commits, self._commit_guard
        assert commits is not None
        while True:
            with guard:
                while (chosen := commits.next_send()) is None:
                    if self._commit_stop:
                        return
                    guard.wait()
            error: BaseException | None = None
            try:
                self._commit_now(chosen)
            except Exception as e:  # noqa: BLE001 - any failure is the callback's to hear
                error = e
            with guard:
                commits.ended(error)
                guard.notify_all()

    def _wait_commits(self, stop: bool = False) -> None:
        commits, guard = self._commits, self._commit_guard
        assert commits is not None
        with guard:
            while not commits.idle:
                guard.wait()
            sender = self._commit_sender
            if stop and sender is not None:
                self._commit_stop = True
                self._commit_sender = None
                guard.notify_all()
        if stop and sender is not None:
            sender.join()
        self._run_commit_callbacks()

    def __iter__(self) -> Iterator[Record]:
        """Records forever (until :meth:`close`), polling as needed."""
        while not self._closed:
            yield from self.poll()
