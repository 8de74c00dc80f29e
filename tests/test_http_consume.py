"""Consuming over the HTTP API through a real server and httpx: consumer group members (join,
long poll, commit, leave, expiry), group admin, shared groups (receive, ack, nack), the SSE
stream and its resume, and the gateway on a cluster."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from tests.support.cluster import eventually  # noqa: E402 - after the skips

_names = iter(range(10_000))


@pytest.fixture
def queue(http_api):
    name = f"c{next(_names)}"
    assert http_api.post("/v1/queues", json={"name": name, "partitions": 3}).status_code == 201
    return name


def produce(http_api, queue: str, n: int, start: int = 0) -> None:
    msgs = [{"value": f"m{i}", "key": f"k{i}"} for i in range(start, start + n)]
    http_api.post(f"/v1/queues/{queue}/messages", json={"messages": msgs}).raise_for_status()


def test_a_group_member_polls_commits_and_leaves(http_api, queue):
    produce(http_api, queue, 30)
    r = http_api.post("/v1/groups/billing/members", json={"queues": [queue]})
    assert r.status_code == 201, r.text
    member = r.json()
    assert len(member["assignment"]) == 3 and member["member_id"]
    base = f"/v1/groups/billing/members/{member['member']}"
    got: list[str] = []
    eventually(
        lambda: (
            got.extend(
                x["value"] for x in http_api.get(f"{base}/records", params={"timeout_ms": 500}).json()["records"]
            )
            or len(got) >= 30
        )
    )
    assert sorted(got) == sorted(f"m{i}" for i in range(30))
    committed = http_api.post(f"{base}/offsets").json()["committed"]
    assert sum(c["offset"] for c in committed) == 30
    offsets = http_api.get("/v1/groups/billing/offsets", params={"queue": queue}).json()["offsets"]
    assert sum(offsets.values()) == 30
    # a long poll waits for what arrives meanwhile
    threading.Timer(0.3, produce, (http_api, queue, 1, 100)).start()
    t0 = time.monotonic()
    waited = http_api.get(f"{base}/records", params={"timeout_ms": 10_000}).json()["records"]
    assert [x["value"] for x in waited] == ["m100"] and time.monotonic() - t0 < 9
    assert http_api.get(f"{base}").json()["generation"] == member["generation"]
    desc = http_api.get("/v1/groups/billing").json()
    assert [m["member_id"] for m in desc["members"]] == [member["member_id"]]
    assert "billing" in [g["group"] for g in http_api.get("/v1/groups").json()["groups"]]
    assert http_api.delete(base).status_code == 204
    assert http_api.get(f"{base}/records").status_code == 404
    assert http_api.get(f"{base}/records").json()["error"]["name"] == "UnknownMemberError"


def test_explicit_commits_and_a_reset_with_dry_run(http_api, queue):
    produce(http_api, queue, 9)
    member = http_api.post("/v1/groups/audit/members", json={"queues": [queue]}).json()
    base = f"/v1/groups/audit/members/{member['member']}"
    offsets = [{"queue": queue, "partition": p, "offset": 1} for p in range(3)]
    assert http_api.post(f"{base}/offsets", json={"offsets": offsets}).status_code == 200
    assert http_api.get("/v1/groups/audit/offsets", params={"queue": queue}).json()["offsets"] == {
        "0": 1,
        "1": 1,
        "2": 1,
    }
    refused = http_api.post("/v1/groups/audit/reset", json={"queue": queue, "to": "earliest"})
    assert refused.status_code == 409 and refused.json()["error"]["name"] == "GroupNotEmptyError"
    http_api.delete(base).raise_for_status()
    plan = http_api.post("/v1/groups/audit/reset", json={"queue": queue, "to": "latest", "dry_run": True}).json()
    assert [row["before"] for row in plan["offsets"]] == [1, 1, 1] and plan["dry_run"]
    assert http_api.get("/v1/groups/audit/offsets", params={"queue": queue}).json()["offsets"] == {
        "0": 1,
        "1": 1,
        "2": 1,
    }
    done = http_api.post("/v1/groups/audit/reset", json={"queue": queue, "to": "earliest"}).json()
    assert [row["after"] for row in done["offsets"]] == [0, 0, 0]
    bad = http_api.post("/v1/groups/audit/members", json={"queues": queue})
    assert bad.status_code == 400 and "$.queues" in bad.json()["error"]["message"]


def test_an_idle_member_expires_and_leaves_its_group(http_api, queue):
    member = http_api.post("/v1/groups/idle/members", json={"queues": [queue], "idle_timeout_ms": 1000}).json()

    def gone() -> bool:  # a group left with no members and no offsets is not found at all
        r = http_api.get("/v1/groups/idle")
        return r.status_code == 404 or not r.json()["members"]

    eventually(gone, what="the idle member to leave")
    r = http_api.get(f"/v1/groups/idle/members/{member['member']}/records")
    assert r.status_code == 404 and r.json()["error"]["code"] == 61


def test_shared_group_receive_ack_nack(http_api, queue):
    produce(http_api, queue, 6)
    base = f"/v1/shared/mailers/queues/{queue}"
    got: list[dict] = []
    eventually(
        lambda: (
            got.extend(
                http_api.post(f"{base}/receive", json={"max_messages": 10, "timeout_ms": 500}).json()["deliveries"]
            )
            or len(got) >= 6
        )
    )
    assert sorted(d["value"] for d in got) == sorted(f"m{i}" for i in range(6))
    assert all(d["lease_id"] and d["attempt"] == 1 for d in got)
    acked = http_api.post(f"{base}/ack", json={"lease_ids": [d["lease_id"] for d in got[:5]]}).json()
    assert acked == {"acked": 5}
    http_api.post(f"{base}/nack", json={"lease_ids": [got[5]["lease_id"]], "delay_ms": 0}).raise_for_status()
    again = eventually(lambda: http_api.post(f"{base}/receive", json={"timeout_ms": 500}).json()["deliveries"])
    assert [(d["value"], d["attempt"]) for d in again] == [(got[5]["value"], 2)]
    twice = http_api.post(f"{base}/ack", json={"lease_ids": [got[0]["lease_id"]]})
    assert twice.status_code == 409 and twice.json()["error"]["name"] == "LeaseExpiredError"
    http_api.post(f"{base}/ack", json={"lease_ids": [again[0]["lease_id"]]}).raise_for_status()
    info = http_api.get(base).json()
    assert info["group"] == "mailers"
    bad = http_api.post(f"{base}/ack", json={"lease": []})
    assert bad.status_code == 400 and "lease" in bad.json()["error"]["message"]


def read_events(client, url: str, count: int, headers: dict | None = None) -> tuple[list[dict], str | None]:
    """Up to ``count`` record events of an SSE stream, then disconnect: (records, last id)."""
    records, last_id, event = [], None, {}
    with client.stream("GET", url, headers=headers or {}, timeout=20) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("id: "):
                event["id"] = line[4:]
            elif line.startswith("data: "):
                event["data"] = json.loads(line[6:])
            elif line == "" and event:
                last_id = event.get("id", last_id)
                if "data" in event:
                    records.append(event["data"])
                event = {}
                if len(records) >= count:
                    break
    return records, last_id


def test_sse_resumes_after_a_disconnect_with_no_gap_and_no_repeat(http_broker, http_api, queue):
    produce(http_api, queue, 40)
    with http_broker.client() as c:
        first, last_id = read_events(c, f"/v1/queues/{queue}/events?from=earliest", 15)
    assert len(first) == 15 and last_id.count(":") == 3
    threading.Timer(0.3, produce, (http_api, queue, 20, 40)).start()  # more arrive while it streams
    with http_broker.client() as c:
        rest, _ = read_events(c, f"/v1/queues/{queue}/events", 45, headers={"Last-Event-ID": last_id})
    seen = [(r["partition"], r["offset"]) for r in first + rest]
    assert len(seen) == len(set(seen)) == 60  # no repeat
    assert sorted(r["value"] for r in first + rest) == sorted(f"m{i}" for i in range(60))  # no gap
    for p in range(3):  # each partition in order
        offsets = [o for q, o in seen if q == p]
        assert offsets == sorted(offsets)


def test_sse_starts_where_asked_and_ends_after_max_events(http_api, queue):
    produce(http_api, queue, 6)
    end = {str(p["partition"]): p["end_offset"] for p in http_api.get(f"/v1/queues/{queue}").json()["partitions"]}
    threading.Timer(0.5, produce, (http_api, queue, 1, 99)).start()
    r = http_api.get(f"/v1/queues/{queue}/events", params={"from": "latest", "max_events": 1})
    assert [json.loads(x[6:])["value"] for x in r.text.splitlines() if x.startswith("data: ")] == ["m99"]
    positions = ",".join(f"{p}:{o}" for p, o in end.items())
    r = http_api.get(f"/v1/queues/{queue}/events", params={"from": positions, "max_events": 1})
    assert "m99" in r.text
    bad = http_api.get(f"/v1/queues/{queue}/events", params={"from": "yesterday"})
    assert bad.status_code == 400 and "from" in bad.json()["error"]["message"]
    assert http_api.get("/v1/queues/nope/events").status_code == 404


def test_through_one_brokers_http_every_partition_of_a_cluster(cluster, tmp_path):
    """The gateway routes: produced through broker 1's HTTP, the messages land on every
    partition, whichever broker leads it, and read back through the same HTTP."""
    from headwater.http.server import HttpServer

    b1 = cluster.brokers[1]
    server = HttpServer(f"127.0.0.1:{b1.port}", port=0)
    server.start()
    try:
        port = server.wait_started()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http_api:
            assert http_api.post("/v1/queues", json={"name": "spread", "partitions": 6}).status_code == 201
            msgs = [{"value": f"v{i}", "partition": i % 6} for i in range(60)]
            results = http_api.post("/v1/queues/spread/messages", json={"messages": msgs}).json()["results"]
            assert sorted({r["partition"] for r in results}) == list(range(6))
            for p in range(6):
                page = http_api.get(f"/v1/queues/spread/partitions/{p}/messages", params={"offset": 0}).json()
                assert [r["value"] for r in page["records"]] == [f"v{i}" for i in range(p, 60, 6)]
            md = http_api.get("/v1/cluster", params={"queues": "spread"}).json()
            [q] = md["queues"]
            assert len({p["leader"] for p in q["partitions"]}) > 1, md  # not all on broker 1
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("start", "says"),
    [
        ({"from": "0:999"}, "offset 999 of partition 0 is past its end (2)"),
        ({"from": "9:0"}, "from names partition 9"),
        ({"from": "0:-5"}, "offset -5 of partition 0 is negative"),
        ({"last_event_id": "0:2,1:999,2:0"}, "Last-Event-ID: offset 999 of partition 1 is past its end"),
    ],
)
def test_sse_refuses_a_start_the_queue_cannot_have_before_streaming(http_api, queue, start, says):
    """A 400 before the stream starts (an EventSource does not retry it), not a 200 cut
    short with a traceback in the broker's log."""
    msgs = [{"value": f"v{i}", "partition": p} for p in range(3) for i in range(2)]
    http_api.post(f"/v1/queues/{queue}/messages", json={"messages": msgs}).raise_for_status()
    r = http_api.get(f"/v1/queues/{queue}/events", params={**start, "max_events": 1}, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["name"] == "InvalidArgumentError" and says in err["message"], err
    r = http_api.get(f"/v1/queues/{queue}/events", params={"from": "0:2,1:0", "max_events": 1}, timeout=10)
    assert r.status_code == 200 and '"value":"v0"' in r.text  # the end itself is a start


def test_sse_of_a_queue_deleted_meanwhile_ends_with_an_error_event(http_broker, http_api, queue):
    produce(http_api, queue, 1)
    lines: list[str] = []
    with http_broker.client() as c:
        with c.stream("GET", f"/v1/queues/{queue}/events", params={"keepalive_ms": 200}, timeout=30) as r:
            for line in r.iter_lines():  # ends when the server ends the stream
                lines.append(line)
                if line.startswith("data: ") and '"m0"' in line:
                    assert http_api.delete(f"/v1/queues/{queue}").status_code == 204
    at = lines.index("event: error")
    error = json.loads(lines[at + 1].removeprefix("data: "))["error"]
    assert error["name"] == "QueueNotFoundError" and queue in error["message"], error
    assert lines[at + 2 :] == [""]  # the last event: the stream ended after it, cleanly
    assert "response already started" not in http_broker.log.read_text()


def test_a_reset_means_what_the_clis_group_reset_means(http_broker, http_api, queue):
    """The same spelling of ``to`` puts each partition where ``headwater group reset --to``
    puts it: ``5`` is offset 5 (it was once taken as epoch ms 5: every partition's start)."""
    import subprocess

    from tests.support.broker_process import HEADWATER

    msgs = [{"value": f"v{p}.{i}", "partition": p} for p in range(3) for i in range(10)]
    results = http_api.post(f"/v1/queues/{queue}/messages", json={"messages": msgs}).json()["results"]
    an_id = results[13]["id"]  # partition 1, offset 3
    for to, partitions, expected in [
        (5, None, {0: 5, 1: 5, 2: 5}),
        (99, None, {0: 10, 1: 10, 2: 10}),  # past the end: the end (it was refused over HTTP alone)
        ("7", "2", {2: 7}),
        ("-4", None, {0: 6, 1: 6, 2: 6}),
        ("latest", None, {0: 10, 1: 10, 2: 10}),
        (an_id, None, {1: 3}),
        ("2000-01-01T00:00:00Z", None, {0: 0, 1: 0, 2: 0}),
        ("now", "0,1", {0: 10, 1: 10}),
    ]:
        body = {"queue": queue, "to": to, "dry_run": True}
        if partitions is not None:
            body["partitions"] = [int(p) for p in partitions.split(",")]
        r = http_api.post("/v1/groups/resets/reset", json=body)
        assert r.status_code == 200, r.text
        over_http = {row["partition"]: row["after"] for row in r.json()["offsets"]}
        argv = [HEADWATER, "--server", f"127.0.0.1:{http_broker.port}", "group", "reset", "resets"]
        argv += ["--queue", queue, "--to", str(to), "--json"] + ([] if partitions is None else ["-p", partitions])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        by_cli = {row["partition"]: row["new"] for row in json.loads(out.stdout)["partitions"]}
        assert over_http == by_cli == expected, (to, over_http, by_cli)
        if to == 99:
            assert {row["requested"] for row in r.json()["offsets"]} == {99}
    exact = http_api.post("/v1/groups/resets/reset", json={"queue": queue, "offsets": {"0": 99}})
    assert exact.status_code == 400 and "99" in exact.json()["error"]["message"], exact.text
    bad = http_api.post("/v1/groups/resets/reset", json={"queue": queue, "to": "sideways"})
    assert bad.status_code == 400 and "to: 'sideways'" in bad.json()["error"]["message"]
    done = http_api.post("/v1/groups/resets/reset", json={"queue": queue, "to": 5})  # executes by default
    assert [row["after"] for row in done.json()["offsets"]] == [5, 5, 5] and not done.json()["dry_run"]
    assert http_api.get("/v1/groups/resets/offsets", params={"queue": queue}).json()["offsets"] == {
        "0": 5,
        "1": 5,
        "2": 5,
    }


def test_a_shared_consumer_session_ends_by_delete_and_frees_its_place(http_broker, queue):
    """Distinct members once filled the gateway's sessions until they expired (300 s), and
    there was no DELETE for a shared consumer (405)."""
    from headwater.http.app import GatewaySettings
    from headwater.http.server import HttpServer

    server = HttpServer(f"127.0.0.1:{http_broker.port}", port=0, settings=GatewaySettings(sessions_max=2))
    server.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.wait_started()}", timeout=30) as api:
            base = f"/v1/shared/workers/queues/{queue}"
            produce(api, queue, 1)

            def receive(member: str) -> httpx.Response:
                return api.post(f"{base}/receive", json={"max_messages": 1, "timeout_ms": 0, "member": member})

            assert receive("a").status_code == 200 and receive("b").status_code == 200
            full = receive("c")
            assert full.status_code == 503, full.text
            assert "DELETE /v1/shared/{group}/queues/{queue}/members/{member}" in full.json()["error"]["message"]
            assert api.delete(f"{base}/members/a").status_code == 204
            assert receive("c").status_code == 200
            gone = api.delete(f"{base}/members/a")
            assert gone.status_code == 404 and gone.json()["error"]["name"] == "UnknownMemberError", gone.text
    finally:
        server.stop()


def test_an_sse_start_on_a_cluster_partition_whose_leader_is_down_is_not_taken_for_past_its_end():
    """On a cluster a partition whose leader is out of reach describes as offline (its
    offsets unknown, given as 0..0): a resume at offset 7 there starts at 7 (its first read
    at the leader checks it), not a 400 "past its end"; latest needs its end: 503."""
    import asyncio

    from headwater.errors import UnavailableError
    from headwater.http.events import _start_positions
    from headwater.model.config import PartitionInfo, QueueConfig, QueueInfo

    info = QueueInfo(
        name="q", queue_id=1, config=QueueConfig(partitions=2), enabled=True, created_ms=0,
        partitions=[PartitionInfo(0, 2, 9), PartitionInfo(1, 0, 0, online=False)],
    )  # fmt: skip

    class Admin:
        async def describe_queue(self, name):
            return info

    class Client:
        admin = Admin()

    got = asyncio.run(_start_positions(Client(), "q", None, "0:5,1:7", "Last-Event-ID"))
    assert got == {0: 5, 1: 7}
    assert asyncio.run(_start_positions(Client(), "q", None, "earliest", "from")) == {0: 2, 1: 0}
    with pytest.raises(UnavailableError, match=r"q\[1\]"):
        asyncio.run(_start_positions(Client(), "q", None, "latest", "from"))
