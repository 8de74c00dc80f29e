"""The command line at its edges: values too large for the wire or the OS, Unicode digits,
Ctrl-C in the middle of a produce, a broker that cannot listen, a consume that is a real
group member. Each ends in one ``error:`` line (exit 1) or a usage error (exit 2), the
same embedded and over ``--server``; never a traceback or the codec's wording."""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest

import headwater
from headwater.cli.output import iso_utc
from headwater.errors import GroupNotFoundError
from tests.support.broker_process import HEADWATER, BrokerProcess
from tests.support.command_line import Cli, Follower, subprocess_env

HUGE = "99999999999999999999999"


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "served").start()
    yield b
    assert b.terminate() == 0, b.log.read_text()[-2000:]


@pytest.fixture
def local(tmp_path) -> Cli:
    cli = Cli("--data", str(tmp_path / "d"))
    cli("queue", "create", "jobs", "--partitions", "2")
    cli("produce", "jobs", "--key", "k1", "a", "b")
    return cli


def _usage_error(cli: Cli, *args: str) -> str:
    code, _, err = cli.run(*args)
    assert code == 2, (args, code, err)
    return err


# -- 1. a ttl that does not fit ---------------------------------------------------------


def test_ttl_longer_than_100_years_is_refused_with_its_range(local):
    err = local.error("queue", "create", "tq", "--ttl", "99999999999999999999w")
    assert "--ttl" in err and "3,155,760,000 s (100 years, 36525d)" in err
    assert "36526d" not in local("queue", "list")
    local.error("queue", "create", "tq", "--ttl", "36526d")
    assert "ttl 36525d" in local("queue", "create", "tq", "--ttl", "36525d")
    assert "tq" in local("queue", "list")  # and the store still answers


# -- 3. numbers the CLI used to pass on until something overflowed ----------------------


@pytest.mark.parametrize(
    "args",
    [
        ("scan", "jobs", "--limit", HUGE),
        ("find", "jobs", "--key", "k1", "--limit", HUGE),
        ("consume", "jobs", "--timeout", "inf", "--limit", "1"),
        ("consume", "jobs", "--timeout", "nan", "--limit", "1"),
        ("status", "--interval", "inf"),
        ("produce", "jobs", "--partition", HUGE, "x"),
        ("queue", "create", "big", "--partitions", HUGE),
    ],
)
def test_out_of_range_numbers_are_usage_errors(local, args):
    err = _usage_error(local, *args)
    assert "Invalid value" in err


@pytest.mark.parametrize(
    "args, words",
    [
        (("scan", "jobs", "--from", "²"), "'²' is not a position"),
        (("scan", "jobs", "--partitions", "²"), "is not a partition list"),
        (("scan", "jobs", "--partitions", "0-99999999999"), "at most 100,000 partitions"),
        (("scan", "jobs", "--from", "-99999999999w"), "out of range"),
        (("scan", "jobs", "--from", "-1" + "0" * 400 + "w"), "out of range"),
        (("scan", "jobs", "--from", HUGE), "offsets go from 0 to"),
        (("produce", "jobs", "--delay", "1" + "0" * 400, "x"), "a delay is at most"),
    ],
)
def test_out_of_range_values_are_one_error_line(local, args, words):
    assert words in local.error(*args)


def test_a_bad_connect_timeout_is_an_error_line(monkeypatch):
    for bad in ("abc", "inf", "0", "-1"):
        monkeypatch.setenv("HEADWATER_CONNECT_TIMEOUT_S", bad)
        err = Cli("--server", "127.0.0.1:9").error("queue", "list")
        assert "HEADWATER_CONNECT_TIMEOUT_S" in err, err


# -- 4. the same answer embedded and over the network -----------------------------------


def test_extremes_give_the_same_answer_both_ways(local, broker):
    remote = Cli("--server", broker.address)
    remote("queue", "create", "jobs", "--partitions", "2")
    remote("produce", "jobs", "--key", "k1", "a", "b")
    for cli in (local, remote):
        err = cli.error("scan", "jobs", "--from", "-99999999999w")
        assert "out of range" in err and "encode" not in err
        assert "ttl" in cli.error("queue", "create", "tq", "--ttl", "99999999999999999999w")
        assert "Invalid value" in _usage_error(cli, "find", "jobs", "--key", "k1", "--limit", HUGE)
        assert "offsets go from 0" in cli.error("scan", "jobs", "--from", HUGE)
        assert len(cli.records("scan", "jobs", "--from", "-1000w")) == 2  # far back, but in range


# -- 8. errors list the forms of the option at hand ------------------------------------


def test_errors_list_exactly_the_forms_each_option_takes(local):
    err = local.error("consume", "jobs", "--from", "bogus")  # the forms of scan --from, one parser
    assert "'earliest', 'latest', -N (the last N messages" in err and "a message id" in err
    err = local.error("group", "reset", "g", "--queue", "jobs", "--to", "bogus")  # the forms of scan --from
    assert "'earliest', 'latest', -N (the last N messages" in err and "a time" in err
    err = local.error("subscriber", "add", "jobs", "s", "--from", "bogus")
    assert "'earliest', 'latest', an offset" in err and "message id" not in err
    err = local.error("produce", "jobs", "--at", "+bad", "x")
    assert err.startswith("error: --at: '+bad'") and "--delay" not in err
    err = local.error("produce", "jobs", "--at", "tomorrow", "x")
    assert "+15m" in err and "-15m" not in err


# -- 9. Ctrl-C in the middle of a produce ----------------------------------------------


def test_ctrl_c_during_produce_says_how_many_were_sent(broker):
    with headwater.connect(broker.address) as hw:
        hw.admin.create_queue("bigq")
        proc = subprocess.Popen(
            [HEADWATER, "--server", broker.address, "produce", "bigq", "--quiet", "--batch-size", "100"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=subprocess_env(),
        )
        assert proc.stdin is not None
        proc.stdin.write(b"".join(b"%d\n" % i for i in range(1000)))
        proc.stdin.flush()
        deadline = time.monotonic() + 20
        while hw.admin.describe_queue("bigq").partitions[0].end_offset < 1000:
            assert time.monotonic() < deadline, "the lines were not sent"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # while it waits for more input
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 130
    assert "sent 1,000 message(s) to queue 'bigq'" in err.decode()


# -- 10. a broker that cannot listen ---------------------------------------------------


def test_serve_that_cannot_listen_leaves_no_new_directory(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = Cli("--data", str(tmp_path / "new")).run("serve", "--port", str(port))
    assert code == 1 and "address is in use" in err
    assert not (tmp_path / "new").exists()
    code, _, err = Cli("--data", str(tmp_path / "new2")).run("serve", "--host", "999.1.1.1", "--port", "0")
    assert code == 1 and "'999.1.1.1'" in err, err
    assert not (tmp_path / "new2").exists()


def test_serve_names_the_http_listener_that_cannot_listen_and_its_own_flags(tmp_path):
    # the HTTP API's port in use, or its host unknown, was reported as the broker's
    # address with --port/--host, though the broker's port was free
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = Cli("--data", str(tmp_path / "new")).run("serve", "--port", "0", "--http-port", str(port))
    assert code == 1
    assert (
        f"error: the HTTP API cannot listen on 127.0.0.1:{port}: the address is in use (another broker, or "
        f"another program); choose another with --http-port or --http-host"
    ) in " ".join(err.split()), err
    assert not (tmp_path / "new").exists()
    args = ("serve", "--port", "0", "--http-port", str(port), "--http-host", "nosuchhost.invalid")
    code, _, err = Cli("--data", str(tmp_path / "new2")).run(*args)
    err = " ".join(err.split())
    assert code == 1 and "the HTTP API cannot listen on nosuchhost.invalid:" in err, err
    assert "the host 'nosuchhost.invalid' is not an address" in err and "--http-port or --http-host" in err
    assert not (tmp_path / "new2").exists()


# -- 6. delay stats: the real next due time --------------------------------------------


def test_delay_stats_next_due_is_the_message_time_not_its_bucket_start(local):
    due = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2, minutes=37, seconds=11)
    local("produce", "jobs", "--at", due.strftime("%Y-%m-%dT%H:%M:%SZ"), "later")
    stats = json.loads(local("delay", "stats", "--json"))
    assert stats["next_due_ms"] == int(due.timestamp() * 1000)
    assert iso_utc(stats["next_due_ms"]) in local("delay", "stats")


# -- 2. consume --group is a member of the group ---------------------------------------


def _members(address: str, group: str, *, stable: bool = False) -> int:
    """How many members ``group`` has (with ``stable``: 0 until every one of them holds
    exactly its target, the rebalance settled)."""
    with headwater.connect(address) as hw:
        try:
            d = hw.service.describe_group(group)
        except GroupNotFoundError:
            return 0
        return 0 if stable and d.state != "stable" else len(d.members)


def _take(f: Follower, timeout_s: float) -> list[str]:
    """The next record of ``f``, if one comes within ``timeout_s`` (without killing it)."""
    try:
        line = f._lines.get(timeout=timeout_s)
    except queue.Empty:
        return []
    if not line:
        return []
    f.records.append(json.loads(line))
    return [f.records[-1]["value"]]


def test_consume_group_is_a_member_reset_is_refused_and_members_share(broker):
    cli = Cli("--server", broker.address)
    cli("queue", "create", "jobs", "--partitions", "4")
    follower = Follower(
        "--server", broker.address, "consume", "jobs", "--group", "live", "--from", "earliest", "--json"
    )
    try:
        cli("produce", "jobs", "one")
        follower.read(1)
        err = cli.error("group", "reset", "live", "--queue", "jobs", "--to", "earliest", "--execute")
        assert "live" in err
        err = cli.error("consume", "jobs", "--group", "live", "--from", "-1h", "--timeout", "0")
        assert "--from POSITION" in err
    finally:
        follower.proc.send_signal(signal.SIGINT)
        code, err = follower.finish()
    assert code == 0, err
    cli("group", "reset", "live", "--queue", "jobs", "--to", "earliest", "--execute")  # no member now
    # two members side by side print each message once between them
    first = Follower("--server", broker.address, "consume", "jobs", "--group", "dup", "--from", "earliest", "--json")
    second = Follower("--server", broker.address, "consume", "jobs", "--group", "dup", "--from", "earliest", "--json")
    try:
        deadline = time.monotonic() + 20
        while _members(broker.address, "dup", stable=True) < 2:  # the rebalance settled: each holds its half
            assert time.monotonic() < deadline, "the two consumes did not both join"
            time.sleep(0.1)
        values = [f"m{i}" for i in range(40)]
        for v in values:
            cli("produce", "jobs", v)
        got: list[str] = []
        deadline = time.monotonic() + 20
        while len(got) < len(values) + 1 and time.monotonic() < deadline:
            for f in (first, second):
                got += _take(f, 0.2)
    finally:
        for f in (first, second):
            if f.proc.poll() is None:
                f.proc.send_signal(signal.SIGINT)
        codes = [f.finish()[0] for f in (first, second)]
    assert codes == [0, 0]
    assert sorted(got) == sorted(["one", *values])  # once each: no member printed another's


def test_python_dash_m_headwater_is_the_headwater_command(tmp_path):
    """``python -m headwater`` runs the CLI where the script is not on PATH."""
    import sys

    d = str(tmp_path / "d")
    made = subprocess.run(
        [sys.executable, "-m", "headwater", "--data", d, "queue", "create", "q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "headwater", "--data", d, "queue", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [q["name"] for q in json.loads(listed.stdout)] == ["q"]


def test_repeats_of_one_ctrl_c_count_once_in_the_block_and_just_after(monkeypatch):
    """``on_ctrl_c``: SIGINTs within CTRL_C_REPEAT_S of a counted one are that one, inside the
    block and just after it (where they would otherwise raise KeyboardInterrupt into what
    follows); later ones count again, and once the window has passed after the block SIGINT
    is the previous handler's again."""
    import os

    from headwater.cli import context

    monkeypatch.setattr(context, "CTRL_C_REPEAT_S", 0.3)
    calls: list[float] = []

    def interrupt() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs in this (the main) thread, at the next bytecode

    with context.on_ctrl_c(lambda signum, frame: calls.append(time.monotonic())):
        interrupt()
        interrupt()  # the repeat `timeout -s INT` sends to the process group
        assert len(calls) == 1
        time.sleep(0.35)
        interrupt()  # a second Ctrl-C
        assert len(calls) == 2
        interrupt()  # and its repeat, arriving as the block ends
    interrupt()  # just after the block: still that Ctrl-C's repeat, dropped
    assert len(calls) == 2
    time.sleep(0.35)
    with pytest.raises(KeyboardInterrupt):  # the previous handler (Python's) has SIGINT again
        interrupt()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_process_ending_just_after_a_ctrl_c_ignores_its_repeats(monkeypatch):
    """Python gives SIGINT its default action while it shuts down: a repeat of the Ctrl-C
    arriving then killed a consume that had stopped cleanly (exit status -2/130). main()
    ignores SIGINT on its way out while repeats may come, and only then."""
    import os

    from headwater.cli import context

    monkeypatch.setattr(context, "CTRL_C_REPEAT_S", 0.3)
    context.ignore_ctrl_c_repeats_at_exit()  # no Ctrl-C came: SIGINT is left as it is
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    try:
        with context.on_ctrl_c(lambda signum, frame: None):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        context.ignore_ctrl_c_repeats_at_exit()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_cluster_moves_are_judged_once_the_view_has_caught_up(monkeypatch):
    """A broker's view learns a move's end and the partition's new leader by two watches:
    between them, `cluster decommission --json` judged a move that had switched "rolled
    back" (seen once under load). A finished move whose leader is not yet the target is
    asked again for a moment; one rolled back stays so."""
    from types import SimpleNamespace

    from headwater.cli import cluster as cli_cluster
    from headwater.model.cluster import ClusterMetadata, PartitionLocation, PartitionMove, QueueLocations

    monkeypatch.setattr(cli_cluster, "WAIT_POLL_S", 0.01)
    monkeypatch.setattr(cli_cluster, "SETTLE_S", 0.5)

    def md(leaders: dict[int, int], moves: list[PartitionMove]) -> ClusterMetadata:
        parts = [PartitionLocation(partition=p, leader=b, leader_epoch=0, replicas=[b]) for p, b in leaders.items()]
        q = QueueLocations(name="q", queue_id=1, partitions=parts)
        return ClusterMetadata(cluster_id="c", controller=1, brokers=[], queues=[q], moves=moves)

    planned = [
        PartitionMove(queue="q", partition=0, source=1, target=2),
        PartitionMove(queue="q", partition=1, source=1, target=3),
    ]
    views = iter(
        [
            md({0: 1, 1: 1}, [planned[0], planned[1]]),  # under way
            md({0: 1, 1: 1}, []),  # both moves gone, the new leaders not seen yet
            md({0: 2, 1: 1}, []),  # partition 0 switched; partition 1 was rolled back
        ]
    )
    last: list[ClusterMetadata] = []

    def cluster_metadata(queues: list[str]) -> ClusterMetadata:
        last[:] = [next(views, last[0] if last else None)]
        return last[0]

    hw = SimpleNamespace(admin=SimpleNamespace(cluster_metadata=cluster_metadata))
    outcomes = cli_cluster._wait_for(hw, planned, progress=False)  # a stand-in for the client
    assert [(o["partition"], o["outcome"]) for o in outcomes] == [(0, "moved"), (1, "rolled back")]


def test_cluster_moves_are_judged_by_the_controllers_record_with_why(monkeypatch):
    """How a move ended is the controller's record (/move_outcomes, in the metadata): a
    rolled back move is judged at once, with its reason, not after a wait for a leader that
    never comes; an outcome older than the plan is not taken for this one."""
    from types import SimpleNamespace

    from headwater.cli import cluster as cli_cluster
    from headwater.model.cluster import (
        ClusterMetadata,
        MoveOutcome,
        PartitionLocation,
        PartitionMove,
        QueueLocations,
    )

    monkeypatch.setattr(cli_cluster, "WAIT_POLL_S", 0.01)
    monkeypatch.setattr(cli_cluster, "SETTLE_S", 30.0)  # a wait this long would fail the test
    asked_ms = 1_700_000_000_000
    why = "broker 1 cannot take it: it held q[1] before, up to offset 100"

    def ended(p: int, outcome: str, at_ms: int, reason: str = "") -> MoveOutcome:
        return MoveOutcome(queue="q", partition=p, source=4, target=p + 1, outcome=outcome, why=reason, ended_ms=at_ms)

    q = QueueLocations(
        name="q",
        queue_id=1,
        partitions=[PartitionLocation(partition=p, leader=4, leader_epoch=0, replicas=[4]) for p in (0, 1)],
    )
    md = ClusterMetadata(
        cluster_id="c",
        controller=1,
        brokers=[],
        queues=[q],  # the view has not learned partition 0's new leader yet
        ended_moves=[
            ended(1, "moved", asked_ms - 3_600_000),  # an hour before the plan: not this one
            ended(0, "moved", asked_ms + 50),
            ended(1, "rolled back", asked_ms + 80, why),
        ],
    )
    hw = SimpleNamespace(admin=SimpleNamespace(cluster_metadata=lambda queues: md))
    planned = [PartitionMove(queue="q", partition=p, source=4, target=p + 1) for p in (0, 1)]
    started = time.monotonic()
    rows = cli_cluster._wait_for(hw, planned, progress=False, asked_ms=asked_ms)
    assert time.monotonic() - started < 5
    assert [(r["partition"], r["outcome"], r.get("why")) for r in rows] == [(0, "moved", None), (1, "rolled back", why)]
