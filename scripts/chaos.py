#!/usr/bin/env python3
"""Chaos run (not in CI): faults of several kinds under load, then account.

Starts its own ZooKeeper, 2 GCMs and 3 HCMs on this machine, a queue of 2
exchanges, and a steady publisher and subscriber. Every few seconds it injects
one fault, chosen at random (seeded) from --kinds:

* kill     SIGKILL a random exchange process;
* host     SIGKILL a random HCM (its exchanges die with it) and restart it at once;
* freeze   SIGSTOP an exchange for 3-10 s, then SIGCONT (beyond hcm.hung_timeout its HCM kills it);
* forge    a raw peer sends batches and a hello claiming the steady publisher's id;
* overflow a raw publisher sends batches with first_seq 2^64-1 and 2^63-1 and a float sent_ns;
* hoard    a raw peer sends 300 fetches to a replay socket and never reads (closed at the next fault);
* idflood  a raw peer sends 5,000 hellos with fresh tokens;
* stall    a second subscriber (topics ["fresh-"]) blocks in its callback for 8 s while a
           second publisher sends 2,000 messages on distinct topics; each must arrive once;
* pubhost  SIGKILL a "victim" publisher (a process of its own, in its own process group) and,
           at once, the HCM of the host of its exchange; the HCM is restarted and a new victim
           started. What the victim had confirmed must still arrive once: with --replicas 2
           the exchange's replica has it (with one copy nothing promises it);
* restart  SIGKILL the victim publisher and every HCM (all exchanges and replicas die), then
           restart every HCM: with the journal on (--journal), what the exchanges confirmed
           is on disk and must arrive once.
* hostile  a member of the jobs' consumer group (a publisher of jobs and one honest member run
           throughout) joins every exchange with prefetch 100,000, nacks with requeue all it is
           handed and acks what it does not hold, for 6 s: every confirmed job must be processed
           by the honest member, none dead-lettered;
* httpflood two 50 MiB bodies of newlines (split=lines) and two SSE streams resumed with a token
           naming 72,000 made-up publishers, at a roq-web gateway that runs throughout: refused,
           its memory bounded (peak RSS in the summary);
* fulldisk (journal on; root) host-1's data directory is a 256 MiB tmpfs: a file fills it to the
           last byte for 8 s, then goes: its exchanges stop confirming (storage_full), the leader
           moves them to hosts with room, nothing confirmed is lost, nothing FAILED;
* hungreplica  (--replicas 2) SIGSTOP a replica for 8-15 s, then SIGCONT if it still lives: its
           HCM kills it after hcm.hung_timeout and starts a new one, confirms resume;
* replicaforge (--replicas 2) a raw peer attacks a replica's `repl` socket: a follow of the
           running incarnation and copies jumping ahead or rewriting it from position 1 with
           forged deliveries under the steady publisher's id, forged group state, acks and an
           adoption request, without the copy secret; and six `position` requests naming the
           running incarnation at the replica's `replay` (a seal would restart the exchange).

The victims publish on topic "victim" at --victim-rate and report each cumulative
confirmed count on a pipe (tests/support/docker_launcher.py publish); "confirmed"
for a killed victim is the last count it reported (a lower bound). The steady
publisher (topic "load") lives throughout; its messages are counted against the first
fault after their confirmation (its confirmed count is read just before each fault).

Exchange processes must survive every fault except kill/host/pubhost/restart: exits
of any other exchange pid (as seen in the live znodes) are counted as unintended.
Bounded: --faults faults or --seconds seconds, whichever comes first. Ends with a
table of confirmed / lost / duplicated per fault kind. Exit code 1 on any loss,
duplicate or unintended exchange exit.

    .venv/bin/python scripts/chaos.py --faults 20 --interval 4 --rate 2000 --seed 7
    .venv/bin/python scripts/chaos.py --faults 20 --replicas 2 --journal fsync \
        --kinds kill,host,freeze,pubhost,restart --seed 7

Without --kinds: the first ten kinds, plus pubhost, hungreplica and replicaforge with
--replicas 2, and restart with the journal on.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click
import msgpack
import psutil
import zmq
from rich.console import Console
from rich.table import Table

from roq import protocol
from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.errors import RoqError
from roq.security import secure_client
from roq.state import read_hosts, read_leader, read_live
from roq.tools.zkserver import ZooKeeperServer
from roq.zk import read_json, start_client, stop_client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test helpers (tests/support/) are not installed: run from a checkout
LAUNCHER = ROOT / "tests" / "support" / "docker_launcher.py"

from tests.support import hostile as attacks  # noqa: E402
from tests.support.docker_launcher import last_confirmed  # noqa: E402
from tests.support.helpers import (  # noqa: E402
    Processes,
    SteadyTraffic,
    fast_config,
    mount_small_disk,
    unmount_small_disk,
    wait_until,
)

console = Console(width=160)
HOSTS = ("host-1", "host-2", "host-3")
BASIC_KINDS = ("kill", "host", "freeze", "forge", "overflow", "hoard", "idflood", "stall", "hostile", "httpflood")
REPLICA_KINDS = ("pubhost", "hungreplica", "replicaforge")
KINDS = (*BASIC_KINDS, *REPLICA_KINDS, "restart", "fulldisk")
SMALL_DISK_HOST, SMALL_DISK_BYTES, FULL_SECONDS = "host-1", 256 << 20, 8.0
VICTIM_TOPIC = "victim"
QUEUE = "chaos"
STALL_MESSAGES = 2_000
STALL_SECONDS = 8.0
HOSTILE_SECONDS = 6.0
JOBS_RATE = 200.0  # jobs per second for the consumer group the hostile member attacks


class Traffic(SteadyTraffic):
    """SteadyTraffic that counts only its own topic ("load"): the stall fault's messages on
    "fresh-..." reach this all-topics subscriber too. Anything on "load" that is not one of the
    steady publisher's numbers (a forged message getting through) is counted apart."""

    foreign = 0
    victims: Counter[tuple[str, int]] | None = None  # (publisher, seq) → deliveries, topic "victim"

    def _on_message(self, msg: Any) -> None:
        if msg.topic == VICTIM_TOPIC and self.victims is not None:
            with self._lock:
                self.victims[(msg.publisher, msg.seq)] += 1
            return
        if msg.topic != "load":
            return
        if msg.publisher != self.pub.id or not msg.payload.isdigit():
            self.foreign += 1
            return
        super()._on_message(msg)


class Stall:
    """A second subscriber on "fresh-" whose callback blocks once per round, and a second
    publisher sending STALL_MESSAGES messages on distinct topics per round."""

    def __init__(self, config) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.block_next = threading.Event()
        self.sent = 0
        self.rounds = 0
        self.errors: list[str] = []
        self.sub = Subscriber(QUEUE, config, topics=["fresh-"], callback=self._on_message)
        self.pub = Publisher(QUEUE, config)
        self._serial = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.fillers: list[Path] = []  # the fulldisk kind's files, removed at the end whatever happens

    def _on_message(self, msg: Any) -> None:
        if self.block_next.is_set():
            self.block_next.clear()
            time.sleep(STALL_SECONDS)  # the subscriber's I/O thread is stuck here meanwhile
        with self.lock:
            self.counts[msg.topic] += 1

    def start_round(self) -> str:
        self.rounds += 1
        first = self.rounds * 100_000
        thread = threading.Thread(target=self._round, args=(first,), name=f"stall-{self.rounds}", daemon=True)
        self.threads.append(thread)
        thread.start()
        return f"round {self.rounds}: {STALL_MESSAGES} messages on fresh-{first}..fresh-{first + STALL_MESSAGES - 1}"

    def _round(self, first: int) -> None:
        with self._serial:
            try:
                self.block_next.set()
                for i in range(first, first + STALL_MESSAGES):
                    self.pub.publish(f"fresh-{i}", b"%d" % i, timeout=60)
                    self.sent += 1
                self.pub.flush(60)
            except Exception as exc:
                self.errors.append(f"round at {first}: {exc!r}")

    def expected(self) -> list[str]:
        out = []
        for r in range(1, self.rounds + 1):
            out += [f"fresh-{i}" for i in range(r * 100_000, r * 100_000 + STALL_MESSAGES)]
        return out[:self.sent] if self.sent < len(out) else out

    def finish(self, timeout: float) -> dict[str, int]:
        for thread in self.threads:
            thread.join(timeout=timeout)
        expected = self.expected()
        try:
            wait_until(lambda: all(t in self.counts for t in expected), timeout=timeout,
                       message="every stalled-subscriber message")
        except AssertionError as exc:
            self.errors.append(str(exc))
        with self.lock:
            return {"sent": self.sent, "received": sum(1 for t in expected if t in self.counts),
                    "duplicates": sum(1 for t in expected if self.counts[t] > 1),
                    "extra": sum(1 for t in self.counts if t not in set(expected)),
                    "gaps": self.sub.gaps, "sub_duplicates": self.sub.duplicates}

    def close(self) -> None:
        self.block_next.clear()
        self.pub.close(timeout=0)
        self.sub.close()


class Jobs:
    """A consumer group under attack: a publisher of jobs (topic "jobs") at JOBS_RATE, one honest
    member ("workers", prefetch 50) that records each job it processes, and a subscriber of the
    group's dead letters. Every confirmed job must be processed, and none dead-lettered, whatever
    the hostile member does (a job may be processed twice only after an exchange died with it)."""

    def __init__(self, config) -> None:
        self.processed: Counter[int] = Counter()
        self.dead = 0
        self.lock = threading.Lock()
        self.hostile_seen: Counter[str] = Counter()
        self.member = Subscriber(QUEUE, config, topics=["jobs"], group="workers", prefetch=50,
                                 callback=self._process)
        self.dead_letters = Subscriber(QUEUE, config, topics=["roq.dead/workers"], callback=self._dead)
        self.pub = Publisher(QUEUE, config)
        self.sent = 0
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._publish, name="jobs", daemon=True)

    def _process(self, msg: Any) -> None:
        with self.lock:
            self.processed[int(msg.payload)] += 1

    def _dead(self, msg: Any) -> None:
        with self.lock:
            self.dead += 1

    def _publish(self) -> None:
        start = time.monotonic()
        try:
            while not self.stopping.is_set():
                self.pub.publish("jobs", str(self.sent).encode(), timeout=60)
                self.sent += 1
                ahead = self.sent / JOBS_RATE - (time.monotonic() - start)
                if ahead > 0:
                    self.stopping.wait(ahead)
        except Exception as exc:
            self.errors.append(f"jobs publisher: {exc!r}")

    def finish(self, timeout: float) -> dict[str, int]:
        self.stopping.set()
        self.thread.join(timeout=timeout)
        try:
            self.pub.flush(timeout)
        except RoqError as exc:
            self.errors.append(f"jobs publisher: {exc}")
        confirmed = self.pub.confirmed
        try:
            wait_until(lambda: all(i in self.processed for i in range(confirmed)), timeout=timeout,
                       message="every confirmed job processed")
        except AssertionError as exc:
            self.errors.append(str(exc))
        with self.lock:
            return {"confirmed": confirmed, "lost": sum(1 for i in range(confirmed) if i not in self.processed),
                    "twice": sum(1 for n in self.processed.values() if n > 1), "dead_lettered": self.dead}

    def close(self) -> None:
        self.stopping.set()
        self.pub.close(timeout=0)
        self.member.close()
        self.dead_letters.close()


class Victim:
    """A publisher process of its own (own process group) on topic "victim", reporting its
    confirmed count and exchange on a pipe; killed by a fault or stopped at the end."""

    def __init__(self, number: int, config_path: Path, workdir: Path, rate: float) -> None:
        token = secrets.token_bytes(16)
        self.number = number
        self.id = protocol.publisher_id_for(token)
        self.lines: list[str] = []
        self.killed_by: str | None = None
        self.stderr = workdir / f"victim-{number}.log"
        with self.stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(LAUNCHER), "publish", "--queue", QUEUE,
                 "--topic", VICTIM_TOPIC, "--rate", str(rate), "--token", token.hex()],
                env={**os.environ, "ROQ_CONFIG": str(config_path)}, stdout=subprocess.PIPE, stderr=err,
                stdin=subprocess.DEVNULL, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"victim-{number}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:  # what it wrote before a SIGKILL is still in the pipe
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def confirmed(self) -> int:
        return last_confirmed(list(self.lines))

    @property
    def exchange(self) -> str | None:
        for line in reversed(list(self.lines)):
            if line.startswith("exchange "):
                xid = line.split()[1]
                return None if xid == "-" else xid
        return None

    def kill(self, kind: str | None) -> None:
        """SIGKILL its process group; `kind` names the fault (None: clean-up, not a fault)."""
        self.killed_by = kind or self.killed_by
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM: the program stops publishing, flushes (up to 30 s) and reports."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def finish(self, timeout: float = 60.0) -> int:
        """Wait for the process and its last lines; its confirmed count."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(None)
            self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return self.confirmed


class Watch:
    """Exchange pids from the live znodes: which exited, which of those we killed, peak RSS."""

    def __init__(self, zk, paths) -> None:
        self.zk, self.paths = zk, paths
        self.seen: dict[int, tuple[str, str, int]] = {}  # pid → (xid, host, restarts)
        self.procs: dict[int, psutil.Process] = {}
        self.exited: dict[int, float] = {}  # pid → when noticed
        self.intended: set[int] = set()
        self.peak_rss = 0  # one process
        self.peak_total = 0  # all exchange processes together
        self.max_restarts: dict[str, int] = {}
        self.gateway: psutil.Process | None = None
        self.gateway_peak = 0

    def live(self) -> dict[str, dict[str, Any]]:
        try:
            return read_live(self.zk, self.paths, QUEUE)
        except Exception:
            return {}

    def sample(self) -> None:
        for xid, data in self.live().items():
            pid = data.get("pid")
            if isinstance(pid, int) and pid not in self.seen:
                self.seen[pid] = (xid, data.get("host", "?"), data.get("restarts", 0))
                try:
                    self.procs[pid] = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    self.exited.setdefault(pid, time.monotonic())
        total = 0
        for pid, proc in list(self.procs.items()):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    raise psutil.NoSuchProcess(pid)
                rss = proc.memory_info().rss
            except psutil.NoSuchProcess:
                del self.procs[pid]
                self.exited.setdefault(pid, time.monotonic())
                continue
            total += rss
            self.peak_rss = max(self.peak_rss, rss)
        self.peak_total = max(self.peak_total, total)
        if self.gateway is not None:
            try:  # the kernel's high-water mark: peaks between two samples count too
                status = Path(f"/proc/{self.gateway.pid}/status").read_text()
                hwm = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
                self.gateway_peak = max(self.gateway_peak, hwm)
            except (OSError, StopIteration):
                self.gateway = None

    def unintended(self) -> list[tuple[int, str, str]]:
        return [(pid, *self.seen[pid][:2]) for pid in sorted(self.exited) if pid not in self.intended]


def hcm_fates(procs: Processes) -> dict[int, str]:
    """pid → how its HCM saw it end ("exited with code N" / "stopped"), from the HCM logs."""
    fates: dict[int, str] = {}
    for host in HOSTS:
        path = procs.logs.get(host)
        if not path or not path.exists():
            continue
        current: dict[str, int] = {}
        for line in path.read_text(errors="replace").splitlines():
            m = re.search(r"started exchange (\S+) \(pid (\d+)\)", line)
            if m:
                current[m.group(1)] = int(m.group(2))
                continue
            m = re.search(r"exchange (\S+) (exited with code \S+|stopped)", line)
            if m and m.group(1) in current:
                fates[current.pop(m.group(1))] = m.group(2)
    return fates


def failed_lines(procs: Processes) -> list[str]:
    """The HCMs' lines saying an exchange or replica crashed too often and is left alone."""
    found = []
    for host in HOSTS:
        path = procs.logs.get(host)
        if path and path.exists():
            found += [line for line in path.read_text(errors="replace").splitlines() if ": FAILED," in line]
    return found


def dealer(endpoint: str, config) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = 3000  # a frozen exchange never takes the frames: give up, do not hang
    secure_client(sock, config)
    sock.connect(endpoint)
    return sock


def reply_of(sock: zmq.Socket, timeout_ms: int = 5000) -> str:
    if not sock.poll(timeout_ms):
        return "no answer"
    try:
        r = protocol.decode_exchange_reply(sock.recv())
    except protocol.ProtocolError as exc:
        return f"bad reply ({exc})"
    return f"{r.kind}" + (f"/{r.code}" if r.code else "") + (f" seq={r.seq}" if r.kind in ("ack", "resend") else "")


class Chaos:
    def __init__(self, procs: Processes, zk, paths, config, rng: random.Random, traffic: Traffic,
                 stall: Stall, watch: Watch, start_hcm, victim_rate: float) -> None:
        self.procs, self.zk, self.paths, self.config, self.rng = procs, zk, paths, config, rng
        self.traffic, self.stall, self.watch = traffic, stall, watch
        self.start_hcm = start_hcm
        self.victim_rate = victim_rate
        self.victims: list[Victim] = []
        self.marks: list[tuple[str, int]] = []  # (kind, the steady publisher's confirmed count just before)
        self.frozen: list[tuple[int, float]] = []  # (pid, resume at)
        self._frozen_lock = threading.Lock()
        self.hoarders: list[zmq.Socket] = []
        self.counts: Counter[str] = Counter()
        self.jobs: Jobs | None = None  # with the hostile kind
        self.gateway_url = ""  # with the httpflood kind
        self.http_answers: Counter[str] = Counter()
        self.threads: list[threading.Thread] = []
        self.fillers: list[Path] = []  # the fulldisk kind's files, removed at the end whatever happens

    def pick(self) -> tuple[str, dict[str, Any]] | None:
        live = self.watch.live()
        if not live:
            return None
        xid = self.rng.choice(sorted(live))
        return xid, live[xid]

    def inject(self, kind: str) -> str:
        for sock in self.hoarders:  # a hoard lasts until the next fault
            sock.close()
        self.hoarders.clear()
        self.counts[kind] += 1
        self.marks.append((kind, self.traffic.pub.confirmed))
        if kind == "host":
            return self.host()
        if kind == "pubhost":
            return self.pubhost()
        if kind == "restart":
            return self.restart()
        if kind == "stall":
            return self.stall.start_round()
        if kind in ("hungreplica", "replicaforge"):
            return self.on_a_replica(kind)
        if kind in ("hostile", "httpflood", "fulldisk"):
            return getattr(self, kind)()
        target = self.pick()
        if target is None:
            return "no live exchange: skipped"
        try:
            return getattr(self, kind)(*target)
        except zmq.Again:
            return f"{kind} on {target[0]} (pid {target[1]['pid']}): send timed out (exchange not reading, frozen?)"

    def kill(self, xid: str, data: dict[str, Any]) -> str:
        pid = data["pid"]
        self.watch.intended.add(pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return f"SIGKILL exchange {xid} (pid {pid}) on {data['host']}"

    def doomed(self, host: str) -> set[int]:
        """The exchange (and replica) pids that die with `host`'s HCM: intended exits."""
        doomed = {d["pid"] for d in self.watch.live().values() if d.get("host") == host}
        try:
            doomed |= {c.pid for c in psutil.Process(self.procs.procs[host].pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        self.watch.intended |= doomed
        return doomed

    def host(self) -> str:
        host = self.rng.choice(HOSTS)
        doomed = self.doomed(host)
        self.procs.kill(host, signal.SIGKILL)
        self.procs.procs[host].wait(timeout=10)
        self.start_hcm(host)
        return f"SIGKILL HCM {host} and its exchanges (pids {sorted(doomed)}), restarted"

    @property
    def victim(self) -> Victim | None:
        return self.victims[-1] if self.victims and self.victims[-1].killed_by is None else None

    def new_victim(self) -> Victim:
        victim = Victim(len(self.victims) + 1, self.procs.config_path, self.procs.workdir, self.victim_rate)
        self.victims.append(victim)
        return victim

    def pubhost(self) -> str:
        victim = self.victim
        xid = victim.exchange if victim else None
        data = self.watch.live().get(xid) if xid else None
        if victim is None or data is None:
            return "no victim publisher on a live exchange: skipped"
        host = data["host"]
        doomed = self.doomed(host)
        confirmed = victim.confirmed
        victim.kill("pubhost")  # the publisher, then its exchange's host, back to back
        self.procs.kill(host, signal.SIGKILL)
        self.procs.procs[host].wait(timeout=10)
        victim.finish(timeout=10)
        self.start_hcm(host)
        new = self.new_victim()
        return (f"SIGKILL victim {victim.number} ({victim.id}, confirmed >= {confirmed} when killed, "
                f"{victim.confirmed} reported in all) and HCM {host} of its exchange {xid} (pids {sorted(doomed)}), "
                f"HCM restarted, victim {new.number} started")

    def restart(self) -> str:
        victim = self.victim
        if victim is not None:
            victim.kill("restart")
        doomed: set[int] = set()
        for host in HOSTS:
            doomed |= self.doomed(host)
        for host in HOSTS:
            self.procs.kill(host, signal.SIGKILL)
        for host in HOSTS:
            self.procs.procs[host].wait(timeout=10)
        for host in HOSTS:
            self.start_hcm(host)
        said = ""
        if victim is not None:
            victim.finish(timeout=10)
            said = f"victim {victim.number} ({victim.id}, {victim.confirmed} confirmed) and "
        new = self.new_victim()
        return (f"SIGKILL {said}every HCM (pids {sorted(doomed)} with them), every HCM restarted, "
                f"victim {new.number} started")

    def on_a_replica(self, kind: str) -> str:
        replicas = {}
        for xid in self.watch.live():
            data = read_json(self.zk, self.paths.replica_live(QUEUE, xid))
            if data:
                replicas[xid] = data
        if not replicas:
            return "no running replica: skipped"
        xid = self.rng.choice(sorted(replicas))
        return getattr(self, kind)(xid, replicas[xid])

    def hungreplica(self, xid: str, replica: dict[str, Any]) -> str:
        pid = replica["pid"]
        seconds = self.rng.uniform(8, 15)
        os.kill(pid, signal.SIGSTOP)
        with self._frozen_lock:
            self.frozen.append((pid, time.monotonic() + seconds))
        timer = threading.Timer(seconds, self.resume_due)
        timer.daemon = True
        timer.start()
        return f"SIGSTOP replica of {xid} (pid {pid}) on {replica['host']} for {seconds:.1f}s"

    def replicaforge(self, xid: str, replica: dict[str, Any]) -> str:
        live = self.watch.live().get(xid) or {}
        incarnation, next_pos = live.get("incarnation", f"{xid}.0"), (live.get("stats") or {}).get("next_pos", 1)
        frames = attacks.forged_copy_frames(xid, incarnation, next_pos, self.traffic.pub.id)
        answered = attacks.attack_replica_copy(replica["repl"], frames, self.config, wait_ms=500)
        seals = attacks.ask_seals(replica["replay"], incarnation, 6, self.config)
        return (f"{len(frames)} forged frames on the replica of {xid} ({incarnation}): "
                f"{'ANSWERED' if answered else 'no answer'}; 6 positions naming it → {dict(seals)}")

    def hostile(self) -> str:
        """A hostile member of the jobs' group on every exchange, for HOSTILE_SECONDS, in a thread."""
        endpoints = [d["work"] for d in self.watch.live().values() if d.get("work")]
        member = self.jobs.member
        join = protocol.encode_join(member.group, list(member.topics), protocol.MAX_PREFETCH,
                                    round(member.ack_timeout * 1000), member.max_deliveries, member.dead_letter,
                                    False)

        def run() -> None:
            seen = attacks.hostile_member(endpoints, join, HOSTILE_SECONDS, self.config)
            self.jobs.hostile_seen.update(seen)
        thread = threading.Thread(target=run, name="hostile-member", daemon=True)
        self.threads.append(thread)
        thread.start()
        return (f"a member joins group {member.group} on {len(endpoints)} exchanges with prefetch "
                f"{protocol.MAX_PREFETCH}, nacks with requeue all it is handed and acks what it does not hold, "
                f"for {HOSTILE_SECONDS:.0f}s")

    def fulldisk(self) -> str:
        """Fill the small disk of SMALL_DISK_HOST to the last byte, and free it FULL_SECONDS later."""
        filler = self.procs.workdir / SMALL_DISK_HOST / "data" / "filler"
        written = 0
        try:
            with filler.open("wb") as out:
                block = b"\0" * (1 << 20)
                while True:
                    written += out.write(block)
                    out.flush()
        except OSError:
            pass  # ENOSPC: full
        timer = threading.Timer(FULL_SECONDS, lambda: filler.unlink(missing_ok=True))
        timer.daemon = True
        timer.start()
        self.fillers.append(filler)
        on_it = sorted(x for x, d in self.watch.live().items() if d.get("host") == SMALL_DISK_HOST)
        return (f"filled {SMALL_DISK_HOST}'s data disk ({written >> 20} MiB more) for {FULL_SECONDS:.0f}s; "
                f"exchanges there: {on_it or 'none'}")

    def httpflood(self) -> str:
        """Bodies of newlines and streams resumed with a made-up token at the gateway, in a thread."""
        url = self.gateway_url

        def run() -> None:
            answers = attacks.post_newlines(url, QUEUE, 2)
            answers += [attacks.open_stream_with_token(url, QUEUE, attacks.forged_token(72_000)) for _ in range(2)]
            self.http_answers.update(a.split(" ")[0] for a in answers)
        thread = threading.Thread(target=run, name="httpflood", daemon=True)
        self.threads.append(thread)
        thread.start()
        return (f"2 bodies of {attacks.NEWLINE_BODY_BYTES >> 20} MiB of newlines (split=lines) and 2 streams "
                f"resumed with a token of 72,000 made-up publishers, at the gateway")

    def freeze(self, xid: str, data: dict[str, Any]) -> str:
        pid = data["pid"]
        seconds = self.rng.uniform(3, 10)
        if seconds > self.config.hcm.hung_timeout - 1:  # its HCM may kill it as hung: an exit we caused
            self.watch.intended.add(pid)
        os.kill(pid, signal.SIGSTOP)
        self.frozen.append((pid, time.monotonic() + seconds))
        timer = threading.Timer(seconds, self.resume_due)
        timer.daemon = True
        timer.start()
        return f"SIGSTOP exchange {xid} (pid {pid}) for {seconds:.1f}s"

    def resume_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        with self._frozen_lock:
            due = [(pid, at) for pid, at in self.frozen if everything or now + 0.05 >= at]
            self.frozen = [f for f in self.frozen if f not in due]
        for pid, at in due:
            if True:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def forge(self, xid: str, data: dict[str, Any]) -> str:
        victim = self.traffic.pub.id
        sock = dealer(data["pub"], self.config)
        try:
            sock.send(protocol.encode_batch(victim, 10**12, 0, [b"load", b"forged"]))
            first = reply_of(sock)
            sock.send(protocol.encode_batch(victim, 1, 0, [b"load", b"forged"]))
            second = reply_of(sock)
            sock.send(protocol.encode_hello(victim, secrets.token_bytes(16), 10**12))
            third = reply_of(sock)
        finally:
            sock.close()
        return (f"forged {victim} on {xid}: batch far ahead → {first}; batch at 1 → {second}; "
                f"hello, wrong token → {third}")

    def overflow(self, xid: str, data: dict[str, Any]) -> str:
        sock = dealer(data["pub"], self.config)
        token = secrets.token_bytes(16)
        pid = protocol.publisher_id_for(token)
        try:
            sock.send(protocol.encode_hello(pid, token, 1))
            answers = [reply_of(sock)]
            for first_seq in (2**64 - 1, 2**63 - 1):
                sock.send(msgpack.packb(["batch", protocol.DATA_VERSION, pid, first_seq, 0, [b"ovf", b"x"] * 2]))
                answers.append(reply_of(sock))
            sock.send(msgpack.packb(["batch", protocol.DATA_VERSION, pid, 1, 1.5, [b"ovf", b"float"]]))
            answers.append(reply_of(sock))
            sock.send(protocol.encode_batch(pid, 1, 0, [b"ovf", b"fine"]))
            answers.append(reply_of(sock))
        finally:
            sock.close()
        return f"overflow on {xid}: hello, 2^64-1, 2^63-1, float sent_ns, valid → {', '.join(answers)}"

    def hoard(self, xid: str, data: dict[str, Any]) -> str:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.linger = 0
        sock.sndtimeo = 3000
        sock.rcvhwm = 1
        sock.setsockopt(zmq.RCVBUF, 4096)
        secure_client(sock, self.config)
        sock.connect(data["replay"])
        for rid in range(300):
            sock.send(protocol.encode_fetch(rid, "", 0, 0, [b""], 0))
        self.hoarders.append(sock)
        return f"300 fetches hoarded on {xid}'s replay socket (pid {data['pid']})"

    def idflood(self, xid: str, data: dict[str, Any]) -> str:
        sock = dealer(data["pub"], self.config)
        kinds: Counter[str] = Counter()
        try:
            for _ in range(5_000):
                token = secrets.token_bytes(16)
                sock.send(protocol.encode_hello(protocol.publisher_id_for(token), token, 1))
            deadline = time.monotonic() + 10
            while sum(kinds.values()) < 5_000 and time.monotonic() < deadline:
                kinds[reply_of(sock, 1000).split(" seq=")[0]] += 1
        finally:
            sock.close()
        return f"5000 hellos on {xid} (pid {data['pid']}) → {dict(kinds)}"


def fault_of(seq: int, marks: list[tuple[str, int]]) -> str:
    """The kind of the first fault injected after steady message `seq` was confirmed."""
    for kind, confirmed in marks:
        if seq <= confirmed:
            return kind
    return AFTER


AFTER = "(after the last fault)"


def per_kind(traffic: Traffic, chaos: Chaos | None, confirmed: int,
             victims: list[tuple[Victim, int]]) -> dict[str, dict[str, int]]:
    """kind → faults, steady confirmed / lost / duplicated (each message counted against the
    first fault after its confirmation) and victims' confirmed / lost / duplicated (counted
    against the fault that killed their publisher)."""
    marks = chaos.marks if chaos else []
    rows: dict[str, Counter[str]] = {}

    def row(kind: str) -> Counter[str]:
        return rows.setdefault(kind, Counter())

    for kind, _ in marks:
        row(kind)["faults"] += 1
    bound = 0
    for kind, at in [*marks, (AFTER, confirmed)]:
        top = min(at, confirmed)
        if top > bound:
            row(kind)["confirmed"] += top - bound
            bound = top
    with traffic._lock:
        counts = dict(traffic.counts)
        victim_counts = dict(traffic.victims or {})
    for i in range(confirmed):  # the steady payloads are seq - 1
        if i not in counts:
            row(fault_of(i + 1, marks))["lost"] += 1
    for i, n in counts.items():
        if n > 1:
            row(fault_of(i + 1, marks))["duplicated"] += 1
    for victim, got in victims:
        r = row(victim.killed_by or AFTER)
        r["victim confirmed"] += got
        r["victim lost"] += sum(1 for seq in range(1, got + 1) if (victim.id, seq) not in victim_counts)
        r["victim duplicated"] += sum(1 for (pub, _), n in victim_counts.items() if pub == victim.id and n > 1)
    return {kind: dict(r) for kind, r in rows.items()}


@click.command()
@click.option("--faults", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--kinds", default=None,
              help=f"fault kinds to choose from, of {', '.join(KINDS)} [default: {', '.join(BASIC_KINDS)}, "
                   "plus pubhost with --replicas 2 and restart with the journal on]")
@click.option("--interval", type=float, default=4.0, show_default=True, help="seconds between faults")
@click.option("--seconds", type=float, default=150.0, show_default=True, help="hard time limit")
@click.option("--rate", type=float, default=2000.0, show_default=True, help="messages per second")
@click.option("--replicas", type=click.IntRange(1, 2), default=1, show_default=True,
              help="copies of each exchange of the queue (2: a replica on another host)")
@click.option("--journal", type=click.Choice(["off", "async", "fsync"]), default=None,
              help="exchange.journal [default: fsync with the restart kind, else off]")
@click.option("--victim-rate", type=float, default=500.0, show_default=True,
              help="messages per second of each victim publisher (pubhost, restart)")
@click.option("--seed", type=int, default=None)
def main(faults: int, kinds: str | None, interval: float, seconds: float, rate: float, replicas: int,
         journal: str | None, victim_rate: float, seed: int | None) -> None:
    if kinds is None:
        chosen = list(BASIC_KINDS) + (list(REPLICA_KINDS) if replicas == 2 else []) \
            + (["restart"] if journal not in (None, "off") else [])
    else:
        chosen = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = set(chosen) - set(KINDS)
    if unknown or not chosen:
        raise click.BadParameter(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    if journal is None:
        journal = "fsync" if {"restart", "fulldisk"} & set(chosen) else "off"
    if "fulldisk" in chosen and journal == "off":
        raise click.BadParameter("fulldisk needs the journal on (--journal fsync or async)")
    if {"hungreplica", "replicaforge"} & set(chosen) and replicas == 1:
        raise click.BadParameter("hungreplica and replicaforge need --replicas 2")
    if "pubhost" in chosen and replicas == 1:
        console.print("[yellow]pubhost with --replicas 1: a publisher dying with its exchange's host may lose "
                      "what it had confirmed (not guaranteed with one copy)[/yellow]")
    if "restart" in chosen and journal == "off":
        console.print("[yellow]restart with --journal off: what only the exchanges held dies with them "
                      "(not guaranteed without the journal)[/yellow]")
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="roq-chaos-"))
    console.print(f"workdir {workdir}; queue of 2 exchanges, replicas {replicas}, journal {journal}; "
                  f"kinds {', '.join(chosen)}")
    server = ZooKeeperServer(workdir / "zk")
    server.start()
    config = fast_config(server.connect_string)
    if journal != "off":
        config = config.replace(exchange={"journal": journal})
    procs = Processes(config, workdir / "daemons")

    def start_hcm(host: str) -> None:
        procs.hcm(host)  # each host its own hcm.data_dir (journals), under the workdir

    small_disk = None
    if "fulldisk" in chosen:
        small_disk = mount_small_disk(procs.workdir / SMALL_DISK_HOST / "data", SMALL_DISK_BYTES)

    zk = start_client(config)
    from roq.paths import Paths
    paths = Paths(config.zk.root)
    traffic = stall = chaos = None
    jobs: dict[str, int] | None = None
    watch = Watch(zk, paths)
    done = 0
    victims: list[tuple[Victim, int]] = []
    victim_errors: list[str] = []
    errors: list[str] = []
    try:
        procs.gcm("gcm-1")
        procs.gcm("gcm-2")
        for host in HOSTS:
            start_hcm(host)
        wait_until(lambda: read_leader(zk, paths) and len(read_hosts(zk, paths)) == 3, timeout=30,
                   message="cluster")
        with Admin(config) as admin:
            admin.create_queue(QUEUE, exchanges=2, replicas=replicas)
        wait_until(lambda: len(read_live(zk, paths, QUEUE)) == 2, timeout=30, message="exchanges")
        traffic = Traffic(QUEUE, config, rate=rate, max_messages=int(rate * seconds * 1.2))
        traffic.victims = Counter()
        stall = Stall(config)
        stall.sub.wait_connected(timeout=30)
        traffic.start(subscriptions=1)
        chaos = Chaos(procs, zk, paths, config, rng, traffic, stall, watch, start_hcm, victim_rate)
        if {"pubhost", "restart"} & set(chosen):
            chaos.new_victim()
        if "hostile" in chosen:
            chaos.jobs = Jobs(config)
            chaos.jobs.thread.start()
        if "httpflood" in chosen:
            chaos.gateway_url = procs.web("web")
            watch.gateway = psutil.Process(procs.procs["web"].pid)
        deadline = time.monotonic() + seconds
        next_fault = time.monotonic() + interval
        # Every kind at least once when there are enough faults, the rest at random; seeded.
        schedule = rng.sample(chosen, len(chosen))[:faults]
        schedule += [rng.choice(chosen) for _ in range(faults - len(schedule))]
        rng.shuffle(schedule)
        while done < faults and time.monotonic() < deadline:
            watch.sample()
            chaos.resume_due()
            if time.monotonic() < next_fault:
                time.sleep(0.1)
                continue
            kind = schedule[done]
            what = chaos.inject(kind)
            done += 1
            next_fault = time.monotonic() + interval
            bad = watch.unintended()
            console.print(f"fault {done:2d} {kind:8s}: {what}; delivered so far {traffic.received()}"
                          + (f" [red]unintended exits so far: {bad}[/red]" if bad else ""))
        chaos.resume_due(everything=True)
        for sock in chaos.hoarders:
            sock.close()
        chaos.hoarders.clear()
        end = time.monotonic() + 10  # let the last fault's effects show
        while time.monotonic() < end:
            watch.sample()
            time.sleep(0.1)
        if chaos.victim is not None:
            chaos.victim.stop()  # flushes, reports its last count
        for victim in chaos.victims:
            victims.append((victim, victim.finish(timeout=60)))
            if victim.killed_by is None and victim.proc.returncode != 0:
                victim_errors.append(f"victim {victim.number} exited with {victim.proc.returncode} "
                                     f"(see {victim.stderr})")
        try:
            traffic.wait_for_more(int(rate), timeout=60)
        except AssertionError as exc:
            errors.append(f"steady traffic did not resume: {exc}")
        try:
            report = traffic.stop(flush_timeout=60)
        except (AssertionError, RoqError) as exc:  # the accounting below says what is missing
            errors.append(f"steady traffic: {exc}")
            report = traffic.report()
        expected = {(v.id, seq) for v, got in victims for seq in range(1, got + 1)}
        try:
            wait_until(lambda: all(k in traffic.victims for k in expected), timeout=60,
                       message="every confirmed victim message")
        except AssertionError as exc:
            errors.append(f"victims: {exc}")
        stalled = stall.finish(timeout=60)
        for thread in chaos.threads:
            thread.join(timeout=60)
        jobs = chaos.jobs.finish(timeout=60) if chaos.jobs is not None else None
        watch.sample()
    finally:
        if chaos is not None:
            chaos.resume_due(everything=True)
            for sock in chaos.hoarders:
                sock.close()
            for victim in chaos.victims:
                if victim.proc.poll() is None:
                    victim.kill(None)
        if stall is not None:
            stall.close()
        if chaos is not None and chaos.jobs is not None:
            chaos.jobs.close()
        if traffic is not None:
            traffic.close()
        stop_client(zk)
        procs.stop_all()
        server.stop()
        if chaos is not None:
            for filler in chaos.fillers:
                filler.unlink(missing_ok=True)
        if small_disk is not None:
            unmount_small_disk(small_disk)
    fates = hcm_fates(procs)
    failed_exchanges = failed_lines(procs)
    for line in failed_exchanges:
        console.print(f"[red]{line}[/red]")
    unintended = watch.unintended()
    # An exchange the HCM stopped on purpose (the GCM moved it) is no crash: shown, not counted.
    stopped = [u for u in unintended if fates.get(u[0]) == "stopped"]
    crashed = [u for u in unintended if fates.get(u[0]) != "stopped"]
    for pid, xid, host in unintended:
        console.print(f"exchange exit not caused by a kill: {xid} pid {pid} on {host}: "
                      f"{fates.get(pid, 'no HCM log line (HCM gone?)')}")
    restarted = sorted({(x, r) for x, _, r in watch.seen.values() if r})
    if restarted:
        console.print(f"exchange incarnations seen with restarts > 0: {restarted}")
    if traffic.foreign:
        console.print(f"[red]{traffic.foreign} forged messages on 'load' reached the subscriber[/red]")
    job_errors = chaos.jobs.errors if chaos is not None and chaos.jobs is not None else []
    for err in stall.errors + errors + victim_errors + job_errors:
        console.print(f"[red]{err}[/red]")
    fault_text = ", ".join(f"{k} {chaos.counts[k]}" for k in KINDS if chaos.counts[k]) if chaos else ""
    table = Table("measure", "value", title="chaos summary")
    rows = [("faults", f"{done} ({fault_text})"), ("queue", f"2 exchanges, replicas {replicas}, journal {journal}")]
    rows += [(label, str(report[k])) for label, k in (
        ("sent", "sent"), ("confirmed", "confirmed"), ("delivered", "received"), ("lost", "lost"),
        ("duplicated", "duplicated"), ("publisher moves", "publisher_moves"),
        ("longest pause (s)", "longest_pause_s"))]
    rows += [("exchange exits (unintended)",
              str(len(crashed)) + (f" (+{len(stopped)} stopped by their HCM)" if stopped else "")),
             ("exchanges or replicas FAILED", str(len(failed_exchanges))),
             ("exchange peak RSS MB (one process / all)",
              f"{watch.peak_rss / 1e6:.1f} / {watch.peak_total / 1e6:.1f}")]
    if jobs is not None:
        rows += [("jobs (group): confirmed / lost / processed twice / dead-lettered",
                  f"{jobs['confirmed']} / {jobs['lost']} / {jobs['twice']} / {jobs['dead_lettered']}"),
                 ("hostile member saw", str(dict(chaos.jobs.hostile_seen)) if chaos and chaos.jobs else "")]
    if chaos is not None and chaos.gateway_url:
        rows += [("gateway peak RSS MB", f"{watch.gateway_peak / 1e6:.1f}"),
                 ("gateway answers to the flood", str(dict(chaos.http_answers)))]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    kinds_table = Table("fault kind", "faults", "confirmed", "lost", "duplicated", "victims' confirmed",
                        "victims' lost", "victims' duplicated",
                        title="per fault kind (steady messages: the first fault after their confirmation; "
                              "victims: the fault that killed them)")
    by_kind = per_kind(traffic, chaos, report["confirmed"], victims)
    columns = ("faults", "confirmed", "lost", "duplicated", "victim confirmed", "victim lost", "victim duplicated")
    total: Counter[str] = Counter()
    for kind in [*(k for k in KINDS if k in by_kind), AFTER]:
        values = by_kind.get(kind, {})
        total.update(values)
        style = "red" if values.get("lost") or values.get("duplicated") or values.get("victim lost") \
            or values.get("victim duplicated") else None
        kinds_table.add_row(kind, *(str(values.get(c, 0)) for c in columns), style=style)
    kinds_table.add_row("total", *(str(total.get(c, 0)) for c in columns), style="bold")
    console.print(kinds_table)
    for victim, got in victims:
        console.print(f"victim {victim.number} {victim.id}: {got} confirmed, "
                      f"{'killed by ' + victim.killed_by if victim.killed_by else 'stopped at the end'}")
    console.print(f"stalled subscriber: sent {stalled['sent']}, received {stalled['received']}, "
                  f"duplicates {stalled['duplicates']} (gaps {stalled['gaps']}, dropped duplicates "
                  f"{stalled['sub_duplicates']}, unexpected {stalled['extra']})")
    console.print(f"steady subscriber: dropped duplicates {report['dropped_duplicates']}, "
                  f"publisher replayed {report['replayed']}, forged deliveries {traffic.foreign}")
    failed = report["lost"] or report["duplicated"] or crashed or traffic.foreign or failed_exchanges \
        or total["victim lost"] or total["victim duplicated"] or victim_errors \
        or stalled["received"] != stalled["sent"] or stalled["duplicates"] \
        or (jobs is not None and (jobs["lost"] or jobs["dead_lettered"])) \
        or (chaos is not None and chaos.http_answers.get("200", 0) > 0)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
