"""What the producer does after each attempt at sending a batch: one table (:data:`OUTCOMES`),
read by both producers, and the retry policy whose settings feed it. No I/O; times are the
caller's monotonic milliseconds.

An attempt ends in one of six ways (:class:`Attempt`); whether the batch may go again
(retries left, the delivery timeout not reached, the producer not closing) picks the row.
OUT_OF_ORDER: the broker stored nothing of the batch and lost (or forgot) the producer's
earlier ones, as a crash under async flush can make it; the batch goes again from sequence 0
of a new epoch. BEHIND_A_RETRY: out of order too, but a batch sent before it under its epoch
was refused and waits to go again (a full disk had room for this one's write only): the gap
is that batch's, so this one follows it, the same bytes under the same epoch. RETRIABLE (the
broker is unavailable, the answer was lost): it may be stored; the same bytes go again, which
the broker recognises as a retry (an append the broker's disk refused, a StorageError, too).
FAIL_FENCED: the batch may be stored, so the epoch is bumped, or the broker would refuse the
next batches as out of order.
"""

from __future__ import annotations

import math
import random
from enum import Enum
from typing import NamedTuple

from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    StorageError,
    UnavailableError,
    UsageError,
)

__all__ = [
    "Attempt",
    "Step",
    "OUTCOMES",
    "Verdict",
    "RetryPolicy",
    "classify",
    "judge",
    "final_step",
    "check_timeout_s",
    "closed_unsent",
    "int_setting",
]


class Attempt(Enum):
    """What one attempt at sending a batch ended with."""

    STORED = "stored"
    REFUSED = "refused"  # a usage error: the broker checked and stored nothing
    OUT_OF_ORDER = "out_of_order"  # stored nothing; the broker lost the producer's earlier batches
    BEHIND_A_RETRY = "behind_a_retry"  # stored nothing; a batch before it waits to go again
    RETRIABLE = "retriable"  # maybe stored; the same bytes may go again
    UNKNOWN = "unknown"  # maybe stored, and sending it again would not help


class Step(Enum):
    """What the producer does with the batch next."""

    SETTLE = "settle"
    RESEND = "resend"
    REENCODE = "reencode"
    FAIL = "fail"
    FAIL_FENCED = "fail_fenced"


# (how the attempt ended, whether the batch may go again) -> the next step
OUTCOMES: dict[tuple[Attempt, bool], Step] = {
    (Attempt.STORED, True): Step.SETTLE,  # the futures get their ids
    (Attempt.STORED, False): Step.SETTLE,
    (Attempt.REFUSED, True): Step.FAIL,  # nothing stored: the batch's sequences are free again
    (Attempt.REFUSED, False): Step.FAIL,
    (Attempt.OUT_OF_ORDER, True): Step.REENCODE,  # at once, under a new epoch
    (Attempt.OUT_OF_ORDER, False): Step.FAIL_FENCED,
    (Attempt.BEHIND_A_RETRY, True): Step.RESEND,  # after that batch, at once: no new epoch
    (Attempt.BEHIND_A_RETRY, False): Step.FAIL_FENCED,
    (Attempt.RETRIABLE, True): Step.RESEND,  # the same bytes, after a backoff
    (Attempt.RETRIABLE, False): Step.FAIL_FENCED,
    (Attempt.UNKNOWN, True): Step.FAIL_FENCED,
    (Attempt.UNKNOWN, False): Step.FAIL_FENCED,
}


def classify(exc: BaseException | None, sequenced: bool, behind_a_retry: bool = False) -> Attempt:
    """How an attempt that ended with ``exc`` (None: stored) ended, for a batch that carries
    a sequence (``sequenced``) or not, and has a batch sent before it under its epoch waiting
    to go again (``behind_a_retry``) or not. Usage errors, and a closed broker or client, are
    refusals before anything is stored; a fenced producer's or an out-of-order sequence's
    are not: those say the producer's state disagrees with the broker's."""
    if exc is None:
        return Attempt.STORED
    if isinstance(exc, OutOfOrderSequenceError) and sequenced:
        return Attempt.BEHIND_A_RETRY if behind_a_retry else Attempt.OUT_OF_ORDER
    if getattr(exc, "retriable", False):
        return Attempt.RETRIABLE
    if type(exc) is StorageError and sequenced:
        # The broker's disk refused the append (full, or an fsync failed): a write that
        # failed stored nothing, and one that may be stored is recognised when the same
        # bytes come again. Sent again until the delivery timeout, as Kafka retries its
        # storage errors; failing it at once fenced the producer, and every batch in
        # flight behind it then failed as out of order under a new epoch (issue 30).
        return Attempt.RETRIABLE
    if isinstance(exc, (UsageError, ClosedError)) and not isinstance(exc, ProducerFencedError):
        return Attempt.REFUSED
    return Attempt.UNKNOWN


def final_step(exc: BaseException, attempts: int) -> Step:
    """How a batch that fails for good with ``exc`` after ``attempts`` fails: FAIL_FENCED if it
    may have been stored (it was sent, and the error does not rule that out), else FAIL."""
    if not attempts:
        return Step.FAIL
    return OUTCOMES[classify(exc, True), False]


class Verdict(NamedTuple):
    """The step after a failed attempt; ``delay_ms`` before a RESEND; ``error``, what the
    batch's futures get when the step fails it."""

    step: Step
    delay_ms: float
    error: BaseException | None


def int_setting(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` if it is an int from ``lo`` to ``hi``, else an InvalidArgumentError."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgumentError(f"{name} must be an int from {lo} to {hi}, got {value!r}")
    return value


def check_timeout_s(timeout_s: object, call: str) -> None:
    """Refuse (InvalidArgumentError) a ``timeout_s`` of ``call`` that is neither None (no
    bound) nor a finite number of seconds >= 0.

    >>> check_timeout_s(2.5, "flush()"), check_timeout_s(None, "flush()")
    (None, None)
    >>> check_timeout_s(-1, "flush()")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwater.errors.InvalidArgumentError: flush(): timeout_s is how long it waits, ... got -1
    """
    if timeout_s is None:
        return
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 <= timeout_s < math.inf:
        raise InvalidArgumentError(
            f"{call}: timeout_s is how long it waits, in seconds: a number >= 0 or None (no bound), got {timeout_s!r}"
        )


def closed_unsent() -> ClosedError:
    """What a message still unsent when its producer closed fails with."""
    return ClosedError("the producer was closed before this message was sent")


class RetryPolicy:
    """When a producer sends a failed batch again, and what the batch's futures get when it
    does not: the ``retries``, ``retry_backoff_ms``, ``retry_backoff_max_ms`` and
    ``delivery_timeout_ms`` settings, checked.

    >>> p = RetryPolicy(retries=3, backoff_ms=100, backoff_max_ms=300, delivery_timeout_ms=5000,
    ...                 rng=random.Random(7))
    >>> waits = [p.backoff_ms(n, created_ms=0.0, now_ms=0.0) for n in (1, 2, 3, 4)]
    >>> all(0.8 * b <= w <= 1.2 * b for w, b in zip(waits, (100, 200, 300, 300)))  # doubling, capped, +-20 %
    True
    >>> p.backoff_ms(1, created_ms=0.0, now_ms=4990.0) is None  # it would end past delivery_timeout_ms
    True
    >>> p.gives_up(attempts=4, aborting=False), p.gives_up(attempts=3, aborting=False)
    (True, False)
    """

    __slots__ = ("retries", "base_backoff_ms", "backoff_max_ms", "delivery_timeout_ms", "_rng")

    def __init__(
        self, *, retries: int, backoff_ms: int, backoff_max_ms: int, delivery_timeout_ms: int, rng: random.Random
    ) -> None:
        self.retries = int_setting("retries", retries, 0, 1_000_000)
        self.base_backoff_ms = int_setting("retry_backoff_ms", backoff_ms, 0, 3_600_000)
        self.backoff_max_ms = int_setting("retry_backoff_max_ms", backoff_max_ms, self.base_backoff_ms, 3_600_000)
        self.delivery_timeout_ms = int_setting("delivery_timeout_ms", delivery_timeout_ms, 1, 86_400_000)
        self._rng = rng

    def gives_up(self, attempts: int, aborting: bool) -> bool:
        """No more attempts: ``attempts`` used up the retries, or the producer is closing."""
        return attempts > self.retries or aborting

    def backoff_ms(self, attempts: int, created_ms: float, now_ms: float) -> float | None:
        """Milliseconds to wait before attempt ``attempts + 1`` of a batch made at
        ``created_ms``; None when that would end past the delivery timeout."""
        backoff_ms = min(self.base_backoff_ms << min(max(attempts - 1, 0), 30), self.backoff_max_ms)
        delay_ms = backoff_ms * (0.8 + 0.4 * self._rng.random())  # +-20% jitter
        if now_ms + delay_ms - created_ms > self.delivery_timeout_ms:
            return None
        return delay_ms

    def refuse_first_send(self, created_ms: float, now_ms: float, aborting: bool) -> BaseException | None:
        """Why a batch made at ``created_ms`` must not go out for its first attempt (the
        producer is closing, or the batch waited past the delivery timeout); None when it may."""
        if aborting:
            return closed_unsent()
        if now_ms - created_ms > self.delivery_timeout_ms:
            return UnavailableError(
                f"the batch waited longer than delivery_timeout_ms={self.delivery_timeout_ms} to be sent"
            )
        return None

    def final_error(self, exc: BaseException, attempts: int, aborting: bool) -> BaseException:
        """What a batch failing with ``exc`` after ``attempts`` fails with: a retriable error
        that ran out of time says so (the error is its cause); any other is itself."""
        if getattr(exc, "retriable", False) and not self.gives_up(attempts, aborting):
            err = UnavailableError(
                f"not acknowledged within delivery_timeout_ms={self.delivery_timeout_ms} "
                f"({attempts} attempts); last error: {exc}"
            )
            err.__cause__ = exc
            return err
        return exc


def judge(
    policy: RetryPolicy,
    exc: BaseException,
    *,
    attempts: int,
    sequenced: bool,
    created_ms: float,
    now_ms: float,
    aborting: bool = False,
    behind_a_retry: bool = False,
) -> Verdict:
    """The step after attempt ``attempts`` of a batch made at ``created_ms`` failed with ``exc``
    (``behind_a_retry``: a batch sent before it under its epoch waits to go again)."""
    kind = classify(exc, sequenced, behind_a_retry)
    delay_ms: float | None = None
    if not policy.gives_up(attempts, aborting):
        if kind is Attempt.OUT_OF_ORDER or kind is Attempt.BEHIND_A_RETRY:
            delay_ms = 0.0
        elif kind is Attempt.RETRIABLE:
            delay_ms = policy.backoff_ms(attempts, created_ms, now_ms)
    step = OUTCOMES[kind, delay_ms is not None]
    if step is Step.RESEND or step is Step.REENCODE:
        return Verdict(step, delay_ms or 0.0, None)
    return Verdict(step, 0.0, policy.final_error(exc, attempts, aborting))
