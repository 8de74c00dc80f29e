"""Prometheus metrics (METRICS, ``headwater metrics``, docs/metrics.md) and JSON logs, through a
real ``headwater serve``: what was sent is what is counted, lag is the CLI's, the exposition
parses with Prometheus' own parser."""

from __future__ import annotations

import json
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

import headwater
from headwater.errors import UsageError
from headwater.model.batch import encode_batch
from headwater.model.groups import partition_lag
from headwater.model.message import Message
from tests.support.broker_process import HEADWATER, BrokerProcess
from tests.support.cluster import eventually
from tests.support.command_line import Cli


def families(text: str) -> dict[str, object]:
    """The families of an exposition by name, parsed as Prometheus parses a scrape."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float | None:
    """The value of ``sample`` (default: the family's name) whose labels include ``labels``."""
    want = sample or family
    found = [s.value for s in fams[family].samples if s.name == want and labels.items() <= s.labels.items()]
    assert len(found) <= 1, (family, labels, found)
    return found[0] if found else None


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("metrics") / "data", "--log-format", "json").start()
    try:
        yield b
    finally:
        b.terminate()


def test_produce_and_consume_are_counted_per_queue(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("counted", partitions=2)
        bodies = [b"x" * 100] * 50
        hw.send_batch("counted", bodies, partition=0)
        hw.send_batch("counted", bodies[:20], partition=1)
        hw.send("counted", b"one more", partition=1)
        with hw.consumer(group="readers", stream=False) as c:
            c.assign("counted")
            c.seek_to_beginning("counted")
            got = []
            eventually(lambda: got.extend(c.poll(timeout_ms=200)) or len(got) >= 71, what="71 messages read")
        fams = families(hw.admin.metrics())
    assert len(got) == 71
    assert value(fams, "headwater_messages_in", "headwater_messages_in_total", queue="counted") == 71
    # bytes in: the batches as sent (two batches of 50 and 20, one of 1)
    sent = len(encode_batch([Message(b) for b in bodies])) + len(encode_batch([Message(b) for b in bodies[:20]]))
    sent += len(encode_batch([Message(b"one more")]))
    assert value(fams, "headwater_bytes_in", "headwater_bytes_in_total", queue="counted") == sent
    assert value(fams, "headwater_messages_out", "headwater_messages_out_total", queue="counted") == 71
    assert value(fams, "headwater_bytes_out", "headwater_bytes_out_total", queue="counted") == sent
    # the broker's own queues (offsets, coordinators) are not counted
    assert all(not s.labels["queue"].startswith("__") for s in fams["headwater_messages_in"].samples)
    latency = "headwater_request_duration_seconds"
    assert value(fams, latency, latency + "_count", api="produce") == 3
    assert value(fams, latency, latency + "_count", api="fetch") >= 2
    assert value(fams, latency, latency + "_bucket", api="produce", le="+Inf") == 3
    buckets = [s for s in fams[latency].samples if s.name == latency + "_bucket" and s.labels["api"] == "produce"]
    counts = [s.value for s in sorted(buckets, key=lambda s: float(s.labels["le"]))]
    assert counts == sorted(counts) and len(counts) > 10  # cumulative, le ascending to +Inf
    assert 0 < value(fams, latency, latency + "_sum", api="produce") < 60
    assert value(fams, "headwater_connections") >= 1
    spins = value(fams, "headwater_idle_spins", "headwater_idle_spins_total")
    assert spins >= 1  # the first serve always spins; whether it found a request is the machine's
    assert 0 <= value(fams, "headwater_idle_spin_hits", "headwater_idle_spin_hits_total") <= spins
    assert value(fams, "headwater_build_info", version=headwater.__version__) == 1


def _queues_named(text: str) -> set[str]:
    """The queues the per-queue counters have a series for."""
    fams = families(text)
    names = ("headwater_messages_in", "headwater_bytes_in", "headwater_messages_out", "headwater_bytes_out")
    return {s.labels["queue"] for name in names for s in fams[name].samples}


def test_a_deleted_queues_series_go_and_a_new_one_of_its_name_counts_from_zero(broker):
    # they stayed forever: every queue ever deleted was still named in each scrape
    with headwater.connect(broker.address) as hw:
        for name in ("doomed-1", "doomed-2"):
            hw.admin.create_queue(name, partitions=2)
            hw.send_batch(name, [b"x"] * 5, partition=0)
        with hw.consumer(group="doomed-readers", stream=False) as c:
            c.assign("doomed-1")
            c.seek_to_beginning("doomed-1")
            got = []
            eventually(lambda: got.extend(c.poll(timeout_ms=200)) or len(got) >= 5, what="5 messages read")
        assert {"doomed-1", "doomed-2"} <= _queues_named(hw.admin.metrics())
        hw.admin.delete_queue("doomed-1")
        hw.admin.delete_queue("doomed-2")
        assert not {"doomed-1", "doomed-2"} & _queues_named(hw.admin.metrics())
        hw.admin.create_queue("doomed-1", partitions=2)
        hw.send("doomed-1", b"again", partition=0)
        fams = families(hw.admin.metrics())
    assert value(fams, "headwater_messages_in", "headwater_messages_in_total", queue="doomed-1") == 1
    assert value(fams, "headwater_messages_out", "headwater_messages_out_total", queue="doomed-1") is None


def test_errors_are_counted_per_operation_and_code(broker):
    with headwater.connect(broker.address) as hw:
        before = families(hw.admin.metrics())
        with pytest.raises(headwater.QueueNotFoundError) as e:
            hw.admin.describe_queue("no-such-queue")
        after = families(hw.admin.metrics())
    labels = {"api": "describe_queue", "code": str(e.value.code)}
    was = value(before, "headwater_request_errors", "headwater_request_errors_total", **labels) or 0
    assert value(after, "headwater_request_errors", "headwater_request_errors_total", **labels) == was + 1


def test_lag_is_the_clis(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("lagging", partitions=3)
        for p, n in ((0, 40), (1, 7), (2, 0)):
            if n:
                hw.send_batch("lagging", [b"m"] * n, partition=p)
        with hw.consumer(group="slow") as c:  # commits 25 of partition 0, nothing of 2
            c.commit({("lagging", 0): 25, ("lagging", 1): 7})
        hw.send_batch("lagging", [b"late"] * 5, partition=1)  # uncommitted since
        fams = families(hw.admin.metrics())
    code, out, err = Cli("--server", broker.address).run("group", "describe", "slow", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = [r for d in (doc if isinstance(doc, list) else [doc]) for r in d["partitions"] if r["queue"] == "lagging"]
    assert {r["partition"]: r["lag"] for r in rows} == {0: 15, 1: 5, 2: None}
    for r in rows:
        got = value(fams, "headwater_consumer_lag", group="slow", queue="lagging", partition=str(r["partition"]))
        assert got == r["lag"], r  # None: no commit there, so no series either
    assert partition_lag(25, 0, 40) == 15


def test_keyed_lag_is_the_slowest_members_offsets_behind_as_the_cli_shows_them(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("keyed-lag", partitions=2)
        hw.send_batch("keyed-lag", [Message(b"m", key=b"k%d" % i) for i in range(30)], partition=0)
        hw.send_batch("keyed-lag", [Message(b"m", key=b"k%d" % i) for i in range(12)], partition=1)
        with hw.keyed_consumer("tally", "keyed-lag", member=0, size=2) as first:  # member 1 reads nothing
            got = []
            eventually(lambda: got.extend(first.poll(timeout_ms=200)) or first.position(0) >= 30)
            first.commit()
        hw.send_batch("keyed-lag", [b"late"] * 4, partition=1)
        fams = families(hw.admin.metrics())
    code, out, err = Cli("--server", broker.address).run("group", "describe", "tally", "--queue", "keyed-lag", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = [r for d in (doc if isinstance(doc, list) else [doc]) for r in d["partitions"] if r["role"] == "active"]
    slowest = {p: max(r["offsets_behind"] for r in rows if r["partition"] == p) for p in (0, 1)}
    assert slowest == {0: 30, 1: 16}  # member 1 has read nothing
    for p, behind in slowest.items():
        assert value(fams, "headwater_consumer_lag", group="tally", queue="keyed-lag", partition=str(p)) == behind
    assert {s.labels["kind"] for s in fams["headwater_consumer_lag"].samples if s.labels["group"] == "tally"} == {
        "keyed"
    }


def test_shared_groups_leases_and_delayed_messages(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("jobs", partitions=1)
        hw.send_batch("jobs", [b"job"] * 6)
        hw.send("jobs", b"later", delay=3600)
        with hw.shared_consumer("workers", "jobs") as sc:
            leased = []
            eventually(lambda: leased.extend(sc.receive(max_messages=4, timeout_ms=200)) or len(leased) >= 4)
            fams = families(hw.admin.metrics())
            got = value(fams, "headwater_shared_leased_messages", group="workers", queue="jobs")
            assert got == len(leased)
            assert value(fams, "headwater_consumer_lag", group="workers", queue="jobs", kind="shared") == 6
            dead = value(
                fams, "headwater_shared_dead_lettered", "headwater_shared_dead_lettered_total", group="workers"
            )
            assert dead == 0
    assert value(fams, "headwater_delayed_pending_messages") >= 1
    assert value(fams, "headwater_delayed_accepted", "headwater_delayed_accepted_total") >= 1


def test_flush_latency_is_observed_on_sync_queues(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("durable", flush="sync")
        hw.send("durable", b"on disk")
        fams = families(hw.admin.metrics())
    name = "headwater_storage_flush_duration_seconds"
    assert value(fams, name, name + "_count") >= 1
    assert value(fams, name, name + "_sum") > 0


def test_cli_prints_the_exposition(broker):
    code, out, err = Cli("--server", broker.address).run("metrics", "--prefix", "headwater_partitions_led")
    assert code == 0, err
    fams = families(out)
    assert list(fams) == ["headwater_partitions_led"]
    assert value(fams, "headwater_partitions_led", queue="counted") == 2


def test_the_guides_example_output_is_what_the_broker_prints(broker):
    # docs/metrics.md showed a headwater_messages_in_created series the broker never writes
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    shown = re.search(
        r"prints, after the `# HELP` and `# TYPE` lines of each metric:\n\n```text\n(.*?)```", guide, re.S
    )
    assert shown is not None, "docs/metrics.md's example output moved: update this test"
    cli = Cli("--server", broker.address)
    cli("queue", "create", "invoices", "--partitions", "2", "--if-not-exists")
    cli("produce", "invoices", "--partition", "0", "invoice 1 paid", "invoice 2 paid")
    printed = cli("metrics", "--prefix", "headwater_messages_in")
    samples = [line for line in printed.splitlines() if 'queue="invoices"' in line]  # the module's other queues too
    assert sorted(shown.group(1).splitlines()) == sorted(samples)
    # and only the two metrics the guide names have a _created series
    created = {line.split("{")[0].split(" ")[0] for line in cli("metrics").splitlines() if "_created" in line}
    created = {name for name in created if not name.startswith("#")}
    assert created <= {"headwater_request_errors_created", "headwater_storage_flush_duration_seconds_created"}


def test_json_logs_parse_line_by_line(broker):
    with headwater.connect(broker.address) as hw:  # a bad frame is logged by the broker
        hw.admin.list_queues()
    lines = [ln for ln in broker.log.read_text().splitlines() if ln.strip()]
    assert lines
    docs = [json.loads(ln) for ln in lines]  # every line, or this fails naming the line
    assert all({"ts", "level", "logger", "message"} <= d.keys() for d in docs)
    ready = [d for d in docs if d["message"] == "ready"]
    assert ready and ready[0]["address"].endswith(f":{broker.port}")  # an extra field, as a key of its own


def test_metrics_off_answers_clearly(tmp_path):
    b = BrokerProcess(tmp_path / "data", "--set", "metrics=false").start()
    try:
        with headwater.connect(b.address) as hw:
            with pytest.raises(UsageError, match="metrics=false"):
                hw.admin.metrics()
        cli = subprocess.run([HEADWATER, "--server", b.address, "metrics"], capture_output=True, text=True)
        assert cli.returncode != 0 and "metrics=false" in cli.stderr and "Traceback" not in cli.stderr
    finally:
        b.terminate()


def test_embedded_broker_keeps_metrics_once_enabled(tmp_path):
    with headwater.open(tmp_path / "data") as hw:
        with pytest.raises(UsageError, match="enable_metrics"):
            hw.admin.metrics()
        hw.service.enable_metrics()
        hw.admin.create_queue("local")
        hw.send("local", b"hello")
        exp = hw.admin.metrics_exposition()
    assert exp.content_type.startswith("text/plain; version=0.0.4")
    assert value(families(exp.text), "headwater_messages_in", "headwater_messages_in_total", queue="local") == 1


def test_each_broker_of_a_cluster_reports_the_partitions_it_leads(cluster):
    with headwater.connect(cluster.address(1)) as hw:
        hw.admin.create_queue("spread", partitions=6)

        def placed() -> dict[int, int] | None:
            parts = hw.admin.cluster_metadata(["spread"]).queue("spread").partitions
            if any(p.leader not in cluster.brokers for p in parts):
                return None
            return {b: sum(1 for p in parts if p.leader == b) for b in cluster.brokers}

        led = eventually(placed, what="a leader for every partition")

    def reported(broker_id: int) -> dict:
        with cluster.connect(broker_id) as hw:
            return families(hw.admin.metrics())

    def agrees() -> bool:
        return all(value(reported(b), "headwater_partitions_led", queue="spread") == n for b, n in led.items())

    eventually(agrees, what="every broker reporting the partitions it leads")
    assert sum(led.values()) == 6
    for b in cluster.brokers:
        fams = reported(b)
        assert value(fams, "headwater_partitions_offline", queue="spread") == 0
        assert value(fams, "headwater_partitions_under_replicated", queue="spread") == 0


def test_each_broker_of_a_cluster_drops_a_deleted_queues_series(cluster):
    # a cluster deletes a queue on every broker as it follows the cluster, not through
    # Broker.delete_queue: each must drop the queue's series then
    with headwater.connect(cluster.address(1)) as hw:
        hw.admin.create_queue("fleeting", partitions=3)
        for p in range(3):
            hw.send("fleeting", b"x", partition=p)

    def naming(broker_id: int) -> bool:
        with cluster.connect(broker_id) as hw:
            return "fleeting" in _queues_named(hw.admin.metrics())

    leaders = [b for b in cluster.brokers if naming(b)]
    assert leaders, "no broker counted the produces"
    with headwater.connect(cluster.address(1)) as hw:
        hw.admin.delete_queue("fleeting")
    eventually(lambda: not any(naming(b) for b in cluster.brokers), what="no broker naming the deleted queue")


def test_asyncio_client_reads_them_too(broker):
    import asyncio

    import headwater.aio

    async def read() -> str:
        async with await headwater.aio.connect(broker.address) as hw:
            return await hw.admin.metrics()

    assert "headwater_build_info" in families(asyncio.run(read()))


def test_offline_and_under_replicated_partitions_as_the_controller_sees_them():
    """Broker 2 is the controller; broker 3 is gone: its partition is offline (counted by the
    controller alone), and a partition broker 2 leads with a copy on 3 is under-replicated."""
    from types import SimpleNamespace

    from headwater.broker.metrics import _cluster
    from headwater.model.cluster import BrokerAddress, ClusterMetadata, PartitionLocation, QueueLocations

    def md(controller: int) -> ClusterMetadata:
        parts = [
            PartitionLocation(partition=0, leader=2, leader_epoch=1, replicas=[2]),
            PartitionLocation(partition=1, leader=2, leader_epoch=1, replicas=[2, 3]),
            PartitionLocation(partition=2, leader=3, leader_epoch=1, replicas=[3]),
            PartitionLocation(partition=3, leader=-1, leader_epoch=1, replicas=[1]),
        ]
        return ClusterMetadata(
            cluster_id="c",
            controller=controller,
            brokers=[BrokerAddress(broker_id=b, host="h", port=b, epoch=1) for b in (1, 2)],
            queues=[QueueLocations(name="q", queue_id=1, partitions=parts)],
        )

    def figures(me: int, controller: int) -> dict[str, float]:
        broker = SimpleNamespace(cluster=SimpleNamespace(broker_id=me), metadata=lambda _q: md(controller))
        return {f.name: f.samples[0].value for f in _cluster(broker)}

    assert figures(2, 2) == {
        "headwater_partitions_led": 2,
        "headwater_partitions_offline": 2,
        "headwater_partitions_under_replicated": 1,
    }
    assert figures(1, 2) == {
        "headwater_partitions_led": 0,
        "headwater_partitions_offline": 0,
        "headwater_partitions_under_replicated": 0,
    }


def test_a_coordinator_reports_its_groups_lag_on_every_partition_of_a_cluster(cluster):
    """The group's coordinator asks the other partitions' leaders for their log ends, so the
    cluster's lag series are the CLI's for every partition, each reported once."""
    with headwater.connect(cluster.address(1)) as hw:
        hw.admin.create_queue("lag-spread", partitions=6)
        eventually(
            lambda: all(
                p.leader in cluster.brokers
                for p in hw.admin.cluster_metadata(["lag-spread"]).queue("lag-spread").partitions
            ),
            what="a leader for every partition",
        )
        for p in range(6):
            hw.send_batch("lag-spread", [b"m"] * (10 + p), partition=p)
        with hw.consumer(group="spread-readers") as c:
            c.commit({("lag-spread", p): p for p in range(6)})
    want = {str(p): float(10 + p - p) for p in range(6)}

    def reported() -> dict[str, float] | None:
        got: dict[str, float] = {}
        for b in cluster.brokers:
            with cluster.connect(b) as hw:
                for s in families(hw.admin.metrics())["headwater_consumer_lag"].samples:
                    if s.labels.get("group") == "spread-readers":
                        assert s.labels["partition"] not in got, "a partition's lag reported twice"
                        got[s.labels["partition"]] = s.value
        return got if got == want else None

    eventually(reported, what="the coordinator's lag on all six partitions")
