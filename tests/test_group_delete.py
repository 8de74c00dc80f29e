"""Deleting a consumer group's committed offsets (DELETE_GROUP): on every backend, refused
while the group has members, durable over a restart and a compaction, through the CLI and
over HTTP."""

from __future__ import annotations

import json

import pytest

import headwater
from headwater.errors import GroupNotEmptyError, GroupNotFoundError, InvalidArgumentError, QueueNotFoundError
from headwater.model.batch import encode_batch
from headwater.model.message import Message
from tests.support.command_line import DataCli


def _groups(hw) -> list[str]:
    return [g.group for g in hw.service.list_groups()]


def test_delete_removes_the_offsets_and_a_new_member_starts_from_the_reset_policy(hw):
    hw.admin.create_queue("q", partitions=2)
    hw.send_batch("q", [b"%d" % i for i in range(4)], partition=0)
    hw.service.commit_offsets("g", "q", {0: 3, 1: 0})
    assert "g" in _groups(hw)
    hw.admin.delete_group("g")
    assert hw.service.fetch_offsets("g", "q") == {}
    assert "g" not in _groups(hw)
    with pytest.raises(GroupNotFoundError, match="no committed offsets"):
        hw.admin.delete_group("g")
    with hw.consumer(group="g", subscribe=["q"], auto_offset_reset="earliest") as c:
        got = c.poll(timeout_ms=1000)
        assert c.position("q", 0) == 4 and [r.offset for r in got if r.partition == 0][:1] == [0]


def test_delete_on_one_queue_keeps_the_others(hw):
    for q in ("a", "b"):
        hw.admin.create_queue(q)
        hw.send(q, b"x")
        hw.service.commit_offsets("g", q, {0: 1})
    hw.admin.delete_group("g", queue="a")
    assert hw.service.fetch_offsets("g", "a") == {} and hw.service.fetch_offsets("g", "b") == {0: 1}
    with pytest.raises(GroupNotFoundError, match="on queue 'a'"):
        hw.admin.delete_group("g", queue="a")
    with pytest.raises(QueueNotFoundError):
        hw.admin.delete_group("g", queue="nope")
    with pytest.raises(InvalidArgumentError):
        hw.admin.delete_group("bad name!")


def test_delete_is_refused_while_the_group_has_members(hw):
    hw.admin.create_queue("q")
    hw.send("q", b"x")
    with hw.consumer(group="g", subscribe=["q"]) as c:
        c.poll(timeout_ms=500)
        c.commit()
        with pytest.raises(GroupNotEmptyError, match="1 live member"):
            hw.admin.delete_group("g")
        assert hw.service.fetch_offsets("g", "q") == {0: 1}
    hw.admin.delete_group("g")  # the member left with close()
    assert hw.service.fetch_offsets("g", "q") == {}


def test_the_deletion_survives_a_restart_and_a_compaction(tmp_path):
    with headwater.open(tmp_path) as hw:
        hw.admin.create_queue("q")
        hw.send("q", b"x")
        hw.service.commit_offsets("gone", "q", {0: 1})
        hw.service.commit_offsets("kept", "q", {0: 1})
        hw.admin.delete_group("gone")
    with headwater.open(tmp_path) as hw:
        assert hw.service.fetch_offsets("gone", "q") == {} and hw.service.fetch_offsets("kept", "q") == {0: 1}
        assert _groups(hw) == ["kept"]
        hw.service.commit_offsets("gone", "q", {0: 0})  # a group of that name starts afresh
        assert hw.service.fetch_offsets("gone", "q") == {0: 0}
        hw.admin.delete_group("gone")


def test_a_compacted_table_leaves_the_deleted_offsets_out(tmp_path):
    from headwater.broker.offsets import OffsetStore
    from headwater.storage import StoreConfig
    from headwater.storage.store import LogStore

    store = LogStore(tmp_path / "data", StoreConfig())
    try:
        store.create_queue("q", headwater.QueueConfig(partitions=1))
        store.append("q", 0, encode_batch([Message(b"x")]))
        offsets = OffsetStore(store, compact_ratio=1, compact_min=2)
        offsets.commit("a", "q", {0: 0})
        offsets.commit("b", "q", {0: 0})
        assert offsets.delete("a") == 1 and offsets.delete("a") == 0
        for _ in range(3):  # past compact_min: the live table is written whole
            offsets.commit("b", "q", {0: 0})
        assert offsets.fetch("a", "q") == {}
        offsets.load(0)  # read back from the log (compacted, tombstone and all)
        assert offsets.fetch("a", "q") == {} and offsets.fetch("b", "q") == {0: 0}
    finally:
        store.close()


def test_cli_group_delete(tmp_path):
    cli = DataCli(tmp_path / "data")
    cli("queue", "create", "q", "--partitions", "2")
    with headwater.open(cli.data) as hw:
        hw.send("q", b"x", partition=1)
        hw.service.commit_offsets("billing", "q", {1: 1})
    err = cli.error("group", "delete", "billing")
    assert "refusing to delete group 'billing' without confirmation" in err and "--yes" in err
    doc = json.loads(cli("group", "delete", "billing", "--yes", "--json").stdout)
    assert doc == {"action": "deleted", "group": "billing", "queue": None, "offsets": {"q": {"1": 1}}}
    assert "billing" not in cli("group", "list").stdout
    err = cli.error("group", "delete", "billing", "--yes")
    assert "there is no group 'billing'" in err


def test_http_delete_group(tmp_path):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from tests.support.http_gateway import HttpBroker

    b = HttpBroker(tmp_path / "data")
    try:
        with b.client() as api:
            assert api.post("/v1/queues", json={"name": "q"}).status_code == 201
            api.post("/v1/queues/q/messages", json={"value": "x"}).raise_for_status()
            member = api.post("/v1/groups/g/members", json={"queues": ["q"]}).json()
            base = f"/v1/groups/g/members/{member['member']}"
            api.post(f"{base}/offsets", json={"offsets": [{"queue": "q", "partition": 0, "offset": 1}]})
            refused = api.delete("/v1/groups/g")
            assert refused.status_code == 409 and refused.json()["error"]["name"] == "GroupNotEmptyError"
            api.delete(base).raise_for_status()
            assert api.delete("/v1/groups/g", params={"queue": "q"}).status_code == 204
            assert api.get("/v1/groups/g/offsets", params={"queue": "q"}).json()["offsets"] == {}
            gone = api.delete("/v1/groups/g")
            assert gone.status_code == 404 and gone.json()["error"]["name"] == "GroupNotFoundError"
    finally:
        b.stop()
