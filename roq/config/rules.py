"""The rules that tie settings together. Each setting's own range is declared next to its field
(roq/config/declare.py) and checked before these."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roq.config.clients import PUBLISH_MESSAGE_COST
from roq.errors import ConfigError

if TYPE_CHECKING:
    from roq.config.loading import Config


def check_across(c: Config) -> None:
    """The first rule across settings that `c` breaks, as a ConfigError saying why the rule is there."""
    if c.hcm.restart_backoff_max < c.hcm.restart_backoff:
        raise ConfigError("hcm.restart_backoff_max must be >= hcm.restart_backoff")
    if 0 < c.hcm.hung_timeout < 3 * c.exchange.stats_interval:
        raise ConfigError("hcm.hung_timeout must be 0 (never) or at least 3 x exchange.stats_interval: an "
                          "exchange reports once per interval, and a healthy one must not look hung")
    if c.hcm.failed_cooloff < c.hcm.restart_window:
        raise ConfigError("hcm.failed_cooloff must be >= hcm.restart_window: a shorter cool-off would "
                          "restart a flapping exchange more often than hcm.max_restarts allows")
    if c.exchange.publisher_ttl <= c.client.replay_seconds:
        raise ConfigError("exchange.publisher_ttl must be longer than client.replay_seconds: a publisher "
                          "forgotten sooner could resend messages the exchange no longer knows it had")
    if c.exchange.replay_budget_bytes < 2 * c.exchange.fetch_max_bytes:
        raise ConfigError("exchange.replay_budget_bytes must be at least 2 x exchange.fetch_max_bytes")
    if c.exchange.max_batch_bytes < c.exchange.max_message_bytes:
        raise ConfigError("exchange.max_batch_bytes must be >= exchange.max_message_bytes")
    if c.security.curve and not c.security.keys_dir:
        raise ConfigError("security.curve needs security.keys_dir (make one with `roq keys generate DIR`)")
    if c.zk.readers and not c.zk.auth:
        raise ConfigError("zk.readers needs zk.auth: read-only identities only mean something on protected znodes")
    _check_web(c)


def _check_web(c: Config) -> None:
    if bool(c.web.tls_cert) != bool(c.web.tls_key):
        raise ConfigError("web.tls_cert and web.tls_key go together: give both (HTTPS) or neither")
    if c.web.auth and not c.web.tokens_file:
        raise ConfigError("web.auth needs web.tokens_file "
                          "(make one with `roq web token add NAME --role admin --file F`)")
    largest = 2 * c.web.max_body_bytes + c.web.max_request_messages * PUBLISH_MESSAGE_COST
    if c.web.publish_memory_bytes < largest:
        raise ConfigError(f"web.publish_memory_bytes ({c.web.publish_memory_bytes}) must be at least {largest}: "
                          "2 x web.max_body_bytes + web.max_request_messages x "
                          f"{PUBLISH_MESSAGE_COST}, what the largest request costs")
