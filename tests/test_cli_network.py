"""The command line over the network: every command against a real ``headwater serve``
process (``--server``), the same output as on a data directory (``--data``), and the two
commands that only make sense against a live broker: ``status`` and ``consume``.

Commands run in-process (typer's CliRunner) when only their output matters, and as real
subprocesses when a test needs them running while it does something else (follow, Ctrl-C).
Every broker is stopped with SIGTERM at the end of its test and must exit 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import headwater
from headwater.cli.status import OWN_REQUESTS_PER_SAMPLE, Sample, measure_rates
from tests.support.broker_process import HEADWATER, BrokerProcess
from tests.support.command_line import Cli, Follower, subprocess_env

TIMESTAMP_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture
def broker(tmp_path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "served").start()
    yield b
    assert b.terminate() == 0, b.log.read_text()[-2000:]


def normalized(text: str) -> str:
    return TIMESTAMP_RE.sub("<time>", text)


# --- the foundation commands, both ways ---------------------------------------------------


FIRST_ID = "00000001-00000000-0000000000000000"
MISSING_ID = "00000001-00000001-0000000000000063"

SEQUENCE: list[tuple[list[str], str | None]] = [
    (["queue", "list"], None),
    (["queue", "create", "orders", "--partitions", "3", "--ttl", "1d", "--set", "owner=web"], None),
    (["queue", "create", "audit", "--flush", "sync", "--ttl", "forever"], None),
    (["queue", "create", "orders"], None),
    (["queue", "list", "--json"], None),
    (["queue", "list"], None),
    (["queue", "describe", "orders", "--json"], None),
    (["queue", "describe", "orders"], None),
    # (unkeyed sends start at a random partition: each names its partition here, so that
    # both runs store the same records in the same places)
    (["produce", "orders", "--partition", "0", "a", "b", "c"], None),
    (["produce", "orders", "--key", "k1", "--tag", "paid", "--property", "src=web", "order 1 paid"], None),
    (["produce", "orders", "--partition", "2", "--quiet", "x", "y"], None),
    (["produce", "orders", "--partition", "1"], "line 1\nline 2\n\nline 4\n"),
    (["produce", "orders", "--partition", "7", "z"], None),
    (["scan", "orders", "--json"], None),
    (["scan", "orders"], None),
    (["scan", "orders", "--partitions", "2", "--from", "1", "--json"], None),
    (["scan", "orders", "--tag", "paid", "--json"], None),
    (["scan", "orders", "--from", "-1h", "--to", "now", "--limit", "2", "--json"], None),
    (["scan", "orders", "--from", FIRST_ID, "--limit", "2", "--json"], None),
    (["get", FIRST_ID, "--json"], None),
    (["get", FIRST_ID], None),
    (["get", MISSING_ID], None),
    (["find", "orders", "--key", "k1", "--json"], None),
    (["find", "orders", "--key", "nobody", "--from", "-1d"], None),
    (["queue", "add-partitions", "orders", "--to", "4"], None),
    (["queue", "add-partitions", "orders", "--to", "2"], None),
    (["queue", "disable", "orders"], None),
    (["scan", "orders"], None),
    (["produce", "orders", "no"], None),
    (["queue", "enable", "orders"], None),
    (["queue", "truncate", "orders"], None),
    (["queue", "truncate", "orders", "--yes"], None),
    (["scan", "orders", "--json"], None),
    (["queue", "describe", "orders", "--json"], None),
    (["queue", "delete", "audit"], None),
    (["queue", "delete", "audit", "--yes"], None),
    (["queue", "list", "--json"], None),
    (["scan", "nope"], None),
    (["status", "--interval", "0", "--json"], None),  # differs: checked for keys only
]


def _outcomes(cli: Cli) -> list[tuple[int, str, str]]:
    out = []
    for args, stdin in SEQUENCE:
        code, stdout, stderr = cli.run(*args, input=stdin)
        out.append((code, normalized(stdout), stderr.splitlines()[0] if stderr else ""))
    return out


def test_every_foundation_command_gives_the_same_output_over_the_network(broker, tmp_path):
    (tmp_path / "local").mkdir()  # an empty directory: like a broker with no queues yet
    local = _outcomes(Cli("--data", str(tmp_path / "local")))
    remote = _outcomes(Cli("--server", broker.address))
    for (args, _), here, there in zip(SEQUENCE[:-1], local, remote):
        assert here == there, args
    # the sequence does fail where it should, the same way both times
    codes = {" ".join(args): code for (args, _), (code, _, _) in zip(SEQUENCE, remote)}
    assert codes["queue create orders"] == 1 and codes["get " + MISSING_ID] == 1
    assert codes["scan nope"] == 1 and codes["produce orders no"] == 1
    # status says where it ran
    local_status, remote_status = json.loads(local[-1][1]), json.loads(remote[-1][1])
    assert local_status["mode"] == "embedded" and "connections" not in local_status
    assert remote_status["mode"] == "server" and remote_status["address"] == broker.address


def test_unreachable_server_is_one_error_line(monkeypatch):
    monkeypatch.setenv("HEADWATER_CONNECT_TIMEOUT_S", "0.3")
    err = Cli("--server", "127.0.0.1:9").error("queue", "list")
    assert "cannot reach the broker at 127.0.0.1:9" in err


# --- status ---------------------------------------------------------------------------


def test_status_shows_version_uptime_connections_and_rates(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "s", "--partitions", "2")
    doc = json.loads(cli("status", "--json", "--interval", "0.2"))
    assert doc["version"] == headwater.__version__
    assert doc["uptime_s"] > 0 and doc["connections"] >= 1 and doc["connections_total"] >= 2
    assert doc["queues"] == 1 and doc["partitions"] == 2 and doc["internal_queues"] >= 1
    assert doc["page_cache_keep_bytes"] == 256 * 2**20 and doc["uncached_bytes"] == 0
    assert 1 << 20 < doc["memory_rss_bytes"] <= doc["memory_peak_bytes"] < 4 << 30
    tuned = platform.libc_ver()[0] == "glibc" and not any(k.startswith(("MALLOC_", "GLIBC_")) for k in os.environ)
    assert doc["allocator_cache_bytes"] == (128 * 2**20 if tuned else 0)  # the broker process tuned its allocator
    rates = doc["rates"]
    assert 0.15 < rates["interval_s"] < 5
    assert rates["messages_in_per_s"] == 0 and rates["requests_per_s"] == 0  # its own are not counted
    table = cli("status", "--interval", "0.1")
    for word in (
        "version",
        headwater.__version__,
        "uptime",
        "connections",
        f"server at {broker.address}",
        "1 (2 partitions)",
        "messages in",
        "requests",
        "recovery",
        "the newest 256.0 MB of the log kept",
        "resident, peak",
    ):
        assert word in table, word


def _documented_status() -> tuple[list[str], set[str]]:
    """The row labels of the sample ``status`` output in docs/cli.md, and the keys of its
    sample ``status --json``."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    section = text[text.index("## The broker: `status`") : text.index("## The shell")]
    sample = section[section.index("# version") : section.index("headwater --server 127.0.0.1:7070 status --watch")]
    rows = [m.group(1) for m in re.finditer(r"^# (\w[\w ]*?)\s{2,}\S", sample, re.M)]
    doc = json.loads(section[section.index("```json") + 7 : section.index("```", section.index("```json") + 7)])
    return rows, set(doc)


def test_the_documented_status_shows_every_row_and_key(broker):
    """docs/cli.md's sample ``status`` and ``status --json`` have the rows and keys a broker
    reports, no more and no fewer."""
    cli = Cli("--server", broker.address)
    cli("queue", "create", "s")
    rows, keys = _documented_status()
    table = cli("status", "--interval", "0.1")
    shown = [m.group(1) for m in re.finditer(r"^(\w[\w ]*?)\s{2,}\S", table, re.M)]
    assert rows == shown[: len(rows)] and set(shown) <= set(rows), (rows, shown)
    assert keys == set(json.loads(cli("status", "--json", "--interval", "0.1"))), keys


def test_status_shows_delayed_messages_and_push_subscribers(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "later")
    cli("produce", "later", "--delay", "1h", "a", "b")
    cli("subscriber", "add", "later", "audit")
    with headwater.connect(broker.address) as hw:
        sub = hw.subscribe("later", "audit", listeners=[lambda record: None])
        try:
            deadline = time.monotonic() + 10
            while json.loads(cli("status", "--interval", "0", "--json"))["push_streams"] < 1:
                assert time.monotonic() < deadline, "the subscriber's stream never opened"
                time.sleep(0.05)
            doc = json.loads(cli("status", "--interval", "0", "--json"))
            table = cli("status", "--interval", "0")
        finally:
            sub.stop()
    # --json passes the broker's figures through as they are
    assert doc["delay_pending"] == 2 and doc["delay_delivered_total"] == 0 and doc["delay_buckets"] >= 1
    assert doc["delay_next_due_ms"] > time.time() * 1000 and doc["push_streams"] == 1 and "pushes_total" in doc
    assert doc["fetch_streams"] == 0 and "stream_pushes_total" in doc
    rows = {line.split("  ")[0]: line for line in table.splitlines()}
    assert "2 pending in" in rows["delayed"] and re.search(r"next due \S+Z \(in (59|60)\.\dm\)", rows["delayed"])
    assert "0 delivered since start" in rows["delayed"]
    assert "1 subscriber stream(s) open" in rows["push"] and "pushes since start" in rows["push"]
    assert "internal (the broker's own state)" in rows["queues"]


def test_status_table_of_an_idle_embedded_broker():
    from rich.console import Console

    from headwater.cli.status import render_status

    st = {
        "version": "1",
        "mode": "embedded",
        "queues": 0,
        "internal_queues": 0,
        "delay_pending": 0,
        "delay_next_due_ms": None,
        "delay_buckets": 0,
        "delay_delivered_total": 3,
        "page_cache_keep_bytes": 0,
    }
    console = Console(width=200, record=True)
    console.print(render_status(Sample(0.0, st, {}, {}), None, now_ms=0))
    text = console.export_text()
    assert "none pending, 3 delivered since start" in text
    assert "push" not in text and "internal" not in text  # no server, no internal queues yet
    assert "all of the log left to the kernel" in text and "memory" not in text  # the process is the caller's


def test_status_rates_see_messages_arriving(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "busy")
    stop = threading.Event()

    def produce() -> None:
        with headwater.connect(broker.address) as hw:
            while not stop.is_set():
                hw.send_batch("busy", [b"m"] * 50)
                time.sleep(0.01)

    t = threading.Thread(target=produce)
    t.start()
    try:
        doc = json.loads(cli("status", "--json", "--interval", "0.3"))
    finally:
        stop.set()
        t.join()
    assert doc["rates"]["messages_in_per_s"] > 0 and doc["rates"]["requests_per_s"] > 0
    assert set(doc["rates"]["queues_in_per_s"]) == {"busy"}


def _sample(
    at_s: float, ends: dict[tuple[int, int], int], names: dict[int, str], requests: int | None = None
) -> Sample:
    st = {} if requests is None else {"requests_total": requests}
    return Sample(at_s, st, ends, names)


def test_measure_rates_counts_appends_new_partitions_and_ignores_deleted_queues():
    before = _sample(10.0, {(1, 0): 100, (1, 1): 50, (2, 0): 7}, {1: "a", 2: "gone"}, requests=1000)
    after = _sample(
        12.0,
        {(1, 0): 160, (1, 1): 50, (1, 2): 20, (3, 0): 4},
        {1: "a", 3: "new"},
        requests=1000 + 40 + OWN_REQUESTS_PER_SAMPLE,
    )
    rates = measure_rates(before, after)
    assert rates == {
        "interval_s": 2.0,
        "messages_in_per_s": 42.0,
        "requests_per_s": 20.0,
        "queues_in_per_s": {"a": 40.0, "new": 2.0},
    }
    embedded = measure_rates(_sample(0.0, {}, {}), _sample(1.0, {}, {}))
    assert embedded["requests_per_s"] is None and embedded["messages_in_per_s"] == 0


def test_status_on_a_data_directory_and_its_errors(tmp_path):
    cli = Cli("--data", str(tmp_path / "d"))
    cli("queue", "create", "q")
    doc = json.loads(cli("status", "--interval", "0", "--json"))
    assert doc["mode"] == "embedded" and "rates" not in doc
    table = cli("status", "--interval", "0")
    assert "(this process)" in table and "connections" not in table
    assert "--interval" in cli.error("status", "--watch", "--interval", "0")
    assert "no data directory" in Cli("--data", str(tmp_path / "none")).error("status")


def test_status_watch_until_ctrl_c(broker):
    proc = subprocess.Popen(
        [HEADWATER, "--server", broker.address, "status", "--watch", "--json", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    assert proc.stdout is not None
    docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert all("rates" in d for d in docs) and docs[0]["uptime_s"] < docs[2]["uptime_s"]
    # into a pipe, the tables follow one another (a terminal gets one table, redrawn)
    proc = subprocess.Popen(
        [HEADWATER, "--server", broker.address, "status", "--watch", "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=subprocess_env(),
    )
    assert proc.stdout is not None
    reports = 0
    while reports < 2:
        line = proc.stdout.readline().decode()
        assert line, proc.stderr.read().decode() if proc.stderr else ""
        reports += line.startswith("uptime")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=10)
    assert proc.returncode == 0


# --- groups ---------------------------------------------------------------------------


def test_group_list_and_describe_every_kind(broker, tmp_path):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "jobs", "--partitions", "2")
    with headwater.connect(broker.address) as hw:
        for i in range(12):
            hw.send("jobs", f"job {i}".encode(), key=f"k{i}".encode())
        billing = hw.consumer(group="billing", subscribe="jobs", client_id="biller")
        audit = hw.consumer(
            group="audit",
            subscribe="jobs",
            mode="broadcast",
            client_id="auditor",
            offsets_path=str(tmp_path / "audit-offsets"),
        )
        for member in (billing, audit):
            member.poll(timeout_ms=200)
        shared = hw.shared_consumer("mailers", "jobs", member="w1")
        assert len(shared.receive(max_messages=3, timeout_ms=2000)) == 3  # leased, not acked
        keyed = hw.keyed_consumer("mailers", "jobs", member=0, size=2)
        keyed.poll(timeout_ms=200)
        keyed.commit()

        listed = json.loads(cli("group", "list", "--json"))
        assert sorted((g["group"], g["kind"], g["state"], g["members"], g["queues"]) for g in listed) == [
            ("audit", "broadcast", "stable", 1, ["jobs"]),
            ("billing", "clustering", "stable", 1, ["jobs"]),
            ("mailers", "keyed", "stable", 2, ["jobs"]),
            ("mailers", "shared", "stable", 1, ["jobs"]),
        ]
        table = cli("group", "list")
        assert "kind" in table.splitlines()[0]
        assert all(kind in table for kind in ("broadcast", "clustering", "keyed", "shared"))

        docs = [json.loads(line) for line in cli("group", "describe", "mailers", "--json").splitlines()]
        by_kind = {d["kind"]: d for d in docs}
        assert len(docs) == 2 and set(by_kind) == {"shared", "keyed"}
        sh = by_kind["shared"]
        assert sh["queue"] == "jobs" and sh["pending_leases"] == 3 and sh["dead_letter_queue"] == "jobs.dlq"
        assert sum(p["pending_leases"] for p in sh["partitions"]) == 3
        assert {m for p in sh["partitions"] for m in p["leases_by_member"]} == {"w1"}
        assert sum(p["lag"] for p in sh["partitions"]) == 12
        ky = by_kind["keyed"]
        assert (ky["key"], ky["size"], ky["resizing_to"]) == ("key", 2, None)
        assert sorted((r["member"], r["partition"]) for r in ky["partitions"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(r["committed"] is None for r in ky["partitions"] if r["member"] == 1)

        text = cli("group", "describe", "mailers", "--queue", "jobs")
        assert "pending leases" in text and "w1 (" in text and "jobs.dlq" in text
        assert "keyed" in text and "position" in text and "offsets behind" in text
        billing_doc = json.loads(cli("group", "describe", "billing", "--json"))  # one group: one line
        assert billing_doc["kind"] == "clustering" and billing_doc["members"][0]["client_id"] == "biller"
        assert all(r["pending_leases"] is None for r in billing_doc["partitions"])
        assert json.loads(cli("group", "describe", "audit", "--json"))["kind"] == "broadcast"
        assert "no group 'nobody'" in cli.error("group", "describe", "nobody")
        assert "does not exist" in cli.error("group", "describe", "mailers", "--queue", "nope")
        err = cli.error("group", "describe", "billing-x", "--queue", "jobs")
        assert "no shared or keyed group on queue 'jobs'" in err
        for c in (billing, audit, shared, keyed):
            c.close()


# --- consume --------------------------------------------------------------------------


def test_consume_follows_new_messages(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "f", "--partitions", "2")
    cli("produce", "f", "old-1", "old-2")
    follower = Follower("--server", broker.address, "consume", "f", "--from", "earliest", "--json", "--limit", "5")
    assert [r["value"] for r in follower.read(2)] == ["old-1", "old-2"]
    cli("produce", "f", "new-1")  # produced while it waits: long polling hands them over
    cli("produce", "f", "new-2", "new-3")
    code, _ = follower.finish()
    assert code == 0
    assert sorted(r["value"] for r in follower.records) == ["new-1", "new-2", "new-3", "old-1", "old-2"]
    assert list(follower.records[0]) == [
        "message_id",
        "partition",
        "offset",
        "timestamp",
        "key",
        "tag",
        "properties",
        "value",
        "scheduled",
    ]  # the keys of scan --json


def test_consume_goes_on_across_a_broker_restart(tmp_path):
    """``consume --server`` follows on when the broker stops (SIGTERM) and starts again on its
    port: the messages sent before and after both come, and it ends at its --limit, cleanly."""
    broker = BrokerProcess(tmp_path / "served").start()
    try:
        Cli("--server", broker.address)("queue", "create", "r")
        follower = Follower(
            "--server", broker.address, "consume", "r", "--group", "g", "--from", "earliest", "--json", "--limit", "2"
        )
        Cli("--server", broker.address)("produce", "r", "before")
        assert [r["value"] for r in follower.read(1)] == ["before"]
        # consume prints a batch and then commits it: stop the broker only once that commit has
        # landed, or the group rightly hands "before" out again (the case below)
        _wait_for_commit(broker.address, "g", "r", {0: 1})
        assert broker.terminate() == 0
        broker = BrokerProcess(tmp_path / "served", port=broker.port).start()
        Cli("--server", broker.address)("produce", "r", "after")
        code, err = follower.finish()
        assert code == 0, err
        assert [r["value"] for r in follower.records] == ["before", "after"]
    finally:
        broker.kill()


def _wait_for_commit(
    address: str, group: str, queue_name: str, offsets: dict[int, int], timeout_s: float = 10.0
) -> None:
    with headwater.connect(address) as hw:
        deadline = time.monotonic() + timeout_s
        while (seen := hw.service.fetch_offsets(group, queue_name)) != offsets:
            assert time.monotonic() < deadline, f"group {group!r} committed {seen}, not {offsets}"
            time.sleep(0.02)


def test_consume_from_latest_skips_old_messages(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "l")
    cli("produce", "l", "old-1", "old-2")
    follower = Follower("--server", broker.address, "consume", "l", "--from", "latest", "--json", "--limit", "1")
    with headwater.connect(broker.address) as hw:
        i = 0
        while follower.proc.poll() is None and i < 200:  # until it has started and seen one
            hw.send("l", f"new-{i}".encode())
            i += 1
            time.sleep(0.05)
    code, _ = follower.finish()
    assert code == 0
    assert len(follower.records) == 1 and follower.records[0]["value"].startswith("new-")


def test_consume_group_resumes_where_it_committed(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "g")
    cli("produce", "g", *[f"m{i}" for i in range(5)])
    first = cli.records("consume", "g", "--group", "workers", "--from", "earliest", "--limit", "3")
    assert [r["value"] for r in first] == ["m0", "m1", "m2"]
    # --from earliest applies only where the group has committed nothing: it resumes
    rest = cli.records("consume", "g", "--group", "workers", "--from", "earliest", "--timeout", "0.3")
    assert [r["value"] for r in rest] == ["m3", "m4"]
    assert cli.records("consume", "g", "--group", "workers", "--timeout", "0.2") == []
    cli("produce", "g", "m5")
    assert [r["value"] for r in cli.records("consume", "g", "--group", "workers", "--timeout", "0.3")] == ["m5"]
    # another group has its own position
    other = cli.records("consume", "g", "--group", "audit", "--from", "earliest", "--timeout", "0.3")
    assert len(other) == 6


def test_consume_new_group_from_latest_commits_its_start(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "n")
    cli("produce", "n", "before")
    assert cli.records("consume", "n", "--group", "late", "--timeout", "0.2") == []
    cli("produce", "n", "while-away")
    # the first run committed where it started, so what came meanwhile is not lost
    assert [r["value"] for r in cli.records("consume", "n", "--group", "late", "--timeout", "0.3")] == ["while-away"]


@pytest.mark.parametrize("repeat", [False, True], ids=["once", "repeated"])
def test_consume_ctrl_c_commits_what_was_printed(broker, repeat):
    """Ctrl-C ends consume cleanly, its batch committed. ``repeated``: ``timeout -s INT``
    signals the process and then its process group, so consume gets SIGINT twice; that is
    one Ctrl-C, where the repeat used to count as a second one (exit 130, nothing
    committed). The test sends the two 0.2 s apart while the broker is stopped (SIGSTOP),
    so that consume is surely still finishing when the repeat comes."""
    cli = Cli("--server", broker.address)
    cli("queue", "create", "c")
    cli("produce", "c", "a", "b", "c")
    follower = Follower("--server", broker.address, "consume", "c", "--group", "g", "--from", "earliest", "--json")
    follower.read(3)
    if repeat:
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            follower.proc.send_signal(signal.SIGINT)
            time.sleep(0.2)
            follower.proc.send_signal(signal.SIGINT)
            time.sleep(0.2)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
    else:
        follower.proc.send_signal(signal.SIGINT)
    code, err = follower.finish()
    assert code == 0, err
    assert "consumed 3 message(s)" in err
    cli("produce", "c", "d")
    assert [r["value"] for r in cli.records("consume", "c", "--group", "g", "--timeout", "0.3")] == ["d"]


def test_consume_from_a_time_partitions_tags_and_table(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "t", "--partitions", "2")
    cli("produce", "t", "--partition", "0", "old")
    time.sleep(0.02)
    cli("produce", "t", "--partition", "0", "--tag", "paid", "new-paid")
    cli("produce", "t", "--partition", "1", "--tag", "paid", "other-partition")
    cli("produce", "t", "--partition", "0", "--tag", "refunded", "new-refunded")
    since = cli.records("scan", "t", "--partitions", "0")[1]["timestamp"]
    got = cli.records("consume", "t", "--from", since, "--partitions", "0", "--timeout", "0.3")
    assert [r["value"] for r in got] == ["new-paid", "new-refunded"]
    got = cli.records("consume", "t", "--from", "earliest", "--tag", "paid", "--timeout", "0.3")
    assert sorted(r["value"] for r in got) == ["new-paid", "other-partition"]
    # a group that starts at a time, whatever it committed before: its offsets move there
    cli("consume", "t", "--group", "g", "--from", "earliest", "--timeout", "0.2")
    got = cli.records("consume", "t", "--group", "g", "--from", since, "--timeout", "0.3")
    assert sorted(r["value"] for r in got) == ["new-paid", "new-refunded", "other-partition"]
    # a group's partitions are the broker's to assign
    assert "--partitions and --group" in cli.error("consume", "t", "--group", "g", "--partitions", "0")
    table = cli("consume", "t", "--from", "earliest", "--timeout", "0.3")
    assert "message id" in table and "new-refunded" in table and "refunded" in table


def test_consume_on_a_data_directory(tmp_path):
    cli = Cli("--data", str(tmp_path / "d"))
    cli("queue", "create", "e", "--partitions", "3")
    cli("produce", "e", "--key", "k", "one", "two")
    got = cli.records("consume", "e", "--from", "earliest", "--group", "g", "--timeout", "0.2")
    assert [r["value"] for r in got] == ["one", "two"]
    assert cli.records("consume", "e", "--group", "g", "--timeout", "0.1") == []
    got = cli.records("consume", "e", "--from", "earliest", "--timeout", "0")
    assert [r["value"] for r in got] == ["one", "two"]


def test_consume_timeout_0_prints_what_is_there_and_stops(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "z", "--partitions", "3")
    lines = [f"m{i}" for i in range(1200)]  # more than one poll's worth
    cli("produce", "z", "--quiet", input="\n".join(lines) + "\n")
    got = cli.records("consume", "z", "--from", "earliest", "--group", "g", "--timeout", "0")
    assert sorted(r["value"] for r in got) == sorted(lines)
    assert cli.records("consume", "z", "--group", "g", "--timeout", "0") == []  # all committed
    cli("produce", "z", "--partition", "1", "new")
    assert [r["value"] for r in cli.records("consume", "z", "--group", "g", "--timeout", "0")] == ["new"]
    assert len(cli.records("consume", "z", "--from", "earliest", "--timeout", "0", "--limit", "7")) == 7
    started = time.monotonic()
    assert cli.records("consume", "z", "--from", "earliest", "--tag", "nope", "--timeout", "0") == []
    assert cli.records("consume", "z", "--timeout", "0") == []  # from latest: nothing is there
    assert time.monotonic() - started < 5  # neither waited for messages to come
    first = next(r["partition"] for r in got if r["value"] == "m0")  # unkeyed: a random first partition
    assert "m0" in cli("consume", "z", "--from", "earliest", "--partitions", str(first), "--timeout", "0")


def test_consume_errors(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "x", "--partitions", "2")
    assert "does not exist" in cli.error("consume", "nope", "--timeout", "0")
    assert "--from" in cli.error("consume", "x", "--from", "yesterday-ish")
    assert "partition" in cli.error("consume", "x", "--partitions", "5", "--timeout", "0")
    cli("queue", "disable", "x")
    assert "disabled" in cli.error("consume", "x", "--timeout", "0")


def test_new_commands_have_help_with_examples():
    cli = Cli()
    for words in (["consume"], ["status"], ["shell"]):
        out = cli(*words, "--help")
        assert "Usage: headwater" in out and "Example" in out, words
    top = cli("--help")
    assert all(name in top for name in ("consume", "status", "shell"))


# the transcripts in the guides ------------------------------------------------------------


def transcript(guide: str) -> list[tuple[str, list[str]]]:
    """The ``console`` transcripts of ``docs/<guide>``: each ``$ headwater --server ...``
    command line (its arguments after the address, with its comment) and the lines it shows."""
    text = (Path(__file__).resolve().parent.parent / "docs" / guide).read_text()
    steps: list[tuple[str, list[str]]] = []
    for block in text.split("```console\n")[1:]:
        for line in block[: block.index("```")].splitlines():
            if line.startswith("$ "):
                steps.append((line.split("--server localhost:7070 ", 1)[1], []))
            else:
                steps[-1][1].append(line)
    return steps


def shape(lines: list[str]) -> dict[str, list]:
    """What of a command's output must match its transcript: the cells of each table's
    heading lines, the labels of its ``label  value`` lines, and its other lines of text
    (messages, errors, captions), whitespace made single. Table rows (values, times, ids) and
    the transcripts' ``...`` are left out."""
    headings, labels, text = [], [], []
    for line in lines:
        if "┃" in line:
            headings.append([cell.strip() for cell in line.split("┃")])
        elif re.match(r"^\w[\w ]*?\s{2,}\S", line) and "│" not in line:
            labels.append(re.split(r"\s{2,}", line)[0])
        elif line.strip() and "│" not in line and "━" not in line and line.strip() != "...":
            text.append(line.strip())
    return {"headings": headings, "labels": labels, "text": " ".join(" ".join(text).split())}


def _consumer_groups_scene(address: str, stack: contextlib.ExitStack) -> dict[str, Callable[[], None]]:
    """docs/consumer-groups.md: group billing of two members on orders (4 partitions)."""
    hw = stack.enter_context(headwater.connect(address))
    hw.admin.create_queue("orders", partitions=4)
    for p, n in enumerate([100, 110, 120, 130]):
        hw.send_batch("orders", [b"o"] * n, partition=p)
    members = [
        stack.enter_context(headwater.connect(address)).consumer(
            group="billing", subscribe="orders", strategy="sticky", client_id=client_id
        )
        for client_id in ("host-a-812", "host-b-377")
    ]
    deadline = time.monotonic() + 30
    while not all(len(c.assignment()) == 2 for c in members):
        assert time.monotonic() < deadline, "the two members never shared the partitions"
        for c in members:
            c.poll(max_messages=30, timeout_ms=50)
    for c in members:
        c.commit()

    def stop_members() -> None:
        for c in members:
            c.close()

    return {"once they stopped": stop_members}


def _shared_groups_scene(address: str, stack: contextlib.ExitStack) -> dict[str, Callable[[], None]]:
    """docs/shared-groups.md: keyed group by-user (3 members) and shared group mailers (one
    member holding 2 leases) on jobs (3 partitions)."""
    hw = stack.enter_context(headwater.connect(address))
    hw.admin.create_queue("jobs", partitions=3)
    hw.send_batch("jobs", [b"j"] * 5, partition=0)
    for i in range(3):
        hw.keyed_consumer("by-user", "jobs", member=i, size=3)
    assert len(hw.shared_consumer("mailers", "jobs", member="w1").receive(max_messages=2, timeout_ms=1000)) == 2
    return {}


TRANSCRIPT_SCENES = {"consumer-groups.md": _consumer_groups_scene, "shared-groups.md": _shared_groups_scene}


def test_every_transcript_is_checked():
    root = Path(__file__).resolve().parent.parent
    with_transcripts = {
        p.name for p in [root / "README.md", *(root / "docs").rglob("*.md")] if "```console" in p.read_text()
    }
    assert with_transcripts == set(TRANSCRIPT_SCENES)


@pytest.mark.parametrize("guide, scene", list(TRANSCRIPT_SCENES.items()))
def test_the_transcripts_in_the_guides_match_what_the_commands_print(broker, guide, scene):
    """Each command of the guide's transcript, run against a broker in the state the guide
    describes, prints the same tables (headings), the same labels and the same messages."""
    cli = Cli("--server", broker.address)
    with contextlib.ExitStack() as stack:
        before = scene(broker.address, stack)
        for command, shown in transcript(guide):
            args, _, comment = command.partition("#")
            if comment.strip() in before:
                before[comment.strip()]()
            code, out, err = cli.run(*shlex.split(args))
            assert code == (1 if any(line.startswith("error:") for line in shown) else 0), (command, out, err)
            assert shape(shown) == shape((out + err).splitlines()), command
