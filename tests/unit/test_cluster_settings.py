"""The settings of `roq cluster up` persist with the cluster (roq/tools/cluster.py), so a restart keeps its journals.

The end-to-end scenario (a restart keeps the journal and a durable subscriber whole) is
tests/integration/test_cluster_settings.py; here the rules, on real files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roq.config import Config, load_config
from roq.errors import UserError
from roq.tools.cluster import CONFIG_FILE, previous_settings, settings_report


def written(run_dir: Path, config: Config) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_FILE
    path.write_text(config.to_toml())
    return path


def test_a_later_up_starts_from_the_settings_of_the_last_one(tmp_path: Path) -> None:
    assert previous_settings(tmp_path) is None
    started = Config().replace(exchange={"journal": "fsync"}, zk={"hosts": "127.0.0.1:5000"})
    path = written(tmp_path, started)
    previous = previous_settings(tmp_path)
    assert previous is not None and previous.exchange.journal == "fsync"
    plain = load_config(None, env={}, base=previous)  # a plain `up`: nothing given
    assert plain.exchange.journal == "fsync"
    assert settings_report(previous, plain, path) == [
        f"settings kept from the previous `roq cluster up` ({path}):", '  exchange.journal = "fsync"']


def test_what_the_command_gives_wins_and_is_reported(tmp_path: Path) -> None:
    path = written(tmp_path, Config().replace(exchange={"journal": "fsync"}, hcm={"capacity": 3}))
    previous = previous_settings(tmp_path)
    given = load_config(None, env={"ROQ_HCM_CAPACITY": "5"}, flags=["exchange.journal=off"], base=previous)
    assert (given.exchange.journal, given.hcm.capacity) == ("off", 5)
    report = settings_report(previous, given, path)
    assert f"settings changed by this command, persisted in {path}:" in report
    assert '  exchange.journal = "off" (was "fsync")' in report and "  hcm.capacity = 5 (was 3)" in report
    assert not [line for line in report if "zk.hosts" in line or "run_dir" in line]  # each `up` sets them anew


def test_passwords_are_not_printed(tmp_path: Path) -> None:
    path = written(tmp_path, Config().replace(zk={"auth": "roq:secret"}))
    previous = previous_settings(tmp_path)
    assert previous is not None
    assert "secret" not in "\n".join(settings_report(previous, previous, path))


def test_a_file_that_cannot_be_read_is_refused_not_replaced_by_the_defaults(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).write_text("[exchange]\njournal = 7\n")
    with pytest.raises(UserError, match="settings of the previous `roq cluster up` cannot be read"):
        previous_settings(tmp_path)
