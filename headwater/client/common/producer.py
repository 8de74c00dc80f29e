"""What the thread-based and the asyncio producers do alike above their core, written once.

:class:`ProducerBase` holds the settings and the no-I/O helpers of
:class:`headwater.client.core.batching.ProducerBase`, and the public sends that differ only
in how they wait, as ``@waits`` bodies (:mod:`headwater.client.common.twins`):
:meth:`~ProducerBase.send_batch` and :meth:`~ProducerBase.send_identified`. Each driver
supplies what such a body yields: the queue's metadata, the sending of a batch's groups,
the flight of an identified batch. For the blocking driver each of those is the answer
itself; for the asyncio one an awaitable of it.

The single-message sends stay in each driver: they are the hot paths (no generator per
message), and their twins' parameters differ (the thread-based ones take a ``callback``).
For the same reason the thread-based ``send_batch`` sends unkeyed messages for the sticky
partition itself and drives this body for the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from headwater.client.common.twins import Twins, waits
from headwater.client.core import batching
from headwater.client.core.batching import Groups, check_batch_arg, receipt
from headwater.client.core.producer import Batch
from headwater.model.message import Message, MessageId
from headwater.model.service import ProduceResult

if TYPE_CHECKING:
    import concurrent.futures

__all__ = ["Groups", "Messages", "ProducerBase"]

#: the messages of one call that sends several
Messages = Sequence[Message | bytes]


class ProducerBase(batching.ProducerBase, Twins):
    """The producers' shared half: the sends that wait, written once, and the helpers both
    drivers use. Each driver defines what the bodies call, each returning the answer
    (blocking) or an awaitable of it (asyncio):

    - ``_info_for(queue, partition)``: the queue's metadata for a send that waits, with
      ``partition`` (if given) checked against it;
    - ``_open_info(queue)``: the queue's metadata, while the producer is open;
    - ``_send_groups_of(queue, info, messages, groups, deliver_at_ms)``: send each group of
      ``messages`` (their indexes by partition; None: the sticky one) without lingering; the
      groups' ProduceResults in order;
    - ``_fly(batch)``: put an identified batch in flight; what ``send_identified`` returns;

    and, not waiting, ``_now_ms()`` (its monotonic clock) and ``_before_sending(what)``
    (refuse a send that waits where it may not, or on a closed producer).

    A ``@waits`` body is annotated with what its driven method returns, not as the
    generator it is: the drivers keep the body's signature (``functools.wraps``), and that
    is what users see.
    """

    # -- the sends both drivers have alike --------------------------------------------------

    @waits
    def send_batch(
        self,
        queue: str,
        messages: Sequence[Message | bytes],
        *,
        partition: int | None = None,
        deliver_at: datetime | int | None = None,
        delay: timedelta | float | None = None,
    ) -> Sequence[MessageId]:  # the driven method's result, which help() shows: see the class docstring
        """Send messages as one batch per partition; return their ids in the given order.

        Waits until they are stored (``await`` it on the asyncio producer). With
        ``partition`` every message goes there; otherwise the producer's partitioner
        decides (see :mod:`headwater.client.core.partitioner`). Every message is checked
        before any is queued. When messages go to several partitions and one fails, the
        others may be stored. ``deliver_at`` or ``delay`` (as for ``Producer.send``) delay
        every message of the call. A send callback of the thread-based producer cannot call
        it (:class:`UsageError`): it waits.
        """
        check_batch_arg(messages)
        self._before_sending("send_batch()")
        at = self._deliver_at(deliver_at, delay)
        info = yield self._info_for(queue, partition)
        groups = self._split(info, messages, partition)
        results = yield self._send_groups_of(queue, info, messages, groups, at)
        return receipt(len(messages), groups, results)

    @waits
    def send_identified(
        self,
        queue: str,
        partition: int,
        messages: Sequence[Message | bytes],
        *,
        identity: tuple[int, int],
        base_sequence: int = 0,
        deliver_at_ms: int = 0,
    ) -> concurrent.futures.Future[ProduceResult] | ProduceResult:  # the driven method's, as above
        """Send ``messages`` as one batch to ``partition`` under an identity the caller names,
        ``(producer id, epoch)``, from sequence ``base_sequence``. The thread-based producer
        returns a future of its :class:`~headwater.model.service.ProduceResult` at once; the
        asyncio one is awaited and returns that result. For connectors whose retries must
        find the batches of their earlier attempts (the Spark writer derives ids from its
        task). The batch is retried as any other, with the same bytes, and never encoded
        anew: an out-of-order or fenced refusal comes back as the outcome. A body over the
        queue's ``message_bytes_max`` raises here."""
        info = yield self._open_info(queue)
        b = self._core.identified(
            queue,
            partition,
            messages,
            identity,
            self._now_ms(),
            base_sequence=base_sequence,
            deliver_at_ms=deliver_at_ms,
            cap=info.config.message_bytes_max,
        )  # encoded here, without a lock: the batch's state is its own
        return (yield self._fly(b))

    # -- shared helpers (no waiting) -----------------------------------------------------------

    def _encode_for_send(self, b: Batch) -> BaseException | None:
        """Before a batch the core put in flight is sent: encode it (unless it is a retry of
        the same bytes) and count the attempt. The error that stops it, if one does."""
        if b.encoded is None:
            refused = self._core.refuse_first(b, self._now_ms())
            if refused is not None:
                return refused
            try:
                self._core.encode(b)  # messages were checked against the queue's limit when queued
            except Exception as e:  # noqa: BLE001 - it belongs to the batch's futures
                return e
        b.attempts += 1
        return None
