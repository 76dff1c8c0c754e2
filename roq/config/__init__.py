"""The one configuration object, built once: defaults → TOML file → environment → flags
(roq/config/loading.py). Each setting is declared once, with its range and description, in
roq/config/servers.py and roq/config/clients.py; docs/config.md is generated from them
(`python -m roq.config.docs`)."""

from __future__ import annotations

from roq.config.clients import (
    PERMISSION_DEFAULTS,
    PUBLISH_MESSAGE_COST,
    AutoscaleConfig,
    ClientConfig,
    ClusterConfig,
    LogConfig,
    SecurityConfig,
    WebConfig,
)
from roq.config.loading import (
    ENV_CONFIG_FILE,
    ENV_NOT_SETTINGS,
    ENV_PREFIX,
    MESSAGE_ENV,
    Config,
    config_from_json,
    load_config,
)
from roq.config.servers import (
    JOURNAL_MODES,
    MIN_JOURNAL_SEGMENT_BYTES,
    ExchangeConfig,
    GcmConfig,
    HcmConfig,
    ZkConfig,
    credential_list,
)

__all__ = ["Config", "load_config", "config_from_json", "credential_list", "ZkConfig", "GcmConfig", "HcmConfig",
           "ExchangeConfig", "ClientConfig", "AutoscaleConfig", "SecurityConfig", "WebConfig", "ClusterConfig",
           "LogConfig", "ENV_PREFIX", "ENV_CONFIG_FILE", "ENV_NOT_SETTINGS", "MESSAGE_ENV", "JOURNAL_MODES",
           "MIN_JOURNAL_SEGMENT_BYTES", "PERMISSION_DEFAULTS", "PUBLISH_MESSAGE_COST"]
