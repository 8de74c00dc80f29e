"""The web console at ``/`` in a real headless Chromium against a real ``headwater serve
--http-port``: every page shows the data the test made, a message browse by offset and by
key, exports read back from the downloaded files, a dead letter re-driven and found in its
source queue, an offset reset dry-run then executed; a screenshot of each page is looked at
(the window's size, not blank) and saved under the test's tmp dir."""

from __future__ import annotations

import csv
import io
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from tests.support.browser import browser, open_page, screenshot, wait_for, wait_rendered  # noqa: E402, F401 - fixture
from tests.support.http_gateway import HttpBroker  # noqa: E402

ORDERS = [  # partition 0 of "orders", in offset order
    {"value": "first order", "key": "customer-1", "tag": "paid", "properties": {"source": "web"}},
    {"value": '{"id": 2, "note": "comma, and \\"quotes\\""}', "key": "customer-2", "tag": "new"},
    {"value": "third order\nwith a line break", "key": "customer-1", "tag": "paid", "properties": {"a": "1", "b": "2"}},
]
BINARY_B64 = "AAEC/w=="  # partition 1: bytes 00 01 02 ff


class Console:
    """The gateway under test, the data made through its API, and the browser on it."""

    def __init__(self, gateway: HttpBroker, driver: Any, shots: Path) -> None:
        self.gateway, self.driver, self.shots = gateway, driver, shots
        self.http = gateway.client()
        self.url = gateway.url + "/"

    def api(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        r = self.http.request(method, "/v1" + path, json=body)
        assert r.status_code in ok, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def open(self, route: str) -> None:
        open_page(self.driver, self.url + "#/" + route)

    def text(self, css: str = "main") -> str:
        return self.driver.find_element("css selector", css).text

    def wait_text(self, needle: str, css: str = "main") -> None:
        wait_for(f"{needle!r} in {css}", lambda: needle in self.text(css))

    def click(self, css: str) -> None:
        self.driver.find_element("css selector", css).click()

    def fill(self, css: str, value: str) -> None:
        el = self.driver.find_element("css selector", css)
        if el.tag_name == "select":
            from selenium.webdriver.support.ui import Select

            Select(el).select_by_value(value)
        else:
            el.clear()
            el.send_keys(value)

    def accept_confirm(self) -> None:
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self.driver, 10).until(expected_conditions.alert_is_present()).accept()

    def shot(self, name: str) -> Path:
        return screenshot(self.driver, self.shots, name)

    def download(self, button_css: str, suffix: str) -> str:
        """Click an export button; the text of the file the browser saved."""
        for old in self.driver.downloads.iterdir():
            old.unlink()
        self.click(button_css)

        def saved() -> list[Path]:
            # Chromium may show the file under its name before its bytes are in (once, under the
            # whole suite, it was read empty): wait for them, and for no partial download left
            names = list(self.driver.downloads.iterdir())
            if any(p.name.endswith(".crdownload") for p in names):
                return []
            return [p for p in names if p.name.endswith(suffix) and p.stat().st_size > 0]

        done = wait_for(f"a {suffix} download", saved)
        return done[0].read_text()


def _make_data(c: Console) -> dict[str, Any]:
    c.api("POST", "/queues", {"name": "orders", "partitions": 2})
    c.api("POST", "/queues", {"name": "jobs", "partitions": 1})
    c.api("POST", "/queues/orders/messages", {"messages": [{**m, "partition": 0} for m in ORDERS]})
    c.api("POST", "/queues/orders/messages", {"value": BINARY_B64, "encoding": "base64", "partition": 1})
    delayed = c.api("POST", "/queues/orders/messages", {"value": "call back", "delay_ms": 3_600_000})["results"][0]
    # "billing" has committed 1 of partition 0 and has no members (so it can be reset)
    member = c.api("POST", "/groups/billing/members", {"queues": ["orders"]})["member"]
    c.api(
        "POST",
        f"/groups/billing/members/{member}/offsets",
        {"offsets": [{"queue": "orders", "partition": 0, "offset": 1}]},
    )
    c.api("DELETE", f"/groups/billing/members/{member}")
    # "live" has a member holding both partitions
    live = c.api("POST", "/groups/live/members", {"queues": ["orders"]})
    assert len(live["assignment"]) == 2, live
    # a dead letter of the shared group "workers": one attempt allowed, nacked
    c.api(
        "POST",
        "/queues/jobs/messages",
        {"value": "resize img-7", "key": "job-7", "tag": "thumb", "properties": {"size": "64"}},
    )
    body = {"max_messages": 1, "timeout_ms": 10_000, "max_attempts": 1, "member": "w1"}
    lease = c.api("POST", "/shared/workers/queues/jobs/receive", body)["deliveries"][0]["lease_id"]
    c.api(
        "POST",
        "/shared/workers/queues/jobs/nack",
        {"lease_ids": [lease], "member": "w1", "reason": "bad input", "delay_ms": 0},
    )
    wait_for("the dead letter", lambda: c.api("GET", "/queues/jobs.dlq/messages", ok=(200, 404)).get("records"))
    c.api("POST", "/queues/orders/subscribers", {"name": "audit", "start": "earliest"})
    return {"delayed_id": delayed["id"], "live_member": live["member_id"]}


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Any:  # noqa: F811 - the fixture
    gateway = HttpBroker(tmp_path_factory.mktemp("console") / "data")
    c = Console(gateway, browser, tmp_path_factory.mktemp("screenshots"))
    try:
        c.made = _make_data(c)
        yield c
    finally:
        c.http.close()
        gateway.stop()


def test_queues_page_shows_counts_rates_and_creates_and_deletes(console):
    c = console
    c.open("queues")
    c.wait_text("orders")
    rows = {
        r.find_element("css selector", "td").text: r.text
        for r in c.driver.find_elements("css selector", "#queues tbody tr")
    }
    assert rows["orders"].startswith("orders 2 4 ")  # 2 partitions, 4 messages (the delayed one is not yet)
    assert rows["jobs"].startswith("jobs 1 1 ")
    c.shot("queues")
    # a rate appears once two readings of the end offsets are apart and messages came between
    c.api("POST", "/queues/orders/messages", {"messages": [{"value": f"m{i}", "partition": 1} for i in range(30)]})
    wait_for("a rate above 0", lambda: float(c.text('[data-rate="orders"]').replace(",", "") or 0) > 0, timeout_s=20)
    c.fill("#create-queue [name=name]", "scratch")
    c.fill("#create-queue [name=partitions]", "3")
    c.click("#create-queue button")
    c.wait_text("scratch")
    assert c.api("GET", "/queues/scratch")["config"]["partitions"] == 3
    c.click('[data-delete="scratch"]')
    c.accept_confirm()
    wait_for("scratch gone", lambda: "created queue" not in c.text("#notice") and "scratch" not in c.text("#queues"))
    assert c.api("GET", "/queues/scratch", ok=(404,))["error"]["name"] == "QueueNotFoundError"


def test_queue_detail_and_an_api_error_shown_as_its_message(console):
    c = console
    c.open("queues/orders")
    assert "Queue orders" in c.text()
    parts = [r.text for r in c.driver.find_elements("css selector", "#partitions tbody tr")]
    assert parts[0].startswith("0 0 3 3")
    c.shot("queue-detail")
    c.open("queues/nope")
    assert c.text("#error") == "QueueNotFoundError: queue 'nope' does not exist; create it first"
    assert "Traceback" not in c.driver.page_source


def _shown_records(c: Console) -> list[list[str]]:
    rows = c.driver.find_elements("css selector", "#records tbody tr")
    return [[td.text for td in r.find_elements("css selector", "td")] for r in rows]


def test_browse_by_offset_and_key_then_export_json_and_csv(console):
    c = console
    c.open("browse/orders?by=offset&p=0&offset=0")
    shown = _shown_records(c)
    assert [r[1] for r in shown] == ["0", "1", "2"]
    assert [r[7] for r in shown] == [m["value"] for m in ORDERS]
    assert shown[2][6] == "a=1\nb=2"
    c.shot("browse")
    exported = json.loads(c.download("#export-json", ".json"))
    assert [(r["offset"], r["value"], r["key"], r["tag"], r.get("properties")) for r in exported] == [
        (i, m["value"], m["key"], m["tag"], m.get("properties")) for i, m in enumerate(ORDERS)
    ]
    rows = list(csv.DictReader(io.StringIO(c.download("#export-csv", ".csv"))))
    assert [(r["offset"], r["value"], r["key"], r["tag"]) for r in rows] == [
        (str(i), m["value"], m["key"], m["tag"]) for i, m in enumerate(ORDERS)
    ]
    assert json.loads(rows[2]["properties"]) == {"a": "1", "b": "2"}
    # by key, through the form (the URL it leads to can be bookmarked)
    c.fill("#browse-form [name=by]", "key")
    c.fill("#browse-form [name=key]", "customer-1")
    c.click("#browse-form button")
    wait_for("the key's records", lambda: "by=key" in c.driver.current_url and len(_shown_records(c)) == 2)
    wait_rendered(c.driver)
    assert [r[7] for r in _shown_records(c)] == [ORDERS[0]["value"], ORDERS[2]["value"]]
    assert "key=customer-1" in c.driver.current_url


def test_browse_views_tag_filter_produce_and_escaping(console):
    c = console
    c.open("browse/orders?by=offset&p=1&offset=0&max=1&view=hex")
    assert _shown_records(c)[0][7] == "00 01 02 ff"
    c.open("browse/orders?by=offset&p=1&offset=0&max=1&view=base64")
    assert _shown_records(c)[0][7] == BINARY_B64
    c.open("browse/orders?by=offset&p=0&offset=0&tag=new")
    assert [r[1] for r in _shown_records(c)] == ["1"]
    second = c.api("GET", "/queues/orders/partitions/0/messages?offset=1&max=1")["records"][0]
    c.open(f"browse/orders?by=id&id={second['id']}")
    assert [(r[1], r[2]) for r in _shown_records(c)] == [("1", second["id"])]
    c.open(f"browse/orders?by=time&p=0&time={second['timestamp_ms']}&max=2")
    assert [r[7] for r in _shown_records(c)][0] in (ORDERS[0]["value"], ORDERS[1]["value"])  # same ms as the first
    markup = '<img src=x onerror="document.title=1"><b>bold</b>'
    c.fill("#produce-form [name=value]", markup)
    c.fill("#produce-form [name=key]", "k<i>")
    c.fill("#produce-form [name=tag]", "test")
    c.fill("#produce-form [name=partition]", "0")
    c.fill("#produce-form [name=properties]", "origin=console\nrun=1")
    c.click("#produce-form button[type=submit]")
    c.wait_text("produced to partition 0 at offset 3", "#produce-result")
    got = c.api("GET", "/queues/orders/partitions/0/messages?offset=3")["records"][0]
    assert (got["value"], got["key"], got["tag"], got["properties"]) == (
        markup,
        "k<i>",
        "test",
        {"origin": "console", "run": "1"},
    )
    c.click("#produce-result a")
    wait_for("the produced record", lambda: _shown_records(c) and _shown_records(c)[0][7] == markup)
    # shown as text: no element was made of it
    assert not c.driver.find_elements("css selector", "#records img, #records b, #records i")
    assert c.driver.title == "Headwater console"
    c.open("browse/orders?by=time&time=yesterday")
    assert c.text("#error") == 'Error: time: give epoch ms or a date such as 2026-11-28T04:00:00Z, got "yesterday"'


def test_groups_page_shows_members_lag_and_resets_with_a_dry_run(console):
    c = console
    c.open("groups")
    assert "billing" in c.text("#groups") and "live" in c.text("#groups")
    c.shot("groups")
    c.open("groups/live")
    assert c.made["live_member"] in c.text("#members")
    assert "orders: 0, 1" in c.text("#members")
    c.open("groups/billing")
    end = c.api("GET", "/queues/orders")["partitions"][0]["end_offset"]
    lag = [r.text for r in c.driver.find_elements("css selector", "#lag-orders tbody tr")]
    assert lag[0] == f"0 — 1 {end} {end - 1}"  # committed 1, no member holds it
    c.shot("group-detail")
    c.fill("#reset-form [name=to]", "earliest")
    c.click("#reset-dry")
    c.wait_text("after reset", "#reset-plan")
    assert [r.text for r in c.driver.find_elements("css selector", "#reset-dry-run tbody tr")][0] == "0 1 0"
    assert c.api("GET", "/groups/billing/offsets?queue=orders")["offsets"] == {"0": 1}  # a dry run changes nothing
    c.click("#reset-execute")
    wait_for("the reset", lambda: c.api("GET", "/groups/billing/offsets?queue=orders")["offsets"] == {"0": 0, "1": 0})
    c.wait_text("reset billing on orders", "#notice")


def test_shared_group_dead_letter_is_re_driven_to_its_source(console):
    c = console
    c.open("shared")
    assert "workers" in c.text("#shared-groups")
    assert c.text("#dlqs").splitlines()[1] == "jobs.dlq jobs 1 workers"
    c.shot("shared")
    c.click("#shared-groups a")
    wait_for("the shared group's page", lambda: "Shared group workers on jobs" in c.text())
    wait_rendered(c.driver)
    assert "in flight 0 · awaiting retry 0 · dead-lettered 1" in c.text()
    letter = c.text("#dead-letters").splitlines()[1]
    assert "bad input" in letter and "resize img-7" in letter and "job-7" in letter
    c.shot("shared-detail")
    c.click("[data-redrive]")
    c.wait_text("re-drove", "#redrive-result")
    assert "to jobs partition 0 offset 1" in c.text("#redrive-result")
    back = c.api("GET", "/queues/jobs/partitions/0/messages?offset=1")["records"]
    assert len(back) == 1
    dead = c.api("GET", "/queues/jobs.dlq/messages")["records"][0]
    assert (back[0]["value"], back[0]["key"], back[0]["tag"]) == ("resize img-7", "job-7", "thumb")
    assert back[0]["properties"] == {"size": "64", "redriven_from": dead["id"]}
    c.click("#redrive-result a")
    wait_for("the re-driven message", lambda: _shown_records(c) and _shown_records(c)[0][7] == "resize img-7")


def test_subscriptions_page(console):
    c = console
    c.open("subscriptions")
    row = c.text("#subscribers").splitlines()[1]
    assert row.startswith("orders audit all all")
    c.shot("subscriptions")


def test_delays_page_shows_the_schedule_and_cancels_by_id(console):
    c = console
    c.open("delays")
    assert c.text("#delay-pending").splitlines()[0] == "1"
    assert len(c.driver.find_elements("css selector", "#delay-buckets tbody tr")) == 1
    c.shot("delays")
    c.fill("#cancel-delay [name=id]", c.made["delayed_id"])
    c.click("#cancel-delay button")
    c.wait_text(f"cancelled {c.made['delayed_id']}", "#notice")
    wait_for("the pending count at 0", lambda: c.text("#delay-pending").splitlines()[0] == "0")
    assert c.api("GET", "/delays/stats")["pending_messages"] == 0
    c.fill("#cancel-delay [name=id]", "not-an-id")
    c.click("#cancel-delay button")
    wait_for("the API's refusal", lambda: c.text("#error").strip())
    assert c.text("#error").startswith("InvalidMessageIdError: 'not-an-id' is not a message id")


def test_brokers_page(console):
    c = console
    c.open("brokers")
    assert c.text("#brokers").splitlines()[1] == f"-1 127.0.0.1:{c.gateway.port} 0"
    status = c.api("GET", "/status")
    assert c.text("#status").splitlines()[1].startswith(f"{status['version']} server 127.0.0.1:{c.gateway.port}")
    assert "orders 1 -1 0 -1" in c.text("#leaders")
    c.shot("brokers")


def test_every_console_file_is_package_data():
    """pip installs only what pyproject's package-data names: every file of static/ must match."""
    root = Path(__file__).resolve().parent.parent
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = root / "headwater" / "http" / "console"
    shipped = {p for g in globs["headwater.http.console"] for p in package.glob(g)}
    on_disk = {p for p in (package / "static").rglob("*") if p.is_file()}
    assert on_disk and on_disk == shipped, sorted(str(p.relative_to(package)) for p in on_disk ^ shipped)


def test_the_page_and_its_files_are_served(console):
    c = console
    page = c.http.get("/")
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert c.http.get("/console/app.js").headers["content-type"].startswith("text/javascript")
    assert c.http.get("/console/nope.js").status_code == 404
    assert len(list(c.shots.glob("*.png"))) >= 1


def test_on_a_cluster_the_brokers_page_shows_every_broker_and_leader(cluster, browser, tmp_path):  # noqa: F811 - the fixture
    """Through one broker's gateway: the three brokers, the controller, and partitions led
    by other brokers browsed as any other."""
    import httpx

    from headwater.http.server import HttpServer

    server = HttpServer(f"127.0.0.1:{cluster.brokers[1].port}", port=0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.wait_started()}/"
        with httpx.Client(base_url=url, timeout=30) as api:
            assert api.post("/v1/queues", json={"name": "spread", "partitions": 6}).status_code == 201
            msgs = [{"value": f"v{i}", "partition": i % 6} for i in range(12)]
            assert api.post("/v1/queues/spread/messages", json={"messages": msgs}).status_code == 200
            md = api.get("/v1/cluster", params={"queues": "spread"}).json()
        open_page(browser, url + "#/brokers")
        rows = browser.find_element("css selector", "#brokers").text.splitlines()[1:]
        assert sorted(r.split()[0] for r in rows) == sorted(str(b["broker_id"]) for b in md["brokers"])
        assert [r for r in rows if r.endswith("controller")] == [
            r for r in rows if r.startswith(f"{md['controller']} ")
        ]
        leaders = {p["partition"]: p["leader"] for p in md["queues"][0]["partitions"]}
        shown = browser.find_element("css selector", "#leaders").text
        for p, leader in leaders.items():
            assert f"spread {p} {leader} " in shown
        screenshot(browser, tmp_path, "cluster-brokers")
        away = next(p for p, leader in leaders.items() if leader != 1)  # broker 1 serves the gateway
        open_page(browser, url + f"#/browse/spread?by=offset&p={away}&offset=0")
        values = [
            r.find_elements("css selector", "td")[7].text
            for r in browser.find_elements("css selector", "#records tbody tr")
        ]
        assert values == [f"v{away}", f"v{away + 6}"]
    finally:
        server.stop()
