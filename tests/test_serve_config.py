"""`headwater serve` settings: defaults < TOML file < HEADWATER_* environment < flags."""

import pytest

from headwater.cli.serve import load_settings
from headwater.errors import InvalidArgumentError


def test_precedence(tmp_path):
    f = tmp_path / "headwater.toml"
    f.write_text('[server]\nport = 7100\nhost = "127.0.0.1"\n[store]\nflush = "sync"\nflush_interval_ms = 50\n')
    server, store = load_settings(f, {}, {})
    assert (server.port, store.flush, store.flush_interval_ms) == (7100, "sync", 50)
    server, store = load_settings(f, {"HEADWATER_PORT": "7200", "HEADWATER_FLUSH": "async"}, {})
    assert (server.port, store.flush) == (7200, "async")
    server, store = load_settings(f, {"HEADWATER_PORT": "7200"}, {"port": 7300, "flush": None})
    assert (server.port, store.flush) == (7300, "sync")  # None flags leave the lower layers alone
    server, store = load_settings(None, {"HEADWATER_DATA": "/x", "HEADWATER_SERVER": "h:1"}, {})
    assert server.port == 7070 and store.flush == "async"  # other HEADWATER_ variables are not settings


def test_cluster_settings_come_from_the_file_the_environment_and_flags(tmp_path):
    f = tmp_path / "headwater.toml"
    f.write_text('[server]\nzookeeper = "zk1:2181,zk2:2181/prod"\nbroker_id = 3\n')
    server, _ = load_settings(f, {}, {})
    assert (server.zookeeper, server.broker_id) == ("zk1:2181,zk2:2181/prod", 3)
    server, _ = load_settings(None, {"HEADWATER_ZOOKEEPER": "zk:2181", "HEADWATER_BROKER_ID": "4"}, {})
    assert (server.zookeeper, server.broker_id) == ("zk:2181", 4)
    server, _ = load_settings(f, {"HEADWATER_BROKER_ID": "4"}, {"broker_id": 5})
    assert server.broker_id == 5
    alone, _ = load_settings(None, {}, {})
    assert (alone.zookeeper, alone.broker_id) == ("", -1)  # no cluster: the broker runs alone
    with pytest.raises(InvalidArgumentError, match="HEADWATER_BROKER_ID: broker_id must be a whole number"):
        load_settings(None, {"HEADWATER_ZOOKEEPER": "zk:2181", "HEADWATER_BROKER_ID": "three"}, {})
    with pytest.raises(InvalidArgumentError, match="broker_id must be a whole number from 0"):
        load_settings(None, {"HEADWATER_ZOOKEEPER": "zk:2181", "HEADWATER_BROKER_ID": "-5"}, {})
    with pytest.raises(InvalidArgumentError, match="needs an id"):
        load_settings(f, {}, {"broker_id": -1})


@pytest.mark.parametrize(
    "text, match",
    [
        ("[server]\nprot = 1\n", "unknown setting \\[server\\] prot"),
        ("[sever]\n", "unknown table"),
        ("[server\n", "cannot read the config file"),
        ("[store]\nflush = 'never'\n", "flush"),
    ],
)
def test_bad_files(tmp_path, text, match):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(InvalidArgumentError, match=match):
        load_settings(f, {}, {})


def test_bad_env_and_flags():
    with pytest.raises(InvalidArgumentError, match="HEADWATER_PORT: port must be a whole number, got 'seventy'"):
        load_settings(None, {"HEADWATER_PORT": "seventy"}, {})
    with pytest.raises(InvalidArgumentError, match="connections_max must be a whole number, got '1.5'"):
        load_settings(None, {}, {"connections_max": "1.5"})
    with pytest.raises(InvalidArgumentError, match="unknown setting 'colour'"):
        load_settings(None, {}, {"colour": "blue"})
    with pytest.raises(InvalidArgumentError, match="port"):
        load_settings(None, {}, {"port": 70000})


def test_a_retired_setting_is_ignored_with_a_warning_wherever_it_is_set(tmp_path, caplog):
    """``read_bytes`` did something once; files and environments that still set it load."""
    cfg = tmp_path / "headwater.toml"
    cfg.write_text("[server]\nread_bytes = 65536\nport = 7171\n")
    with caplog.at_level("WARNING", logger="headwater.server"):
        server, _ = load_settings(cfg, {"HEADWATER_READ_BYTES": "1024"}, {"read_bytes": 5})
    assert server.port == 7171
    assert not hasattr(server, "read_bytes")
    warned = [r.getMessage() for r in caplog.records if "read_bytes" in r.getMessage()]
    assert len(warned) == 3 and all("no longer used" in w for w in warned)
    assert str(cfg) in warned[0] and "environment" in warned[1] and "flags" in warned[2]


def test_every_setting_is_described_and_listed():
    """`headwater serve --settings` lists each field of both tables with its meaning; a new
    setting without one fails here."""
    from typer.testing import CliRunner

    from headwater.broker.server import ServerConfig
    from headwater.cli.main import app
    from headwater.cli.settings import MEANINGS, settings_rows
    from headwater.storage import StoreConfig

    fields = list(ServerConfig.__struct_fields__) + list(StoreConfig.__struct_fields__)
    assert sorted(MEANINGS) == sorted(fields), "describe new settings in headwater/cli/settings.py"
    assert all(row.meaning for row in settings_rows())
    result = CliRunner(env={"COLUMNS": "250", "HEADWATER_DATA": None}).invoke(app, ["serve", "--settings"])
    assert result.exit_code == 0, result.output
    for name in fields:
        assert f" {name} " in result.stdout and f"HEADWATER_{name.upper()}" in result.stdout
    assert "[server]" in result.stdout and "[store]" in result.stdout and "8,388,608" in result.stdout
    assert {(r.name, r.default) for r in settings_rows()} >= {("port", "7070"), ("connections_max", "20,000")}


def test_a_port_in_use_is_one_error_line_naming_it(tmp_path):
    import subprocess

    from tests.support.broker_process import HEADWATER, BrokerProcess

    first = BrokerProcess(tmp_path / "first").start()
    try:
        run = subprocess.run(
            [HEADWATER, "--data", str(tmp_path / "second"), "serve", "--port", str(first.port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        first.terminate()
    assert run.returncode == 1
    assert (
        f"error: cannot listen on 127.0.0.1:{first.port}: the address is in use (another broker, or another "
        f"program); choose another with --port or --host"
    ) in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "name, value, match",
    [
        # each of these used to be taken: the broker then refused every connection (frame_bytes_max,
        # requests_in_flight_max), dropped each one at once (the timeouts) or failed on it (nan)
        ("frame_bytes_max", 100, "frame_bytes_max must be a whole number from 4,096"),
        ("requests_in_flight_max", 5_000_000_000, "requests_in_flight_max must be a whole number from 1 to"),
        ("idle_timeout_s", -1, "idle_timeout_s must be a number of seconds from"),
        ("idle_timeout_s", 0, "idle_timeout_s must be a number of seconds from"),
        ("idle_timeout_s", float("nan"), "idle_timeout_s must be a number of seconds"),
        ("handshake_timeout_s", 0, "handshake_timeout_s must be"),
        ("shutdown_grace_s", -1, "shutdown_grace_s must be"),
        ("send_timeout_s", 0, "send_timeout_s must be"),
        ("push_bytes_max", 0, "push_bytes_max must be a whole number from 1,024"),
        ("push_streams_max", 0, "push_streams_max must be a whole number from 1"),
        ("fetch_wait_ms_max", -5, "fetch_wait_ms_max must be a whole number from 0"),
        ("fetch_bytes_max", 2**31, "fetch_bytes_max .* must leave room in a frame"),
    ],
)
def test_a_setting_out_of_range_stops_the_broker_before_it_listens(name, value, match):
    with pytest.raises(InvalidArgumentError, match=match):
        load_settings(None, {}, {name: value})


def test_an_error_says_where_the_bad_value_came_from(tmp_path):
    f = tmp_path / "headwater.toml"
    f.write_text('[server]\nport = "17311"\nidle_timeout_s = 0\n')
    with pytest.raises(InvalidArgumentError, match=r"bad setting \(.*headwater.toml \[server\]\).*port"):
        load_settings(f, {}, {})
    f.write_text("[server]\nidle_timeout_s = 0\n")
    with pytest.raises(InvalidArgumentError, match=r"\(.*headwater.toml \[server\]\): idle_timeout_s must be"):
        load_settings(f, {}, {})
    with pytest.raises(InvalidArgumentError, match=r"\(HEADWATER_IDLE_TIMEOUT_S\): idle_timeout_s must be"):
        load_settings(None, {"HEADWATER_IDLE_TIMEOUT_S": "0"}, {})


def test_a_setting_given_twice_on_the_command_line_must_agree():
    from headwater.cli.serve import _settings_from_flags

    assert _settings_from_flags({"port": 7313, "host": None}, {"port": "7313"}) == {"port": "7313"}
    with pytest.raises(InvalidArgumentError, match="--port 7313 and --set port=7314 disagree"):
        _settings_from_flags({"port": 7313}, {"port": "7314"})


def test_a_misspelt_variable_is_reported_not_ignored_silently(caplog):
    with caplog.at_level("WARNING", logger="headwater.server"):
        server, _ = load_settings(
            None, {"HEADWATER_IDLE_TIMEOUT": "1", "HEADWATER_DATA": "/x", "HEADWATER_SERVER": "h:1"}, {}
        )
    assert server.idle_timeout_s == 600.0
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "HEADWATER_IDLE_TIMEOUT is not a setting" in warned[0]
