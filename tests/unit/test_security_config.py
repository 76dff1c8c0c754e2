"""Security settings and key files: validated up front, never overwritten, secrets kept out of sight."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from roq.config import Config, load_config
from roq.errors import ConfigError, InvalidNameError
from roq.security import generate_keys, load_keys, zk_security


@pytest.mark.parametrize("flags, message", [
    (["zk.auth=nopassword"], "zk.auth must be user:password"),
    (["zk.auth=:pw"], "zk.auth must be user:password"),
    (["zk.auth=a:b", "zk.readers=r:1,broken"], "zk.readers must be user:password"),
    (["zk.readers=r:1"], "zk.readers needs zk.auth"),
    (["security.curve=true"], "security.curve needs security.keys_dir"),
    (["security.max_connections_per_client=-1"], "max_connections_per_client"),
    (["gcm.max_queues=0"], "gcm.max_queues must be positive"),
])
def test_bad_security_settings_are_refused(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, flags=flags)


def test_passwords_never_print() -> None:
    config = load_config(env={}, flags=["zk.auth=roq:s3cret", "zk.readers=app:hidden,ops:also"])
    shown = config.redacted().to_toml()
    assert "s3cret" not in shown and "hidden" not in shown and "also" not in shown
    assert 'auth = "roq:***"' in shown and 'readers = "app:***,ops:***"' in shown
    assert config.zk.auth == "roq:s3cret"  # the real object is untouched


def test_acl_grants_all_to_the_cluster_and_read_to_readers() -> None:
    auth, acl = zk_security(Config().zk)
    assert auth == [] and acl is None  # open, as the local demo runs
    auth, acl = zk_security(load_config(env={}, flags=["zk.auth=roq:pw", "zk.readers=app:x"]).zk)
    assert auth == [("digest", "roq:pw")]
    assert [(a.id.id.split(":")[0], a.perms) for a in acl] == [("roq", 31), ("app", 1)]


def test_keys_are_never_overwritten_and_secrets_are_private(tmp_path: Path) -> None:
    written = generate_keys(tmp_path, clients=["app"], admins=["ops"])
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        "server.key", "server.key_secret", "clients/app.key", "clients/app.key_secret",
        "admins/ops.key", "admins/ops.key_secret"}
    for secret in tmp_path.rglob("*.key_secret"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    server = (tmp_path / "server.key_secret").read_bytes()
    with pytest.raises(ConfigError, match="already exist"):
        generate_keys(tmp_path, clients=["ops"])  # taken as an admin name
    with pytest.raises(InvalidNameError):
        generate_keys(tmp_path, clients=["../escape"])
    generate_keys(tmp_path, clients=["late"])
    assert (tmp_path / "server.key_secret").read_bytes() == server and (tmp_path / "clients/late.key").exists()


def test_keys_load_by_role(tmp_path: Path) -> None:
    generate_keys(tmp_path, clients=["app"], admins=["ops"])
    daemon = load_keys(load_config(env={}, flags=["security.curve=true", f"security.keys_dir={tmp_path}"]).security)
    client = load_keys(load_config(env={}, flags=["security.curve=true", f"security.keys_dir={tmp_path}",
                                                  "security.identity=clients/app"]).security)
    assert daemon is not None and client is not None
    assert daemon.public == daemon.server_public and client.public != client.server_public
    assert sorted(daemon.roles().values()) == [("admin", "ops"), ("client", "app"), ("server", "server")]
    assert (daemon.certificate_of("app"), daemon.certificate_of("ops"), daemon.certificate_of("nobody")) == \
        ("clients/app", "admins/ops", None)
    with pytest.raises(ConfigError, match="inside security.keys_dir"):
        load_keys(load_config(env={}, flags=["security.curve=true", f"security.keys_dir={tmp_path}",
                                             "security.identity=../x"]).security)
