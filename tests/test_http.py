"""The HTTP API through a real ``headwater serve --http-port`` and a real HTTP client (httpx):
produce, scans and lookups, errors, admin, OpenAPI. Groups, shared groups, SSE and the
cluster: tests/test_http_consume.py. One server for the module."""

from __future__ import annotations

import base64
import time

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")


_names = iter(range(10_000))


@pytest.fixture
def queue(http_api):
    name = f"q{next(_names)}"
    r = http_api.post("/v1/queues", json={"name": name, "partitions": 2})
    assert r.status_code == 201, r.text
    return name


def error_of(r, status: int, name: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"code", "name", "message", "retriable"}
    assert err["name"] == name, err
    return err


def test_produce_one_and_a_batch_answer_where_each_went(http_api, queue):
    one = http_api.post(f"/v1/queues/{queue}/messages", json={"value": "hello", "key": "user-1", "tag": "greeting"})
    assert one.status_code == 200, one.text
    [receipt] = one.json()["results"]
    got = http_api.get(f"/v1/queues/{queue}/messages/{receipt['id']}").json()
    assert (got["value"], got["key"], got["tag"], got["partition"], got["offset"]) == (
        "hello",
        "user-1",
        "greeting",
        receipt["partition"],
        receipt["offset"],
    )
    batch = [{"value": f"m{i}", "partition": i % 2, "properties": {"n": str(i)}} for i in range(10)]
    results = http_api.post(f"/v1/queues/{queue}/messages", json={"messages": batch}).json()["results"]
    assert [r["partition"] for r in results] == [i % 2 for i in range(10)]
    for i, r in enumerate(results):  # each receipt names its own message, in the order sent
        rec = http_api.get(f"/v1/queues/{queue}/messages/{r['id']}").json()
        assert (rec["value"], rec["properties"], rec["offset"]) == (f"m{i}", {"n": str(i)}, r["offset"])


def test_binary_values_and_keys_travel_as_base64(http_api, queue):
    body, key = bytes(range(256)), b"\xff\x00key"
    msg = {"value": base64.b64encode(body).decode(), "encoding": "base64", "partition": 1}
    msg |= {"key": base64.b64encode(key).decode(), "key_encoding": "base64"}
    [r] = http_api.post(f"/v1/queues/{queue}/messages", json=msg).json()["results"]
    rec = http_api.get(f"/v1/queues/{queue}/messages/{r['id']}").json()
    assert rec["encoding"] == "base64" and base64.b64decode(rec["value"]) == body
    assert rec["key_encoding"] == "base64" and base64.b64decode(rec["key"]) == key
    text = http_api.post(f"/v1/queues/{queue}/messages", json={"value": "plain", "partition": 1}).json()["results"][0]
    forced = http_api.get(f"/v1/queues/{queue}/messages/{text['id']}", params={"encoding": "base64"}).json()
    assert forced["encoding"] == "base64" and base64.b64decode(forced["value"]) == b"plain"


def test_delayed_messages_are_scheduled_then_cancelled(http_api, queue):
    later = int(time.time() * 1000) + 3_600_000
    msgs = [{"value": "in an hour", "deliver_at_ms": later}, {"value": "in a minute", "delay_ms": 60_000}]
    results = http_api.post(f"/v1/queues/{queue}/messages", json={"messages": msgs}).json()["results"]
    assert all(r["delayed"] and r["offset"] is None for r in results)
    assert http_api.get(f"/v1/queues/{queue}/messages/{results[0]['id']}").json()["value"] == "in an hour"
    assert http_api.get("/v1/delays/stats").json()["pending_messages"] >= 2
    assert http_api.delete(f"/v1/delays/{results[0]['id']}").status_code == 204
    assert http_api.delete(f"/v1/delays/{results[1]['id']}").status_code == 204
    assert http_api.get(f"/v1/queues/{queue}").json()["partitions"][0]["end_offset"] == 0  # nothing delivered


def test_a_deliver_time_in_seconds_is_answered_with_a_warning(http_api, queue):
    """deliver_at_ms=time.time() (seconds where milliseconds are meant) is a moment in 1970:
    the message goes at once, as a client's does, and the answer says why (the client's
    warning went to the gateway's own log, where the caller never sees it)."""
    msgs = [{"value": "now-ish", "deliver_at_ms": int(time.time())}, {"value": "plain"}]
    answer = http_api.post(f"/v1/queues/{queue}/messages", json={"messages": msgs}).json()
    assert [r.get("delayed", False) for r in answer["results"]] == [False, False]  # both stored at once
    [warning] = answer["warnings"]
    assert warning.startswith("$.messages[0].deliver_at_ms=") and "looks like epoch seconds" in warning
    assert "warnings" not in http_api.post(f"/v1/queues/{queue}/messages", json={"value": "x"}).json()


def test_scan_a_partition_by_offset_id_and_time(http_api, queue):
    results = http_api.post(
        f"/v1/queues/{queue}/messages", json={"messages": [{"value": f"v{i}", "partition": 0} for i in range(20)]}
    ).json()["results"]
    page = http_api.get(f"/v1/queues/{queue}/partitions/0/messages", params={"offset": 5, "max": 10}).json()
    assert [r["value"] for r in page["records"]] == [f"v{i}" for i in range(5, 15)]
    assert page["next_offset"] == 15
    by_id = http_api.get(f"/v1/queues/{queue}/partitions/0/messages", params={"id": results[18]["id"]}).json()
    assert [r["value"] for r in by_id["records"]] == ["v18", "v19"]
    first_ms = http_api.get(f"/v1/queues/{queue}/messages/{results[0]['id']}").json()["timestamp_ms"]
    by_time = http_api.get(f"/v1/queues/{queue}/partitions/0/messages", params={"time_ms": first_ms, "max": 3}).json()
    assert [r["value"] for r in by_time["records"]] == ["v0", "v1", "v2"]
    after = http_api.get(f"/v1/queues/{queue}/partitions/0/offset", params={"time_ms": first_ms + 10**9}).json()
    assert after == {"partition": 0, "offset": 20}
    everything = http_api.get(f"/v1/queues/{queue}/messages", params={"start_time_ms": first_ms}).json()["records"]
    assert len(everything) == 20


def test_find_by_key_and_filter_by_tag(http_api, queue):
    msgs = [{"value": f"o{i}", "key": f"customer-{i % 3}", "tag": "paid" if i % 2 else "new"} for i in range(12)]
    http_api.post(f"/v1/queues/{queue}/messages", json={"messages": msgs}).raise_for_status()
    found = http_api.get(f"/v1/queues/{queue}/messages", params={"key": "customer-1"}).json()["records"]
    assert sorted(r["value"] for r in found) == sorted(f"o{i}" for i in range(12) if i % 3 == 1)
    paid = http_api.get(f"/v1/queues/{queue}/messages", params={"tags": "paid"}).json()["records"]
    assert sorted(r["value"] for r in paid) == sorted(f"o{i}" for i in range(12) if i % 2)


def test_errors_have_the_binary_protocols_codes_and_fitting_statuses(http_api, queue):
    assert error_of(http_api.get("/v1/queues/nope"), 404, "QueueNotFoundError")["code"] == 7
    assert error_of(http_api.post("/v1/queues/nope/messages", json={"value": "x"}), 404, "QueueNotFoundError")
    assert error_of(http_api.post("/v1/queues", json={"name": queue}), 409, "QueueExistsError")["code"] == 8
    err = error_of(http_api.get(f"/v1/queues/{queue}/partitions/9/messages"), 400, "PartitionOutOfRangeError")
    assert err["code"] == 4 and err["retriable"] is False
    err = error_of(
        http_api.get(f"/v1/queues/{queue}/messages/00000001-00000000-00000000000f4240"), 404, "MessageNotFoundError"
    )
    assert err["code"] == 11
    assert error_of(http_api.get(f"/v1/queues/{queue}/messages/not-an-id"), 400, "InvalidMessageIdError")["code"] == 6
    big = {"value": "x" * (1024 * 1024 + 1)}
    assert error_of(http_api.post(f"/v1/queues/{queue}/messages", json=big), 413, "MessageTooLargeError")["code"] == 5


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"messages": [{"value": 3}]}', "$.messages[0].value"),
        (b'{"messages": [{"key": "k"}]}', "missing required field `value`"),
        (b'{"value": "x", "colour": "red"}', "unknown field `colour`"),
        (b'{"value": "%%%", "encoding": "base64"}', "$.value is not valid base64"),
        (b'{"value": "x", "key": "!", "key_encoding": "base64"}', "$.key is not valid base64"),
        (b'{"value": "x", "encoding": "rot13"}', "encoding must be one of utf-8, base64"),
        (b'{"messages": []}', "messages is empty"),
        (b'{"value": "x", "delay_ms": 5, "deliver_at_ms": 5}', "delay_ms or deliver_at_ms, not both"),
        (b"", "not valid JSON"),
    ],
)
def test_bad_produce_bodies_are_400_naming_the_field(http_api, queue, body, names):
    r = http_api.post(f"/v1/queues/{queue}/messages", content=body, headers={"content-type": "application/json"})
    err = error_of(r, 400, "InvalidArgumentError")
    assert names in err["message"] and err["code"] == 2


def test_bad_query_parameters_name_the_parameter(http_api, queue):
    err = error_of(
        http_api.get(f"/v1/queues/{queue}/partitions/0/messages", params={"offset": "x"}), 400, "InvalidArgumentError"
    )
    assert "offset" in err["message"]
    err = error_of(
        http_api.get(f"/v1/queues/{queue}/partitions/0/messages", params={"max": 0}), 400, "InvalidArgumentError"
    )
    assert "max must be at least 1" in err["message"]
    assert error_of(http_api.get("/v1/nothing-here"), 404, "NotFound")["code"] == 1
    assert error_of(http_api.put("/v1/queues"), 405, "MethodNotAllowed")


EVIL = "https://evil.example"


def test_a_web_pages_simple_requests_are_refused(http_api, queue):
    """What any page an operator visits can make a browser send without asking first
    (no preflight): a POST of text/plain, cross-origin, or under a rebound name."""
    url = http_api.base_url
    # DNS rebinding: the page's own name, re-pointed at 127.0.0.1, with a matching Origin
    rebound = {"Host": "evil.example", "Origin": EVIL, "Content-Type": "text/plain"}
    err = error_of(http_api.post(f"/v1/queues/{queue}/truncate", headers=rebound), 403, "HostNotAllowed")
    assert "'evil.example'" in err["message"] and "--http-allowed-host evil.example" in err["message"]
    # cross-origin: the gateway's own Host, another site's Origin
    err = error_of(http_api.post(f"/v1/queues/{queue}/truncate", headers={"Origin": EVIL}), 403, "OriginNotAllowed")
    assert EVIL in err["message"]
    assert error_of(http_api.get("/v1/queues", headers={"Origin": "null"}), 403, "OriginNotAllowed")
    # a body not declared JSON: what a form or a no-cors fetch sends
    for body_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {} if body_type is None else {"Content-Type": body_type}
        r = http_api.post("/v1/queues", content=b'{"name": "made_by_a_page"}', headers=headers)
        err = error_of(r, 415, "UnsupportedMediaType")
        assert "Content-Type: application/json" in err["message"]
    error_of(
        http_api.post(f"/v1/queues/{queue}/truncate", headers={"Content-Type": "text/plain"}),
        415,
        "UnsupportedMediaType",
    )
    assert http_api.get("/v1/queues/made_by_a_page").status_code == 404
    # none of it truncated anything, and what the gateway's own clients send passes
    http_api.post(f"/v1/queues/{queue}/messages", json={"value": "kept", "partition": 0}).raise_for_status()
    same_site = {"Origin": str(url).rstrip("/"), "Content-Type": "application/json; charset=utf-8"}
    r = http_api.post(f"/v1/queues/{queue}/messages", content=b'{"value": "x", "partition": 0}', headers=same_site)
    assert r.status_code == 200, r.text
    for host in ("localhost", "127.0.0.1", f"localhost:{url.port}"):
        assert http_api.get(f"/v1/queues/{queue}", headers={"Host": host}).status_code == 200
    assert http_api.get(f"/v1/queues/{queue}").json()["partitions"][0]["end_offset"] == 2


def test_an_allowed_host_names_the_gateway(tmp_path):
    from tests.support.http_gateway import HttpBroker

    broker = HttpBroker(tmp_path / "data", "--http-allowed-host", "hw.corp.example")
    try:
        with broker.client() as api:
            headers = {"Host": "hw.corp.example:8080", "Origin": "http://hw.corp.example:8080"}
            r = api.post("/v1/queues", json={"name": "named"}, headers=headers)
            assert r.status_code == 201, r.text
            error_of(api.get("/v1/queues", headers={"Host": "other.corp.example"}), 403, "HostNotAllowed")
    finally:
        broker.stop()


def test_out_of_range_numbers_unknown_encodings_and_unknown_parameters_are_400(http_api, queue):
    """Each was ignored, and the answer looked right: 200 with no records."""
    scan = f"/v1/queues/{queue}/partitions/0/messages"
    for params, says in [
        ({"offset": "99999999999999999999999"}, "query parameter offset must be at most 9223372036854775807"),
        ({"time_ms": str(2**64)}, "query parameter time_ms must be at most"),
        ({"offset": 0, "encoding": "rot13"}, "query parameter encoding must be base64 or utf-8, got 'rot13'"),
        ({"offset": 0, "bogus": 1}, "unknown query parameter bogus for GET /v1/queues/{queue}/partitions"),
        ({"ofset": 5, "colour": "red"}, "unknown query parameters colour, ofset"),
    ]:
        err = error_of(http_api.get(scan, params=params), 400, "InvalidArgumentError")
        assert says in err["message"], err
    err = error_of(http_api.get("/v1/queues", params={"prefix": "q"}), 400, "InvalidArgumentError")
    assert "it takes none" in err["message"]
    for path in (f"/v1/queues/{queue}/messages", f"/v1/queues/{queue}/events"):
        err = error_of(http_api.get(path, params={"encoding": "hex"}), 400, "InvalidArgumentError")
        assert "encoding" in err["message"]
    # an offset past the end is no error: no records, and next_offset says where the end is
    http_api.post(f"/v1/queues/{queue}/messages", json={"value": "x", "partition": 0}).raise_for_status()
    page = http_api.get(scan, params={"offset": 999_999, "encoding": "utf-8"}).json()
    assert page == {"records": [], "next_offset": 1}


def test_admin_of_queues(http_api):
    r = http_api.post(
        "/v1/queues", json={"name": "adm", "partitions": 1, "ttl_s": None, "settings": {"team": "billing"}}
    )
    assert r.status_code == 201 and r.json()["config"]["ttl_s"] is None
    assert http_api.post("/v1/queues", json={"name": "adm", "exist_ok": True}).status_code == 201
    assert "adm" in [q["name"] for q in http_api.get("/v1/queues").json()["queues"]]
    http_api.post("/v1/queues/adm/messages", json={"messages": [{"value": "x"}] * 3}).raise_for_status()
    grown = http_api.post("/v1/queues/adm/partitions", json={"partitions": 3}).json()
    assert len(grown["partitions"]) == 3
    truncated = http_api.post("/v1/queues/adm/truncate").json()
    assert truncated["partitions"][0]["start_offset"] == 3 and truncated["config"]["settings"] == {"team": "billing"}
    assert http_api.post("/v1/queues/adm/disable").json()["enabled"] is False
    error_of(http_api.post("/v1/queues/adm/messages", json={"value": "x"}), 409, "QueueDisabledError")
    assert http_api.post("/v1/queues/adm/enable").json()["enabled"] is True
    assert http_api.delete("/v1/queues/adm").status_code == 204
    error_of(http_api.delete("/v1/queues/adm"), 404, "QueueNotFoundError")
    assert http_api.delete("/v1/queues/adm", params={"missing_ok": "true"}).status_code == 204
    error_of(http_api.post("/v1/queues", json={"name": "bad name!"}), 400, "InvalidQueueNameError")
    assert http_api.get("/v1/status").json()["version"]


def test_admin_of_subscribers(http_api, queue):
    r = http_api.post(f"/v1/queues/{queue}/subscribers", json={"name": "audit", "start": "earliest", "tags": ["paid"]})
    assert r.status_code == 201, r.text
    assert [s["name"] for s in http_api.get("/v1/subscribers", params={"queue": queue}).json()["subscribers"]] == [
        "audit"
    ]
    assert http_api.get(f"/v1/queues/{queue}/subscribers/audit").json()["name"] == "audit"
    error_of(http_api.post(f"/v1/queues/{queue}/subscribers", json={"name": "audit"}), 409, "SubscriberExistsError")
    assert http_api.delete(f"/v1/queues/{queue}/subscribers/audit").status_code == 204
    error_of(http_api.get(f"/v1/queues/{queue}/subscribers/audit"), 404, "SubscriberNotFoundError")


def test_openapi_lists_every_route_and_the_docs_page_lists_them(http_api):
    spec = http_api.get("/v1/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    produce = spec["paths"]["/v1/queues/{queue}/messages"]["post"]
    ref = produce["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/ProduceBatch"
    assert "value" in spec["components"]["schemas"]["MessageIn"]["properties"]
    operations = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    assert ("GET", "/v1/queues/{queue}/events") in operations and ("POST", "/v1/groups/{group}/members") in operations
    page = http_api.get("/v1/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for _, path in operations:  # each operation the schema names is on the page, and served
        assert path in page.text
    assert "http://" not in page.text.replace("http://127.0.0.1", "")  # nothing fetched from elsewhere


def test_serve_without_the_http_extra_says_what_to_install(tmp_path):
    import subprocess
    import sys

    hide = "import sys; sys.modules['starlette'] = None; from headwater.cli.main import main; sys.exit(main())"
    out = subprocess.run(
        [sys.executable, "-c", hide, "serve", "--data", str(tmp_path / "d"), "--port", "0", "--http-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "pip install 'headwater[http]'" in out.stderr and "starlette" in out.stderr, out.stderr
    assert not (tmp_path / "d").exists()  # nothing was made for a start that could not happen


def test_the_gateway_runs_alone_in_front_of_a_broker(http_broker):
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "headwater.http", "--server", f"127.0.0.1:{http_broker.port}", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("http listening 127.0.0.1:"), proc.stderr.read().decode() if not line else line
        with httpx.Client(base_url=f"http://127.0.0.1:{int(line.rsplit(':', 1)[1])}") as http_api:
            names = {q["name"] for q in http_api.get("/v1/queues").json()["queues"]}
            assert names == {q["name"] for q in httpx.get(f"{http_broker.url}/v1/queues").json()["queues"]}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_the_gateway_alone_says_in_one_line_that_its_broker_is_unreachable():
    """It printed about 100 lines of uvicorn startup tracebacks and exited 3."""
    import subprocess
    import sys

    from tests.support.broker_process import free_port

    nobody = f"127.0.0.1:{free_port()}"
    out = subprocess.run(
        [sys.executable, "-m", "headwater.http", "--server", nobody, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1, out
    assert out.stderr.splitlines() == [
        f"error: cannot reach the broker at {nobody} ([Errno 111] Connection refused); "
        "is 'headwater serve' running there?"
    ], out.stderr
    assert out.stdout == ""


def test_metrics_are_served_at_slash_metrics_for_prometheus(http_api, queue):
    from prometheus_client.parser import text_string_to_metric_families

    batch = [{"value": f"m{i}", "partition": 0} for i in range(7)]
    assert http_api.post(f"/v1/queues/{queue}/messages", json={"messages": batch}).status_code == 200
    r = http_api.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    produced = [s.value for s in families["headwater_messages_in"].samples if s.labels.get("queue") == queue]
    assert produced == [7.0]
