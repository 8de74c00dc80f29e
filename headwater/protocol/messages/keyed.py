"""Bodies of keyed groups: look up or create, fetch a member's keys, commit, resize."""

from __future__ import annotations

from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo
from headwater.protocol.messages.base import ApiKey, RequestBody, ResponseBody


class _KeyedGroupResult(ResponseBody, frozen=True, array_like=True):
    group: KeyedGroupInfo

    def result(self) -> KeyedGroupInfo:
        return self.group

    @classmethod
    def from_result(cls, value: KeyedGroupInfo) -> ResponseBody:
        return cls(value)


class KeyedGroupRequest(RequestBody, frozen=True, array_like=True):
    """Look up a keyed group; with ``key`` and ``size``, create it if absent or check it."""

    api = ApiKey.KEYED_GROUP
    queue: str
    group: str
    key: str | None = None
    size: int | None = None
    start: str = "earliest"


class KeyedGroupResponse(_KeyedGroupResult, frozen=True, array_like=True):
    api = ApiKey.KEYED_GROUP


class KeyedFetchRequest(RequestBody, frozen=True, array_like=True):
    """A keyed member's fetch: only the messages whose key hashes to ``member``."""

    api = ApiKey.KEYED_FETCH
    queue: str
    group: str
    member: int
    generation: int
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int = 0


class KeyedFetchResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.KEYED_FETCH
    batches: list[bytes]  # data section
    next_offset: int
    start_offset: int
    end_offset: int
    generation: int
    stop_offset: int | None = None
    selections: list[list[int]] = []  # per batch: the offsets of a selection, [] for a stored batch

    def result(self) -> KeyedFetchResult:
        return KeyedFetchResult(
            list(self.batches),
            self.next_offset,
            self.start_offset,
            self.end_offset,
            self.generation,
            self.stop_offset,
            list(self.selections),
        )

    @classmethod
    def from_result(cls, value: KeyedFetchResult) -> ResponseBody:
        return cls(
            list(value.batches),
            value.next_offset,
            value.start_offset,
            value.end_offset,
            value.generation,
            value.stop_offset,
            list(value.selections),
        )


class KeyedCommitRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.KEYED_COMMIT
    queue: str
    group: str
    member: int
    generation: int
    offsets: dict[int, int]


class KeyedCommitResponse(_KeyedGroupResult, frozen=True, array_like=True):
    api = ApiKey.KEYED_COMMIT


class KeyedResizeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.KEYED_RESIZE
    queue: str
    group: str
    size: int


class KeyedResizeResponse(_KeyedGroupResult, frozen=True, array_like=True):
    api = ApiKey.KEYED_RESIZE
