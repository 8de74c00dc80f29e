"""Bodies of push subscriptions (subscribe, acks, subscriber administration) and fetch
streams (open, credit, close), and the PUSH bodies both streams send."""

from __future__ import annotations

from headwater.model.service import PushStreamSpec
from headwater.model.subscription import SubscriberInfo
from headwater.protocol.messages.base import U32, ApiKey, PushBody, RequestBody, ResponseBody, _NoResult


class _SubscriberResult(ResponseBody, frozen=True, array_like=True):
    subscriber: SubscriberInfo

    def result(self) -> SubscriberInfo:
        return self.subscriber

    @classmethod
    def from_result(cls, value: SubscriberInfo) -> ResponseBody:
        return cls(value)


class FetchStreamRequest(RequestBody, frozen=True, array_like=True):
    """Open a fetch stream on this connection: the broker pushes the stored batches of
    ``queue``'s partitions from ``positions`` (``{partition: offset}``) on, as FETCH would
    return them, as soon as they are appended, while the stream has credit.

    ``stream_id`` (chosen by the client, unique among its open streams on the connection,
    subscriptions' included) names the stream in PUSH frames. ``credit_bytes``: the batch
    bytes the broker may push before more credit comes (STREAM_CREDIT); a push may overshoot
    by one batch. ``tag_mask`` as in FETCH; ``push_bytes_max``: about the most one PUSH
    carries.
    """

    api = ApiKey.FETCH_STREAM
    stream_id: U32
    queue: str
    positions: dict[int, int]
    credit_bytes: U32
    tag_mask: int = 0
    push_bytes_max: U32 = 1 << 20


class FetchStreamResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.FETCH_STREAM


class StreamCreditRequest(RequestBody, frozen=True, array_like=True):
    """Let a fetch stream push ``credit_bytes`` more bytes."""

    api = ApiKey.STREAM_CREDIT
    stream_id: U32
    credit_bytes: U32


class StreamCreditResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.STREAM_CREDIT


class CloseStreamRequest(RequestBody, frozen=True, array_like=True):
    """End a fetch stream (an id that is not open is not an error)."""

    api = ApiKey.CLOSE_STREAM
    stream_id: U32


class CloseStreamResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.CLOSE_STREAM


class SubscribeRequest(RequestBody, frozen=True, array_like=True):
    """Open a push stream of subscriber ``name`` on this connection.

    ``subscription_id`` (chosen by the client, unique among its open streams on the
    connection) names the stream in PUSH frames. The broker pushes from the subscriber's
    checkpoints while the stream has credit: ``credit_messages`` messages and
    ``credit_bytes`` bytes to begin with, more with each SUBSCRIPTION_ACK.
    """

    api = ApiKey.SUBSCRIBE
    subscription_id: U32
    queue: str
    name: str
    credit_messages: U32
    credit_bytes: U32
    # on a cluster (docs/design/cluster.md, "Subscriptions (built)"): the subscription epoch
    # the coordinator gave this process (CLAIM_SUBSCRIBER), and the partitions this leader
    # is to push with where each starts, and the tags: the stream pushes those partitions
    # only and checkpoints nothing (the coordinator keeps them). None: the subscriber's own
    # partitions from its stored checkpoints (a broker alone); an older client sends none.
    epoch: int = 0
    positions: dict[int, int] | None = None
    tags: list[str] | None = None

    @classmethod
    def opening(cls, subscription_id: int, spec: PushStreamSpec) -> SubscribeRequest:
        """The request that opens stream ``subscription_id`` as ``spec`` says."""
        where = None if spec.positions is None else dict(spec.positions)
        return cls(
            subscription_id,
            spec.queue,
            spec.name,
            spec.credit_messages,
            spec.credit_bytes,
            spec.epoch,
            where,
            spec.tags,
        )


class SubscribeResponse(_SubscriberResult, frozen=True, array_like=True):
    """The subscriber as the stream starts (its checkpoints are where pushes begin)."""

    api = ApiKey.SUBSCRIBE


class UnsubscribeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.UNSUBSCRIBE
    subscription_id: U32


class UnsubscribeResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.UNSUBSCRIBE


class SubscriptionAckRequest(RequestBody, frozen=True, array_like=True):
    """Give a stream more credit and, when ``offsets`` is not empty, checkpoint it durably
    (``{partition: next offset to deliver}``) before answering."""

    api = ApiKey.SUBSCRIPTION_ACK
    subscription_id: U32
    offsets: dict[int, int]
    credit_messages: U32
    credit_bytes: U32


class SubscriptionAckResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.SUBSCRIPTION_ACK


class AddSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.ADD_SUBSCRIBER
    queue: str
    name: str
    partitions: list[int] | None = None
    tags: list[str] | None = None
    start: str = "latest"


class AddSubscriberResponse(_SubscriberResult, frozen=True, array_like=True):
    api = ApiKey.ADD_SUBSCRIBER


class DeleteSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DELETE_SUBSCRIBER
    queue: str
    name: str


class DeleteSubscriberResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.DELETE_SUBSCRIBER


class ListSubscribersRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LIST_SUBSCRIBERS
    queue: str | None = None


class ListSubscribersResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.LIST_SUBSCRIBERS
    subscribers: list[SubscriberInfo]

    def result(self) -> list[SubscriberInfo]:
        return list(self.subscribers)

    @classmethod
    def from_result(cls, value: list[SubscriberInfo]) -> ResponseBody:
        return cls(list(value))


class DescribeSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_SUBSCRIBER
    queue: str
    name: str


class DescribeSubscriberResponse(_SubscriberResult, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_SUBSCRIBER


class CheckpointSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.CHECKPOINT_SUBSCRIBER
    queue: str
    name: str
    offsets: dict[int, int]
    epoch: int = 0  # the writer's subscription epoch: refused if a newer process claimed the name (0: unchecked)


class CheckpointSubscriberResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.CHECKPOINT_SUBSCRIBER


class ClaimSubscriberRequest(RequestBody, frozen=True, array_like=True):
    """Sent to a subscriber's coordinator by a process about to subscribe on a cluster: the
    coordinator bumps the subscriber's epoch durably and answers the subscriber with it;
    every leader's stream carries it, and a stream of an older epoch is ended as replaced."""

    api = ApiKey.CLAIM_SUBSCRIBER
    queue: str
    name: str


class ClaimSubscriberResponse(_SubscriberResult, frozen=True, array_like=True):
    api = ApiKey.CLAIM_SUBSCRIBER


class EndSubscriberStreamsRequest(RequestBody, frozen=True, array_like=True):
    """Broker to broker (a subscriber's coordinator to every broker, after a claim or a
    delete): end this broker's push stream of the subscriber if its epoch is older than
    ``epoch`` (as replaced), or whatever its epoch when ``deleted``. Clients never send it."""

    api = ApiKey.END_SUBSCRIBER_STREAMS
    queue: str
    name: str
    epoch: int
    deleted: bool = False


class EndSubscriberStreamsResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.END_SUBSCRIBER_STREAMS


class SubscriptionPush(PushBody, frozen=True, array_like=True):
    """Messages of one partition for the stream ``subscription_id`` (server to client).

    ``batches`` are stored batches or selections of one (only matching messages: the broker
    filters; ``selections`` as in KEYED_FETCH), from the stream's position on;
    ``next_offset`` is where the stream continues in ``partition``
    (past messages it skipped), ``end_offset`` the partition's end when read. A non-empty
    ``ended`` ends the stream (the reason, e.g. another connection took it over) and
    ``ended_code`` is the error code of that reason (its class tells whether subscribing again
    may help: UnavailableError when the broker stops); no push follows for it.
    """

    api = ApiKey.SUBSCRIBE
    subscription_id: U32
    partition: int
    batches: list[bytes]  # data section
    next_offset: int
    end_offset: int
    ended: str = ""
    ended_code: U32 = 0
    selections: list[list[int]] = []


class StreamPush(PushBody, frozen=True, array_like=True):
    """Batches of one partition for the fetch stream ``stream_id`` (server to client).

    ``batches``, ``next_offset``, ``start_offset`` and ``end_offset`` mean what they mean in
    a FETCH answer read at the stream's position in ``partition``: stored batches, whose
    records before that position (or not matching the tag mask) the client skips; where the
    stream continues; the partition's first and end offsets when read. A non-empty ``ended``
    ends the stream (the reason, e.g. the queue was deleted or the broker stops) and
    ``ended_code`` is that reason's error code; no push follows for it.
    """

    api = ApiKey.FETCH_STREAM
    stream_id: U32
    partition: int
    batches: list[bytes]  # data section
    next_offset: int
    start_offset: int
    end_offset: int
    ended: str = ""
    ended_code: U32 = 0
