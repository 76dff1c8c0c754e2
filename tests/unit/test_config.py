from __future__ import annotations

import pytest

from roq.config import Config, config_from_json, load_config
from roq.errors import ConfigError


def test_defaults_are_valid() -> None:
    assert load_config(env={}).zk.hosts == "127.0.0.1:2181"


def test_layers_apply_in_order(tmp_path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[zk]\nhosts = "a:1"\nsession_timeout = 7\n[hcm]\ncapacity = 2\n')
    c = load_config(f, env={"ROQ_ZK_HOSTS": "b:2", "ROQ_HCM_CAPACITY": "3"}, flags=["hcm.capacity=4"])
    assert (c.zk.hosts, c.zk.session_timeout, c.hcm.capacity) == ("b:2", 7.0, 4)


@pytest.mark.parametrize("flag, fragment", [
    ("zk.nope=1", "unknown key"), ("nope.x=1", "unknown section"), ("zk.session_timeout=x", "must be float"),
    ("hcm.capacity=0", "must be positive"), ("zk.root=relative", "absolute"), ("gcm.port=70000", "TCP port"),
    ("log.level=LOUD", "log.level"), ("hcm.host=bad name", "hcm.host"), ("novalue", "section.key=value"),
    ("exchange.group_max_prefetch=0", "must be positive"),
    ("exchange.group_max_prefetch=100001", "group_max_prefetch must be at most 100000"),
])
def test_bad_settings_are_refused(flag: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(env={}, flags=[flag])


def test_unknown_environment_variable_is_refused() -> None:
    with pytest.raises(ConfigError, match="ROQ_ZK"):
        load_config(env={"ROQ_ZK": "x"})


def test_roq_variables_that_are_not_settings_are_left_alone() -> None:
    config = load_config(env={"ROQ_SPARK_LOG_LEVEL": "INFO", "ROQ_PIPELINE_PARENT": "1", "ROQ_ZK_HOSTS": "zk1:2181"})
    assert config.zk.hosts == "zk1:2181"


def test_missing_or_broken_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.toml", env={})
    (tmp_path / "bad.toml").write_text("[zk\n")
    with pytest.raises(ConfigError, match="invalid"):
        load_config(tmp_path / "bad.toml", env={})


def test_round_trips_through_json_and_toml(tmp_path) -> None:
    c = Config().replace(zk={"hosts": "x:1"}, hcm={"capacity": 3})
    assert config_from_json(c.to_json()) == c
    (tmp_path / "c.toml").write_text(c.to_toml())
    assert load_config(tmp_path / "c.toml", env={}) == c


def test_config_is_frozen() -> None:
    with pytest.raises(Exception):
        Config().zk.hosts = "x"


def test_replication_and_journal_keys_have_their_defaults() -> None:
    c = load_config(env={})
    assert (c.gcm.default_replicas, c.exchange.journal, c.exchange.journal_segment_bytes, c.hcm.data_dir) == \
        (1, "off", 16 << 20, ".roq/data")


def test_replication_and_journal_keys_follow_the_environment() -> None:
    c = load_config(env={"ROQ_GCM_DEFAULT_REPLICAS": "2", "ROQ_EXCHANGE_JOURNAL": "fsync",
                         "ROQ_EXCHANGE_JOURNAL_SEGMENT_BYTES": "65536", "ROQ_HCM_DATA_DIR": "/var/lib/roq"})
    assert (c.gcm.default_replicas, c.exchange.journal, c.exchange.journal_segment_bytes, c.hcm.data_dir) == \
        (2, "fsync", 65536, "/var/lib/roq")
    assert load_config(env={}, flags=["exchange.journal=async"]).exchange.journal == "async"


@pytest.mark.parametrize("flag, fragment", [
    ("gcm.default_replicas=0", "gcm.default_replicas must be 1 or 2"),
    ("gcm.default_replicas=3", "gcm.default_replicas must be 1 or 2"),
    ("exchange.journal=sometimes", "exchange.journal must be off, async or fsync"),
    ("exchange.journal=FSYNC", "exchange.journal must be"),
    ("exchange.journal_segment_bytes=65535", "at least 65536"),
    ("hcm.data_dir= ", "hcm.data_dir"),
])
def test_bad_replication_and_journal_settings_are_refused(flag: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(env={}, flags=[flag])


def test_config_show_prints_the_new_keys(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from roq.cli import main
    monkeypatch.chdir(tmp_path)  # no local cluster's config.toml in sight
    monkeypatch.delenv("ROQ_CONFIG", raising=False)
    result = CliRunner().invoke(main, ["--set", "exchange.journal=fsync", "config", "show"],
                                env={"ROQ_GCM_DEFAULT_REPLICAS": "2"})
    assert result.exit_code == 0, result.output
    for line in ("default_replicas = 2", 'journal = "fsync"', f"journal_segment_bytes = {16 << 20}",
                 'data_dir = ".roq/data"'):
        assert line in result.output.splitlines()


@pytest.mark.parametrize("flag, fragment", [
    ("web.max_streams_per_client=-1", "web.max_streams_per_client must be >= 0"),
    ("web.max_publish_requests_per_client=-1", "web.max_publish_requests_per_client must be >= 0"),
    ("web.max_publish_requests=0", "web.max_publish_requests must be positive"),
    ("web.max_body_bytes=0", "web.max_body_bytes must be positive"),
    ("web.max_request_messages=0", "web.max_request_messages must be positive"),
    ("web.publish_memory_bytes=134217728", "what the largest request costs"),  # < 2 x 64 MiB + 50,000 x 96
])
def test_bad_web_limits_are_refused(flag: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(env={}, flags=[flag])


def test_web_limits_have_their_defaults_and_zero_turns_a_per_caller_bound_off() -> None:
    web = load_config(env={}, flags=["web.max_streams_per_client=0"]).web
    assert (web.max_streams_per_client, web.max_publish_requests, web.max_publish_requests_per_client) == (0, 64, 16)
    assert (web.max_body_bytes, web.max_request_messages, web.publish_memory_bytes) == (64 << 20, 50_000, 256 << 20)
