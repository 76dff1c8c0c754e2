"""The one configuration object, built once: defaults → TOML file → environment → flags.

Every layer is validated against the same declarations (roq/config/declare.py); an unknown key or a
badly typed value is a `ConfigError` before anything starts — never silently dropped. The result is
a frozen tree passed down explicitly.

Environment variables are `ROQ_<SECTION>_<KEY>` (e.g. `ROQ_ZK_HOSTS`, `ROQ_ZK_SESSION_TIMEOUT`);
`ROQ_CONFIG` names the TOML file. Flags are `section.key=value` strings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from roq.config.clients import AutoscaleConfig, ClientConfig, ClusterConfig, LogConfig, SecurityConfig, WebConfig
from roq.config.declare import check_section
from roq.config.rules import check_across
from roq.config.servers import ExchangeConfig, GcmConfig, HcmConfig, ZkConfig, credential_list
from roq.errors import ConfigError

ENV_PREFIX = "ROQ_"
ENV_CONFIG_FILE = "ROQ_CONFIG"
ENV_SEEDS = "ROQ_SEEDS"  # = ROQ_CLUSTER_SEEDS
# What `roq subscribe --group --exec` tells each command about its message (roq/tools/work_cli.py,
# docs/cli.md): a command may run `roq` itself.
MESSAGE_ENV = ("ROQ_QUEUE", "ROQ_GROUP", "ROQ_EXCHANGE", "ROQ_TOPIC", "ROQ_TOPIC_HEX", "ROQ_KEY", "ROQ_KEY_HEX",
               "ROQ_PUBLISHER", "ROQ_SEQ", "ROQ_MESSAGE_ID", "ROQ_DELIVERIES", "ROQ_PRIORITY", "ROQ_HEADERS",
               "ROQ_HEADERS_ENCODING")
# ROQ_ variables that are not settings: the file above, Spark's log level (docs/spark.md), the
# pipeline driver's parent (roq/spark/stats_job.py) and the message variables above.
ENV_NOT_SETTINGS = frozenset({ENV_CONFIG_FILE, "ROQ_SPARK_LOG_LEVEL", "ROQ_PIPELINE_PARENT", *MESSAGE_ENV})


@dataclass(frozen=True)
class Config:
    zk: ZkConfig = field(default_factory=ZkConfig)
    gcm: GcmConfig = field(default_factory=GcmConfig)
    hcm: HcmConfig = field(default_factory=HcmConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    web: WebConfig = field(default_factory=WebConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_toml(self) -> str:
        lines = []
        for section, values in self.to_dict().items():
            lines.append(f"[{section}]")
            for key, value in values.items():
                lines.append(f"{key} = {json.dumps(value)}")
            lines.append("")
        return "\n".join(lines)

    def redacted(self) -> Config:
        """A copy fit to print: ZooKeeper passwords replaced by ***."""
        def hide(credentials: str) -> str:
            return ",".join(f"{c.partition(':')[0]}:***" for c in credential_list(credentials))
        return dataclasses.replace(self, zk=dataclasses.replace(self.zk, auth=hide(self.zk.auth),
                                                                 readers=hide(self.zk.readers)))

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some keys changed, validated like any other layer."""
        return _apply(self, {s: dict(v) for s, v in sections.items()}, "override")

    @property
    def host_name(self) -> str:
        return self.hcm.host or socket.gethostname()


_SECTIONS = {f.name: f.type for f in fields(Config)}


def load_config(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Iterable[str] = (),
    base: Config | None = None,
) -> Config:
    """Build and validate the configuration from every layer, in order, over `base` (the defaults
    unless given: `roq cluster up` passes the settings the previous `up` was started with)."""
    env = os.environ if env is None else env
    config = base or Config()
    path = path or env.get(ENV_CONFIG_FILE)
    if path:
        config = _apply(config, _read_file(Path(path)), f"file {path}")
    config = _apply(config, _from_env(env), "environment")
    config = _apply(config, _from_flags(flags), "flags")
    return config


def config_from_json(text: str) -> Config:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"configuration JSON is invalid: {exc}") from None
    return _apply(Config(), data, "JSON")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path} does not exist") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"configuration file {path} is invalid: {exc}") from None


def _from_env(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    layer: dict[str, dict[str, str]] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        if name == ENV_SEEDS:  # the short spelling of ROQ_CLUSTER_SEEDS every client doc uses
            layer.setdefault("cluster", {})["seeds"] = value
            continue
        section, _, key = name[len(ENV_PREFIX):].lower().partition("_")
        if section not in _SECTIONS or not key:
            raise ConfigError(f"unknown configuration variable {name}")
        layer.setdefault(section, {})[key] = value
    return layer


def _from_flags(flags: Iterable[str]) -> dict[str, dict[str, str]]:
    layer: dict[str, dict[str, str]] = {}
    for flag in flags:
        dotted, eq, value = flag.partition("=")
        section, dot, key = dotted.partition(".")
        if not eq or not dot:
            raise ConfigError(f"bad setting {flag!r}: expected section.key=value")
        layer.setdefault(section, {})[key] = value
    return layer


def _apply(config: Config, layer: Mapping[str, Any], origin: str) -> Config:
    if not isinstance(layer, Mapping):
        raise ConfigError(f"{origin}: expected a table of sections")
    changes = {}
    for section, values in layer.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{origin}: unknown section {section!r}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{origin}: section {section!r} must be a table")
        current = getattr(config, section)
        types = {f.name: f.type for f in fields(current)}
        updates = {}
        for key, value in values.items():
            if key not in types:
                raise ConfigError(f"{origin}: unknown key {section}.{key}")
            updates[key] = _coerce(value, types[key], f"{origin}: {section}.{key}")
        changes[section] = dataclasses.replace(current, **updates)
    result = dataclasses.replace(config, **changes)
    for section in _SECTIONS:
        check_section(section, getattr(result, section))
    check_across(result)
    return result


def _coerce(value: Any, type_name: Any, where: str) -> Any:
    kind = {"str": str, "int": int, "float": float, "bool": bool}[str(type_name)]
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            if kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(text)
            return kind(text)
        except ValueError:
            pass
    raise ConfigError(f"{where} must be {kind.__name__}, got {value!r}")
