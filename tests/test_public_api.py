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
