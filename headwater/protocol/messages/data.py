"""Bodies of the data operations: produce, fetch, and the lookups by id, key and time."""

from __future__ import annotations

import msgspec

from headwater.model.service import FetchResult, ProduceResult
from headwater.protocol.messages.base import ApiKey, RequestBody, ResponseBody


class ProduceRequest(RequestBody, frozen=True, array_like=True):
    """Append one record batch (as built by ``encode_batch``) to a partition."""

    api = ApiKey.PRODUCE
    queue: str
    partition: int
    batch: bytes  # data section; any bytes-like object when sending


class ProduceResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.PRODUCE
    queue_id: int
    partition: int
    base_offset: int
    count: int
    timestamp_ms: int

    def result(self) -> ProduceResult:
        return ProduceResult(*msgspec.structs.astuple(self))

    @classmethod
    def from_result(cls, value: ProduceResult) -> ResponseBody:
        return cls(*msgspec.structs.astuple(value))


class FetchRequest(RequestBody, frozen=True, array_like=True):
    """Stored batches of a partition from ``offset`` on, about ``max_bytes`` of them.

    When nothing is there yet the server may hold the request up to ``max_wait_ms`` for
    data to arrive (long polling); 0 answers at once.
    """

    api = ApiKey.FETCH
    queue: str
    partition: int
    offset: int
    max_bytes: int
    tag_mask: int = 0
    end_offset: int | None = None
    max_wait_ms: int = 0


class FetchResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.FETCH
    batches: list[bytes]  # data section; any bytes-like objects when sending
    next_offset: int
    start_offset: int
    end_offset: int

    def result(self) -> FetchResult:
        return FetchResult(list(self.batches), self.next_offset, self.start_offset, self.end_offset)

    @classmethod
    def from_result(cls, value: FetchResult) -> ResponseBody:
        return cls(list(value.batches), value.next_offset, value.start_offset, value.end_offset)


class LookupIdRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LOOKUP_ID
    queue_id: int
    partition: int
    offset: int


class LookupIdResponse(ResponseBody, frozen=True, array_like=True):
    """The queue's name and the stored batch holding the message."""

    api = ApiKey.LOOKUP_ID
    queue: str
    batch: bytes  # data section

    def result(self) -> tuple[str, bytes]:
        return self.queue, self.batch

    @classmethod
    def from_result(cls, value: tuple[str, bytes]) -> ResponseBody:
        return cls(*value)


class LookupKeyRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LOOKUP_KEY
    queue: str
    key: bytes
    start_ms: int | None
    end_ms: int | None
    limit: int


class LookupKeyResponse(ResponseBody, frozen=True, array_like=True):
    """Stored batches that may hold messages with the key (the reader keeps exact matches)."""

    api = ApiKey.LOOKUP_KEY
    batches: list[bytes]  # data section

    def result(self) -> list[bytes]:
        return list(self.batches)

    @classmethod
    def from_result(cls, value: list[bytes]) -> ResponseBody:
        return cls(list(value))


class OffsetForTimeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.OFFSET_FOR_TIME
    queue: str
    partition: int
    timestamp_ms: int


class OffsetForTimeResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.OFFSET_FOR_TIME
    offset: int

    def result(self) -> int:
        return self.offset

    @classmethod
    def from_result(cls, value: int) -> ResponseBody:
        return cls(value)
