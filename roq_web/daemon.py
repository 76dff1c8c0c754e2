"""`roq-web` (and `roq web`): the console and HTTP API served by uvicorn until SIGTERM/SIGINT.

uvicorn runs in a thread of its own so that the shared daemon entry point (roq/daemon.py) keeps
the signals: a stop request ends the server gracefully, waiting at most STOP_GRACE seconds for
requests in flight (open SSE streams end at once: their clients reconnect elsewhere and resume)."""

from __future__ import annotations

import logging
import socket
import threading

import click
import uvicorn

from roq.config import Config, load_config
from roq.daemon import Stop, run_daemon
from roq.errors import ConfigError
from roq_web.app import create_app

log = logging.getLogger(__name__)

STOP_GRACE = 5


def listening_socket(config: Config) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.web.bind else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY on accepted sockets only then, and
    # without it every keep-alive request after the first waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((config.web.bind, config.web.port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {config.web.bind}:{config.web.port} (web.bind, web.port): "
                          f"{exc.strerror or exc}") from None
    sock.listen(1024)
    return sock


def url_of(config: Config, sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    scheme = "https" if config.web.tls_cert else "http"
    return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}"


def serve(config: Config, stop: Stop, announce: bool = False) -> int:
    """Serve until `stop`; the gateway talks to the GCMs of `cluster.seeds`, never to ZooKeeper."""
    sock = listening_socket(config)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=STOP_GRACE,
        ssl_certfile=config.web.tls_cert or None, ssl_keyfile=config.web.tls_key or None,
        timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    url = url_of(config, sock)
    log.info("serving the console at %s/ and the API at %s/api (docs: %s/docs), auth %s", url, url, url,
             "on" if config.web.auth else "off")
    if announce:
        click.echo(f"RoQ console: {url}/   HTTP API: {url}/api   OpenAPI: {url}/docs"
                   f"{'' if config.web.auth else '   (web.auth is off: anyone who reaches it may administer)'}")
    while not stop.wait(0.5):
        if not thread.is_alive():
            log.error("the web server stopped on its own")
            return 1
    app.state.gateway.closing.set()  # streams end first, or the graceful stop would wait for them
    server.should_exit = True
    thread.join(STOP_GRACE + 2)
    if thread.is_alive():
        server.force_exit = True
        thread.join(2)
    sock.close()
    return 0


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML configuration file")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE", help="override a setting")
def main(config_path: str | None, settings: tuple[str, ...]) -> None:
    """Serve the web console and HTTP API."""
    run_daemon("roq-web", lambda: load_config(config_path, flags=settings), "web",
               lambda config, stop: serve(config, stop))


if __name__ == "__main__":
    main()
