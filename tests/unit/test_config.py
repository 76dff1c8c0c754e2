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
])
def test_bad_settings_are_refused(flag: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(env={}, flags=[flag])


def test_unknown_environment_variable_is_refused() -> None:
    with pytest.raises(ConfigError, match="ROQ_ZK"):
        load_config(env={"ROQ_ZK": "x"})


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
