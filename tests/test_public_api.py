"""The public names of ``headwater``: adding one is a decision, removing one breaks users."""

import headwater
import headwater.errors

EXPECTED = {
    "open",
    "connect",
    "Admin",
    "BatchReceipt",
    "Client",
    "Consumer",
    "Delivery",
    "GroupConsumer",
    "KeyedConsumer",
    "SharedConsumer",
    "Subscriber",
    "Message",
    "MessageId",
    "PartitionInfo",
    "Producer",
    "QueueConfig",
    "QueueInfo",
    "Record",
    "Scanner",
    "StoreConfig",
    "__version__",
    *headwater.errors.__all__,
}


def test_all_is_pinned():
    assert set(headwater.__all__) == EXPECTED
    assert len(headwater.__all__) == len(set(headwater.__all__))
    for name in headwater.__all__:
        assert hasattr(headwater, name), name


def test_error_codes_are_unique_and_stable():
    from headwater.errors import HeadwaterError, error_for_code

    seen = {}
    for name in headwater.errors.__all__:
        cls = getattr(headwater.errors, name)
        if isinstance(cls, type) and issubclass(cls, HeadwaterError):
            assert cls.code not in seen, (name, seen.get(cls.code))
            seen[cls.code] = name
            assert error_for_code(cls.code) is cls
    assert seen[7] == "QueueNotFoundError" and seen[40] == "UnavailableError"
    assert error_for_code(9999) is HeadwaterError


#: Every error class's code, retriable flag and parent: the codes and flags are what crosses
#: the wire (stable forever); the parents are the tree drawn in headwater/errors.py.
ERROR_TREE = {
    "HeadwaterError": (0, False, None),
    "UsageError": (1, False, "HeadwaterError"),
    "InvalidArgumentError": (2, False, "UsageError"),
    "InvalidQueueNameError": (3, False, "InvalidArgumentError"),
    "PartitionOutOfRangeError": (4, False, "InvalidArgumentError"),
    "MessageTooLargeError": (5, False, "InvalidArgumentError"),
    "InvalidMessageIdError": (6, False, "InvalidArgumentError"),
    "QueueNotFoundError": (7, False, "UsageError"),
    "QueueExistsError": (8, False, "UsageError"),
    "QueueDisabledError": (9, False, "UsageError"),
    "InvalidBatchError": (10, False, "UsageError"),
    "MessageNotFoundError": (11, False, "UsageError"),
    "ProducerFencedError": (14, False, "UsageError"),
    "SubscriberNotFoundError": (18, False, "UsageError"),
    "SubscriberExistsError": (19, False, "UsageError"),
    "StateConflictError": (15, False, "HeadwaterError"),
    "ClosedError": (12, False, "StateConflictError"),
    "OutOfOrderSequenceError": (13, False, "StateConflictError"),
    "WakeupError": (16, False, "StateConflictError"),
    "GroupError": (60, False, "StateConflictError"),
    "UnknownMemberError": (61, False, "GroupError"),
    "StaleGenerationError": (62, False, "GroupError"),
    "PartitionNotAssignedError": (63, False, "GroupError"),
    "GroupNotEmptyError": (64, False, "GroupError"),
    "GroupNotFoundError": (65, False, "GroupError"),
    "LeaseError": (70, False, "GroupError"),
    "LeaseExpiredError": (71, False, "LeaseError"),
    "LeaseNotOwnedError": (72, False, "LeaseError"),
    "DataDirectoryError": (20, False, "HeadwaterError"),
    "NotADataDirectoryError": (21, False, "DataDirectoryError"),
    "DataDirectoryLockedError": (22, False, "DataDirectoryError"),
    "UnsupportedFormatError": (23, False, "DataDirectoryError"),
    "ReadOnlyStoreError": (24, False, "DataDirectoryError"),
    "StorageError": (30, False, "HeadwaterError"),
    "CorruptDataError": (31, False, "StorageError"),
    "UnavailableError": (40, True, "HeadwaterError"),
    "OutcomeUnknownError": (41, False, "UnavailableError"),
    "NotLeaderError": (42, True, "UnavailableError"),
    "NotCoordinatorError": (43, True, "UnavailableError"),
    "ClusterError": (80, False, "HeadwaterError"),
}


def test_the_error_tree_codes_and_retriable_flags_are_pinned():
    classes = {n: getattr(headwater.errors, n) for n in headwater.errors.__all__ if n.endswith("Error")}
    assert set(classes) == set(ERROR_TREE)
    for name, (code, retriable, parent) in ERROR_TREE.items():
        cls = classes[name]
        assert (cls.code, cls.retriable) == (code, retriable), name
        headwater_bases = [b.__name__ for b in cls.__bases__ if issubclass(b, headwater.errors.HeadwaterError)]
        assert headwater_bases == ([parent] if parent else []), name
        assert f"{name} " in headwater.errors.__doc__, f"{name} is not drawn in the tree"


def test_state_conflicts_are_not_usage_errors():
    """Retrying the same call fails the same way for both, but a state conflict is cured by
    learning the new state (heartbeat, join, receive, reopen), not by changing the call: an
    ``except UsageError`` must not catch one."""
    from headwater.errors import (
        ClosedError,
        LeaseExpiredError,
        OutOfOrderSequenceError,
        StaleGenerationError,
        StateConflictError,
        UsageError,
    )

    for cls in (StaleGenerationError, LeaseExpiredError, OutOfOrderSequenceError, ClosedError):
        assert issubclass(cls, StateConflictError) and not issubclass(cls, UsageError), cls


def test_every_public_name_has_a_docstring():
    for name in headwater.__all__:
        obj = getattr(headwater, name)
        if callable(obj) and not name.endswith("Error"):
            assert obj.__doc__, name


def test_aio_all_is_pinned():
    import headwater.aio

    assert set(headwater.aio.__all__) == {
        "connect",
        "open",
        "AsyncAdmin",
        "AsyncClient",
        "AsyncConsumer",
        "AsyncGroupConsumer",
        "AsyncKeyedConsumer",
        "AsyncProducer",
        "AsyncScanner",
        "AsyncSharedConsumer",
        "AsyncSubscriber",
    }
    for name in headwater.aio.__all__:
        assert getattr(headwater.aio, name).__doc__, name


def test_the_asyncio_client_has_every_name_of_the_sync_one():
    """Each sync class of ``headwater`` and its twin in ``headwater.aio`` have the same
    public names (a feature added to one is added to the other)."""
    import headwater.aio

    def names(cls) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_")}

    twins = {
        "Admin": "AsyncAdmin",
        "Client": "AsyncClient",
        "Consumer": "AsyncConsumer",
        "GroupConsumer": "AsyncGroupConsumer",
        "KeyedConsumer": "AsyncKeyedConsumer",
        "Producer": "AsyncProducer",
        "Scanner": "AsyncScanner",
        "SharedConsumer": "AsyncSharedConsumer",
        "Subscriber": "AsyncSubscriber",
    }
    assert set(twins.values()) == {n for n in headwater.aio.__all__ if n.startswith("Async")}
    for sync_name, aio_name in twins.items():
        sync_cls, aio_cls = getattr(headwater, sync_name), getattr(headwater.aio, aio_name)
        assert names(sync_cls) - names(aio_cls) == set(), f"{aio_name} lacks what {sync_name} has"


def test_the_producers_agree_on_the_names_of_their_two_sends():
    """``send_nowait`` returns a future at once and ``send_and_wait`` waits for the id, in
    both kinds (``send`` keeps each kind's habit: a future in sync code, awaited in asyncio)."""
    import inspect

    import headwater.aio

    sync, aio = headwater.Producer, headwater.aio.AsyncProducer
    assert sync.send_nowait is sync.send and aio.send_and_wait is aio.send
    assert not inspect.iscoroutinefunction(sync.send_and_wait) and not inspect.iscoroutinefunction(aio.send_nowait)
    assert inspect.iscoroutinefunction(aio.send_and_wait)
    assert "Future" in str(inspect.signature(sync.send_nowait).return_annotation)
    assert "Future" in str(inspect.signature(aio.send_nowait).return_annotation)
