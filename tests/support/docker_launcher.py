"""Run a RoQ cluster as Docker containers and break it on purpose (docker-py).

The Python counterpart of the original RoQDockerLauncher: a private bridge
network with a subnet of its own (so a disconnected container can come back
with the same address), ZooKeeper / GCM / HCM containers from the locally
built `roq:test` image, and the faults: kill, stop, start, pause, unpause,
disconnect, reconnect. `teardown()` removes every container and the network,
whatever state they are in; `logs()` collects every container's output for
the report of a failing test.

Client containers (`start_client`) run one of the client programs of this
module from the same image (docker/build-images.sh copies this file to
IMAGE_PATH: it is not part of the installed package), so a publisher, a
subscriber or a consumer group member can be killed or cut off like a host:

    python /opt/roq/test/docker_launcher.py publish --queue q --rate 1000 --token HEX
    python /opt/roq/test/docker_launcher.py subscribe --queue q
    python /opt/roq/test/docker_launcher.py work --queue q --group workers --prefetch 20

Both read their configuration from the environment (`ROQ_*`, `ROQ_CONFIG`) and
print one fact a line on stdout, flushed at once, so what a container printed
before it was killed is still in `docker logs` (`ClientOutput` follows them):

    id <publisher id>                    the publisher's id (derived from --token)
    exchange <xid>                       the exchange it publishes to, on each change
    publishing                           the first message is about to be published
    confirmed <n> sent <m>               on each change: messages 1..n are confirmed
    got <publisher> <runs>               messages handed to the application (runs: 1-5,7)
    ready | stats {json} | closed        subscriber connected; its counters; clean exit
    did <message id> <deliveries>        a group member processed a message (it acks it next)

The client programs need only the core (`roq`); docker-py, which the image does
not have, is imported only by the launcher's own code.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from docker.models.containers import Container

    import docker
    from roq.config import Config

log = logging.getLogger(__name__)

IMAGE = os.environ.get("ROQ_TEST_IMAGE", "roq:test")  # another tag: a branch's own build beside the shared one
IMAGE_PATH = "/opt/roq/test/docker_launcher.py"  # this file in the image (docker/Dockerfile)
SUBNET_POOL = ipaddress.ip_network("172.30.0.0/16")  # /24s are carved out of it for test networks


@dataclass
class Node:
    name: str
    role: str
    container: Container
    ip: str


class DockerLauncher:
    def __init__(self, image: str = IMAGE, client: docker.DockerClient | None = None,
                 env: dict[str, str] | None = None) -> None:
        if client is None:
            import docker
            client = docker.from_env(version="auto")
        self.client = client
        self.image = image
        self.prefix = f"roq-{uuid.uuid4().hex[:8]}"
        self.env = dict(env or {})
        self.nodes: dict[str, Node] = {}
        self.network = self._create_network()

    # ------------------------------------------------------------ set-up

    def _create_network(self) -> Any:
        used = set()
        for net in self.client.networks.list():
            for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
                if cfg.get("Subnet"):
                    used.add(cfg["Subnet"])
        candidates = [str(s) for s in SUBNET_POOL.subnets(new_prefix=24) if str(s) not in used]
        subnet = random.choice(candidates)
        gateway = str(next(ipaddress.ip_network(subnet).hosts()))
        from docker.types import IPAMConfig, IPAMPool
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=subnet, gateway=gateway)])
        return self.client.networks.create(f"{self.prefix}-net", driver="bridge", ipam=ipam,
                                           labels={"roq-test": self.prefix})

    def _run(self, name: str, role: str, args: list[str] | None = None,
             env: dict[str, str] | None = None, command: list[str] | None = None) -> Node:
        """Start container `name`; the entrypoint runs `role` (zookeeper, gcm, hcm) or `command`."""
        container = self.client.containers.run(
            self.image, command or [role, *(args or [])], name=f"{self.prefix}-{name}", hostname=name,
            detach=True, network=self.network.name, environment={**self.env, **(env or {})},
            labels={"roq-test": self.prefix}, init=True,
        )
        container.reload()
        ip = container.attrs["NetworkSettings"]["Networks"][self.network.name]["IPAddress"]
        node = Node(name, role, container, ip)
        self.nodes[name] = node
        log.info("started %s (%s) at %s", name, role, ip)
        return node

    def start_zookeepers(self, count: int = 1) -> str:
        """Start a standalone node or an ensemble; returns the connection string."""
        names = [f"zk{i}" for i in range(1, count + 1)]
        # Members find each other by container name (Docker's DNS on a user network).
        servers = ",".join(f"{i}={self.prefix}-{name}" for i, name in enumerate(names, 1)) if count > 1 else ""
        for i, name in enumerate(names, 1):
            self._run(name, "zookeeper", env={"ZK_ID": str(i), "ZK_SERVERS": servers})
        return self.zk_hosts()

    def zk_hosts(self) -> str:
        return ",".join(f"{n.ip}:2181" for n in self.nodes.values() if n.role == "zookeeper")

    def start_gcm(self, name: str) -> Node:
        return self._run(name, "gcm")

    def start_hcm(self, name: str) -> Node:
        return self._run(name, "hcm", env={"ROQ_HCM_HOST": name})

    def start_client(self, name: str, program: str, *args: str, env: dict[str, str] | None = None) -> Node:
        """A client container: `program` ("publish" or "subscribe", see the module docstring)
        with `args`, configured like the daemons (the launcher's environment, then `env`)."""
        if program not in PROGRAMS:
            raise ValueError(f"unknown client program {program!r}; choose from {', '.join(PROGRAMS)}")
        return self._run(name, "client", env=env,
                         command=["python", IMAGE_PATH, program, *args])

    def output(self, name: str, on_line: Callable[[str], None] | None = None) -> ClientOutput:
        """Follow container `name`'s stdout (see ClientOutput)."""
        return ClientOutput(self.nodes[name].container, on_line)

    def wait_exit(self, name: str, timeout: float = 30.0) -> int:
        """Wait until container `name` has exited; its exit code."""
        return int(self.nodes[name].container.wait(timeout=timeout)["StatusCode"])

    def node_by_ip(self, ip: str) -> Node:
        return next(n for n in self.nodes.values() if n.ip == ip)

    # ------------------------------------------------------------ faults

    def kill(self, name: str) -> None:
        self.nodes[name].container.kill()

    def stop(self, name: str, timeout: int = 10) -> None:
        self.nodes[name].container.stop(timeout=timeout)

    def start(self, name: str) -> None:
        self.nodes[name].container.start()
        self._refresh_ip(name)

    def restart(self, name: str, timeout: int = 10) -> None:
        """`docker restart`: SIGTERM, SIGKILL after `timeout` seconds (0: at once), start again."""
        self.nodes[name].container.restart(timeout=timeout)
        self._refresh_ip(name)

    def _refresh_ip(self, name: str) -> None:
        """A container started again may get another address of the subnet (Docker hands them
        out in start order): keep node.ip current."""
        node = self.nodes[name]
        node.container.reload()
        ip = (node.container.attrs["NetworkSettings"]["Networks"].get(self.network.name) or {}).get("IPAddress")
        if ip:
            node.ip = ip

    def pause(self, name: str) -> None:
        self.nodes[name].container.pause()

    def unpause(self, name: str) -> None:
        self.nodes[name].container.unpause()

    def disconnect(self, name: str) -> None:
        self.network.disconnect(self.nodes[name].container, force=True)

    def reconnect(self, name: str) -> None:
        node = self.nodes[name]
        self.network.connect(node.container, ipv4_address=node.ip, aliases=[name])

    def kill_together(self, *names: str) -> float:
        """SIGKILL several containers at the same moment (one thread each, released together);
        returns the seconds between the first and the last kill's completion."""
        barrier = threading.Barrier(len(names))
        errors: list[BaseException] = []
        done: list[float] = []

        def kill(name: str) -> None:
            try:
                barrier.wait(timeout=10)
                self.kill(name)
                done.append(time.monotonic())
            except BaseException as exc:  # reported below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=kill, args=(name,), name=f"kill-{name}") for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        if errors:
            raise errors[0]
        return max(done) - min(done)

    def restart_together(self, names: Iterable[str], timeout: int = 10) -> float:
        """`docker restart` several containers at once (one thread each); returns the seconds
        until the last one is running again."""
        names = list(names)
        errors: list[BaseException] = []

        def restart(name: str) -> None:
            try:
                self.restart(name, timeout=timeout)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=restart, args=(name,), name=f"restart-{name}") for name in names]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=timeout + 60)
        if errors:
            raise errors[0]
        return time.monotonic() - started

    def is_running(self, name: str) -> bool:
        self.nodes[name].container.reload()
        return self.nodes[name].container.status == "running"

    # ------------------------------------------------------------ reports and clean-up

    def logs(self, tail: int = 200) -> str:
        from docker.errors import APIError, NotFound
        parts = []
        for node in self.nodes.values():
            try:
                text = node.container.logs(tail=tail).decode(errors="replace")
            except (NotFound, APIError) as exc:
                text = f"(no logs: {exc})"
            parts.append(f"----- {node.name} ({node.role}, {node.ip}) -----\n{text}")
        return "\n".join(parts)

    def teardown(self) -> None:
        from docker.errors import APIError, NotFound
        for node in self.nodes.values():
            try:
                node.container.remove(force=True)  # also works on paused containers
            except NotFound:
                pass
            except APIError as exc:
                log.warning("could not remove %s: %s", node.name, exc)
        for container in self.client.containers.list(all=True, filters={"label": f"roq-test={self.prefix}"}):
            container.remove(force=True)
        try:
            self.network.remove()
        except (NotFound, APIError) as exc:
            log.warning("could not remove network: %s", exc)


# ---------------------------------------------------------------- client containers: their output


class ClientOutput:
    """A client container's stdout lines, followed on a thread as they are printed.

    `on_line` (if given) gets each line, on the follower thread. The stream ends when the
    container exits; `final()` then re-reads everything the container printed, the
    authoritative record (a killed container's last lines are in it too)."""

    def __init__(self, container: Container, on_line: Callable[[str], None] | None = None) -> None:
        self.container = container
        self.on_line = on_line
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"follow-{container.name}", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        pending = b""
        try:
            for chunk in self.container.logs(stream=True, follow=True, stdout=True, stderr=False):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    self._add(raw.decode(errors="replace"))
        except Exception as exc:  # the container was removed under us: final() says the rest
            log.info("stopped following %s: %s", self.container.name, exc)
        finally:
            self.ended.set()

    def _add(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)
        if self.on_line is not None:
            self.on_line(line)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def final(self) -> list[str]:
        """Every line the container printed, read again from Docker (call once it has exited)."""
        return self.container.logs(stdout=True, stderr=False).decode(errors="replace").splitlines()


def last_confirmed(lines: Iterable[str]) -> int:
    """The publisher program's last `confirmed N` figure (0 if none): a lower bound of what
    was confirmed when it stopped printing."""
    confirmed = 0
    for line in lines:
        if line.startswith("confirmed "):
            confirmed = int(line.split()[1])
    return confirmed


def publisher_exchange(lines: Iterable[str]) -> str | None:
    """The exchange the publisher program last said it publishes to."""
    current = None
    for line in lines:
        if line.startswith("exchange "):
            current = line.split()[1]
            current = None if current == "-" else current
    return current


GOT = re.compile(r"got (\S+) (\S+)$")


def parse_got(line: str) -> tuple[str, list[int]] | None:
    """(publisher, sequence numbers) of a subscriber program's `got` line, else None."""
    m = GOT.match(line)
    if not m:
        return None
    return m.group(1), expand_runs(m.group(2))


def runs(seqs: Sequence[int]) -> str:
    """Ascending sequence numbers as runs: [1, 2, 3, 5] → "1-3,5"."""
    parts = []
    start = prev = seqs[0]
    for seq in seqs[1:]:
        if seq == prev + 1:
            prev = seq
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = seq
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def expand_runs(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


# ---------------------------------------------------------------- client containers: the programs


class _Printer:
    """print() one line at a time, flushed, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()


def _client_setup(program: str) -> tuple[Config, _Printer, threading.Event]:
    """What every client program starts with: the configuration from the environment, logging
    under the program's name, a line printer, and an event SIGTERM sets."""
    from roq.config import load_config
    from roq.logs import configure
    config = load_config()
    configure(config.log.level, program)
    return config, _Printer(), _stop_on_sigterm()


def _stop_on_sigterm() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


def publish_program(argv: Sequence[str]) -> int:
    """Publish `--count` messages (payload: the sequence number as text, padded to `--size`) at `--rate`, reporting
    every change of the confirmed count and of the exchange; on SIGTERM flush and exit."""
    parser = argparse.ArgumentParser(prog="docker_launcher publish")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--topic", default="load")
    parser.add_argument("--rate", type=float, default=1000.0, help="messages per second")
    parser.add_argument("--count", type=int, default=10**9, help="stop after this many")
    parser.add_argument("--token", default=None, help="the publisher's secret, hex (default: random)")
    parser.add_argument("--subscribers", type=int, default=0, help="wait for this many before publishing")
    parser.add_argument("--prefer", default=None, help="an exchange id to use while it runs")
    parser.add_argument("--size", type=int, default=0, help="pad each payload to this many bytes")
    parser.add_argument("--interval", type=float, default=0.01, help="seconds between confirm checks")
    args = parser.parse_args(argv)
    from roq.client.publisher import Publisher
    config, say, stop = _client_setup("publish")
    pub = Publisher(args.queue, config, token=bytes.fromhex(args.token) if args.token else None,
                    prefer=args.prefer)
    say(f"id {pub.id}")
    sent = 0
    reported = threading.Event()

    def report() -> None:
        confirmed, exchange = -1, ""
        while True:
            done = reported.is_set()
            now_confirmed, now_exchange = pub.confirmed, pub.exchange or "-"
            if now_exchange != exchange:
                exchange = now_exchange
                say(f"exchange {exchange}")
            if now_confirmed != confirmed:
                confirmed = now_confirmed
                say(f"confirmed {confirmed} sent {sent}")
            if done:
                return
            reported.wait(args.interval)

    reporter = threading.Thread(target=report, name="report", daemon=True)
    reporter.start()
    try:
        if args.subscribers:
            while not stop.is_set():
                try:
                    pub.wait_for_subscribers(args.subscribers, timeout=1.0)
                    break
                except Exception:
                    continue
        say("publishing")
        started = time.monotonic()
        while not stop.is_set() and sent < args.count:
            delay = started + sent / args.rate - time.monotonic()
            if delay > 0:
                stop.wait(delay)  # pacing the rate
                continue
            pub.publish(args.topic, str(sent + 1).encode().ljust(args.size, b"."), timeout=60)
            sent += 1
        try:
            pub.flush(30)
        except Exception as exc:
            say(f"flush failed {exc!r}")
    finally:
        reported.set()
        reporter.join(timeout=5)
        say(f"confirmed {pub.confirmed} sent {sent}")
        pub.close(timeout=0)
        say("closed")
    return 0


def subscribe_program(argv: Sequence[str]) -> int:
    """Subscribe and print what is handed to the application (`got` lines) and, every
    `--interval` seconds, the subscriber's counters; on SIGTERM close (saving a durable position)."""
    parser = argparse.ArgumentParser(prog="docker_launcher subscribe")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--topic", action="append", default=[], help="a topic prefix (default: all)")
    parser.add_argument("--durable", default=None, help="resume from and save this position name")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between stats lines")
    args = parser.parse_args(argv)
    from roq.client.subscriber import MessageBatch, Subscriber
    config, say, stop = _client_setup("subscribe")

    def got(batch: MessageBatch) -> None:
        say(f"got {batch.publisher} {runs(batch.seqs)}")

    sub = Subscriber(args.queue, config, topics=args.topic, durable=args.durable, batch_callback=got)
    try:
        while not stop.is_set():
            try:
                sub.wait_connected(timeout=1.0)
                break
            except TimeoutError:
                continue
        say("ready")
        while not stop.wait(args.interval):
            say("stats " + json.dumps({**sub.stats().as_dict(), "connected": sorted(sub.connected)}))
    finally:
        sub.close()
        say("stats " + json.dumps({**sub.stats().as_dict(), "connected": []}))
        say("closed")
    return 0


def work_program(argv: Sequence[str]) -> int:
    """A consumer group member: print `did <id> <deliveries>` once a message is processed (then
    ack it), and `ready` once joined; on SIGTERM leave the group."""
    parser = argparse.ArgumentParser(prog="docker_launcher work")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--topic", action="append", default=[], help="a topic prefix (default: all)")
    parser.add_argument("--group", default="workers")
    parser.add_argument("--prefetch", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.005, help="seconds of work per message")
    args = parser.parse_args(argv)
    from roq.client.group_member import GroupMember
    config, say, stop = _client_setup("work")
    member = GroupMember(args.queue, config, args.topic, group=args.group, prefetch=args.prefetch,
                         auto_ack=False)
    try:
        say("ready")
        while not stop.is_set():
            msg = member.receive(timeout=0.2)
            if msg is None:
                continue
            time.sleep(args.pause)
            say(f"did {msg.id} {msg.deliveries}")
            msg.ack()
    finally:
        member.close()
        say("closed")
    return 0


PROGRAMS: dict[str, Callable[[Sequence[str]], int]] = {"publish": publish_program, "subscribe": subscribe_program,
                                                       "work": work_program}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in PROGRAMS:
        print(f"usage: python docker_launcher.py {{{','.join(PROGRAMS)}}} [options]", file=sys.stderr)
        return 2
    return PROGRAMS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
