"""Changing a queue's settings after creation (ALTER_QUEUE): on every backend, checked as
creation checks them, durable over a restart, through the CLI and over HTTP; the asyncio
admin's alter_queue and delete_group."""

from __future__ import annotations

import json

import pytest

import headwater
from headwater.errors import InvalidArgumentError, MessageTooLargeError, QueueNotFoundError
from tests.support.aio_target import run
from tests.support.command_line import DataCli


def test_only_the_settings_given_change(hw):
    hw.admin.create_queue("q", partitions=2, ttl_s=3600, settings={"team": "a"})
    info = hw.admin.alter_queue("q", ttl_s=None)
    assert info.config.ttl_s is None and info.config.message_bytes_max == 1024 * 1024
    info = hw.admin.alter_queue("q", message_bytes_max=64, flush="sync")
    assert (info.config.ttl_s, info.config.message_bytes_max, info.config.flush) == (None, 64, "sync")
    assert info.config.partitions == 2 and info.config.settings == {"team": "a"}
    assert hw.admin.describe_queue("q").config == info.config
    with pytest.raises(MessageTooLargeError, match="limit is 64"):
        hw.send("q", b"x" * 65, partition=0)
    hw.send("q", b"x" * 64, partition=0)
    assert hw.admin.alter_queue("q", flush=None, ttl_s=60).config.flush is None


def test_bad_values_are_refused_as_create_refuses_them(hw):
    hw.admin.create_queue("q")
    with pytest.raises(InvalidArgumentError, match="ttl_s must be a whole number of seconds"):
        hw.admin.alter_queue("q", ttl_s=0)
    with pytest.raises(InvalidArgumentError, match="message_bytes_max must be from 1"):
        hw.admin.alter_queue("q", message_bytes_max=10**9)
    with pytest.raises(InvalidArgumentError, match="flush must be 'sync', 'async' or None"):
        hw.admin.alter_queue("q", flush="sometimes")
    with pytest.raises(InvalidArgumentError, match="nothing to alter"):
        hw.admin.alter_queue("q")
    with pytest.raises(QueueNotFoundError):
        hw.admin.alter_queue("nope", ttl_s=60)
    assert hw.admin.describe_queue("q").config == headwater.QueueConfig()  # unchanged


def test_unknown_settings_are_named(tmp_path):
    with headwater.open(tmp_path) as hw:
        hw.admin.create_queue("q")
        with pytest.raises(InvalidArgumentError, match="cannot alter 'partitions'"):
            hw.service.alter_queue("q", {"partitions": 3})


def test_the_change_survives_a_restart(tmp_path):
    with headwater.open(tmp_path) as hw:
        hw.admin.create_queue("q")
        hw.admin.alter_queue("q", ttl_s=None, message_bytes_max=1000, flush="sync")
    with headwater.open(tmp_path) as hw:
        c = hw.admin.describe_queue("q").config
        assert (c.ttl_s, c.message_bytes_max, c.flush) == (None, 1000, "sync")


def test_cli_queue_alter(tmp_path):
    cli = DataCli(tmp_path / "data")
    cli("queue", "create", "q", "--ttl", "7d")
    out = cli("queue", "alter", "q", "--ttl", "none", "--flush", "sync").stdout
    assert "7d" in out and "forever" in out and "altered queue 'q'" in out
    doc = json.loads(cli("queue", "alter", "q", "--message-bytes-max", "512", "--json").stdout)
    assert doc["action"] == "altered" and doc["info"]["message_bytes_max"] == 512 and doc["info"]["ttl_s"] is None
    assert "nothing to alter" in cli.error("queue", "alter", "q")
    assert "--ttl: 'soon' is not a duration" in cli.error("queue", "alter", "q", "--ttl", "soon")


def test_http_patch_queue(tmp_path):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from tests.support.http_gateway import HttpBroker

    b = HttpBroker(tmp_path / "data")
    try:
        with b.client() as api:
            assert api.post("/v1/queues", json={"name": "q"}).status_code == 201
            r = api.patch("/v1/queues/q", json={"ttl_s": None, "flush": "sync"})
            assert r.status_code == 200, r.text
            assert (r.json()["config"]["ttl_s"], r.json()["config"]["flush"]) == (None, "sync")
            bad = api.patch("/v1/queues/q", json={"ttl_s": -1})
            assert bad.status_code == 400 and bad.json()["error"]["name"] == "InvalidArgumentError"
            assert api.patch("/v1/queues/q", json={"partitions": 2}).status_code == 400
            assert api.patch("/v1/queues/nope", json={"ttl_s": 60}).status_code == 404
    finally:
        b.stop()


def test_the_asyncio_admin_alters_and_deletes_groups(aio_target):
    async def test(hw) -> None:
        await hw.admin.create_queue("q")
        info = await hw.admin.alter_queue("q", ttl_s=None, flush="async")
        assert (info.config.ttl_s, info.config.flush) == (None, "async")
        assert (await hw.admin.describe_queue("q")).config == info.config
        with pytest.raises(InvalidArgumentError, match="ttl_s must be"):
            await hw.admin.alter_queue("q", ttl_s=-5)
        await hw.send("q", b"x")
        await hw.service.commit_offsets("g", "q", {0: 1})
        await hw.admin.delete_group("g")
        assert await hw.service.fetch_offsets("g", "q") == {}

    run(aio_target, test)
