"""Bodies of consumer groups: committed offsets and membership (join, heartbeat, leave,
describe, list)."""

from __future__ import annotations

from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary
from headwater.protocol.messages.base import ApiKey, RequestBody, ResponseBody, _NoResult


class CommitOffsetsRequest(RequestBody, frozen=True, array_like=True):
    """Store a consumer group's positions: ``{partition: offset}`` (next offset to read)."""

    api = ApiKey.COMMIT_OFFSETS
    group: str
    queue: str
    offsets: dict[int, int]
    member_id: str | None = None  # a clustering group's member: its id and generation
    generation: int | None = None


class CommitOffsetsResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.COMMIT_OFFSETS


class FetchOffsetsRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.FETCH_OFFSETS
    group: str
    queue: str


class FetchOffsetsResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.FETCH_OFFSETS
    offsets: dict[int, int]

    def result(self) -> dict[int, int]:
        return dict(self.offsets)

    @classmethod
    def from_result(cls, value: dict[int, int]) -> ResponseBody:
        return cls(dict(value))


class JoinGroupRequest(RequestBody, frozen=True, array_like=True):
    """Join a consumer group; the answer carries the assignment (no second round trip)."""

    api = ApiKey.JOIN_GROUP
    group: str
    member_id: str | None  # None: a new member
    client_id: str
    queues: list[str]
    mode: str  # "clustering" or "broadcast"
    strategy: str  # "average" or "sticky"
    session_timeout_ms: int


class _GroupAssignmentResult(ResponseBody, frozen=True, array_like=True):
    assignment: GroupAssignment

    def result(self) -> GroupAssignment:
        return self.assignment

    @classmethod
    def from_result(cls, value: GroupAssignment) -> ResponseBody:
        return cls(value)


class JoinGroupResponse(_GroupAssignmentResult, frozen=True, array_like=True):
    api = ApiKey.JOIN_GROUP


class HeartbeatGroupRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.HEARTBEAT_GROUP
    group: str
    member_id: str
    generation: int  # the newest generation whose assignment the member has applied


class HeartbeatGroupResponse(_GroupAssignmentResult, frozen=True, array_like=True):
    api = ApiKey.HEARTBEAT_GROUP


class DeleteGroupRequest(RequestBody, frozen=True, array_like=True):
    """Remove ``group``'s committed offsets (of ``queue`` alone, if given); refused while
    the group has live members."""

    api = ApiKey.DELETE_GROUP
    group: str
    queue: str | None = None


class DeleteGroupResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.DELETE_GROUP


class LeaveGroupRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LEAVE_GROUP
    group: str
    member_id: str


class LeaveGroupResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.LEAVE_GROUP


class DescribeGroupRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_GROUP
    group: str


class DescribeGroupResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_GROUP
    group: GroupDescription

    def result(self) -> GroupDescription:
        return self.group

    @classmethod
    def from_result(cls, value: GroupDescription) -> ResponseBody:
        return cls(value)


class ListGroupsRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LIST_GROUPS


class ListGroupsResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.LIST_GROUPS
    groups: list[GroupSummary]

    def result(self) -> list[GroupSummary]:
        return list(self.groups)

    @classmethod
    def from_result(cls, value: list[GroupSummary]) -> ResponseBody:
        return cls(list(value))
