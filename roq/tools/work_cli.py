"""What `roq subscribe --group` does with its share: print it, or run a command per message.

Printing acks a message only once the line is out of our hands: written and flushed to stdout
and, when stdout is a pipe, read from the pipe by the reader. A pipe holds one line at a time
(the next is written once the reader took the last), so a reader that stops (`| head -3`) has
read exactly what it got: the line it left in the pipe and every message not yet printed are
not acked. Into a file or a terminal, written and flushed is done.

`--exec CMD` runs CMD through `/bin/sh -c` for each message, in a process group of its own, the
payload on its stdin and the message's attributes in ROQ_* environment variables (MESSAGE_ENV);
the message is acked when CMD exits 0 and nacked with requeue otherwise (the exchange
dead-letters it after max_deliveries).

On any stop (--count, --timeout, a closed pipe, Ctrl-C, SIGTERM) nothing unfinished is acked:
running commands' process groups get SIGTERM, then SIGKILL after STOP_GRACE, the member waits until
no process of theirs runs (not only the shell: whatever it started too), and those that still exit 0
are acked; leaving the group (the caller's `with` block) gives everything else this member
holds back to the other members at once, not after the ack timeout.
"""

from __future__ import annotations

import enum
import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from roq.client.envelope import headers_json, text_line
from roq.client.group_member import GroupMember, WorkMessage
from roq.config import MESSAGE_ENV
from roq.errors import UserError
from roq.tools import process_groups

RECEIVE_SLICE = 0.2  # s between two looks at a closed pipe or the idle timeout while no message comes
REAP_SLICE = 0.02  # s a message is waited for while commands run with room for more (then they are reaped)
STOP_GRACE = 5.0  # s running commands get after SIGTERM before SIGKILL
KILL_WAIT = 5.0  # s a SIGKILLed group gets to disappear (only a process stuck in the kernel takes long)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what stops the member: only noted while exec_share runs
# Waiting for the reader to take a line out of the pipe: spin (yielding the CPU) this many times,
# then sleep from 1 ms doubling up to 20 ms between looks.
SPINS = 200
MAX_WAIT_MS = 20


class Stop(enum.Enum):
    DONE = "done"  # --count reached, or --timeout idle seconds
    PIPE_CLOSED = "the reader closed stdout"


class LineOut:
    """A stdout that says whether its reader has a line: written and flushed, and read if a pipe."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.fd = stream.fileno()
        self.pipe = stat.S_ISFIFO(os.fstat(self.fd).st_mode)
        self._gone = select.poll()
        self._gone.register(self.fd, 0)  # nothing asked: only POLLERR (no reader left) comes back

    def deliver(self, line: bytes) -> bool:
        """Write and flush `line`; True once the reader has it, False if the reader is gone."""
        try:
            self.stream.write(line)
            self.stream.flush()
        except BrokenPipeError:
            return False
        return not self.pipe or self._read_by_reader()

    def reader_gone(self) -> bool:
        return self.pipe and bool(self._gone.poll(0))

    def _read_by_reader(self) -> bool:
        for _ in range(SPINS):
            if not _unread(self.fd):
                return True
            if self._gone.poll(0):
                return False
            os.sched_yield()
        wait_ms = 1
        while _unread(self.fd):
            if self._gone.poll(wait_ms):
                return False
            wait_ms = min(2 * wait_ms, MAX_WAIT_MS)
        return True


def _unread(fd: int) -> int:
    """Bytes written into the pipe that its reader has not read yet."""
    import fcntl
    import termios
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little", signed=True)


def print_share(member: GroupMember, out: LineOut, count: int, timeout: float,
                line: Callable[[WorkMessage], bytes] | None = None) -> tuple[int, Stop]:
    """Print messages, one `line(msg)` each (default: roq.client.envelope.text_line), acking each once
    the reader has it; (printed, why stopped)."""
    line = line or (lambda msg: text_line(msg.topic_bytes, msg.payload))
    printed = 0
    idle_since = time.monotonic()
    while not count or printed < count:
        msg = member.receive(timeout=RECEIVE_SLICE)
        if msg is None:
            if out.reader_gone():
                return printed, Stop.PIPE_CLOSED
            if timeout and time.monotonic() - idle_since >= timeout:
                break
            continue
        if not out.deliver(line(msg)):
            return printed, Stop.PIPE_CLOSED  # not acked: leaving the group gives it back
        msg.ack()
        printed += 1
        idle_since = time.monotonic()
    return printed, Stop.DONE


def message_env(msg: WorkMessage, queue: str, group: str) -> dict[bytes, bytes]:
    """The environment of the command run for `msg`: ours, plus the message's attributes."""
    env = dict(os.environb)
    values: dict[str, bytes] = {
        "ROQ_QUEUE": queue.encode(), "ROQ_GROUP": group.encode(), "ROQ_EXCHANGE": msg.exchange.encode(),
        "ROQ_PUBLISHER": msg.publisher.encode(), "ROQ_SEQ": b"%d" % msg.seq, "ROQ_MESSAGE_ID": msg.id.encode(),
        "ROQ_DELIVERIES": b"%d" % msg.deliveries, "ROQ_PRIORITY": b"%d" % msg.priority}
    if msg.headers:  # as `--format json` shows them: text values, or all in base64
        shown, encoding = headers_json(msg.headers)
        values["ROQ_HEADERS"] = json.dumps(shown, ensure_ascii=False).encode()
        values["ROQ_HEADERS_ENCODING"] = encoding.encode()
    for name, raw in (("ROQ_TOPIC", msg.topic_bytes), ("ROQ_KEY", msg.key_bytes)):
        if raw is None:
            continue
        if b"\0" in raw:  # an environment variable cannot hold a NUL byte
            values[name + "_HEX"] = raw.hex().encode()
        else:
            values[name] = raw
    for name in MESSAGE_ENV:
        env.pop(name.encode(), None)  # none of ours from an outer member leaks into this message's
    env.update((name.encode(), value) for name, value in values.items())
    return env


class Run:
    """One command running for one message, fed and waited for on its own thread."""

    def __init__(self, command: str, msg: WorkMessage, env: dict[bytes, bytes], done: threading.Event) -> None:
        self.msg = msg
        self.code: int | None = None
        # Its own process group: a stop signals the command and whatever it started, and a Ctrl-C at
        # the terminal reaches us alone (we stop the commands, and give back what they did not finish).
        try:
            self.proc = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env, process_group=0)
        except OSError as exc:  # no shell, no process left: stop (the leave gives the message back)
            raise UserError(f"cannot start --exec command: {exc}") from exc
        self._done = done
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        try:
            self.proc.communicate(self.msg.payload)  # a command that does not read its stdin is fine
        finally:
            self.code = self.proc.wait()
            self._done.set()

    def settle(self) -> bool:
        """Ack on exit code 0, else nack with requeue; True if acked."""
        if self.code == 0:
            self.msg.ack()
            return True
        self.msg.nack()
        return False


def exec_share(member: GroupMember, command: str, concurrency: int, count: int, timeout: float) -> int:
    """Run `command` for each message, `concurrency` at a time, until `count` are settled or
    `timeout` idle seconds (no message, nothing running); returns how many were settled. Whatever
    stops it, the commands still running are stopped and their messages nacked."""
    running: list[Run] = []
    done = threading.Event()
    gate = _StopGate(done)
    settled = 0
    idle_since = time.monotonic()
    try:
        gate.install()
        while not gate.stopped:
            done.clear()  # before reaping: a command ending from now on wakes the wait below
            settled += _reap(running)
            wanted = not count or settled + len(running) < count
            if not wanted and not running:
                break
            if wanted and len(running) < concurrency:
                msg = member.receive(timeout=REAP_SLICE if running else RECEIVE_SLICE)
                if msg is not None:
                    running.append(Run(command, msg, message_env(msg, member.queue, member.group), done))
                    continue
            if running:
                idle_since = time.monotonic()
                if len(running) >= concurrency or not wanted:
                    done.wait(RECEIVE_SLICE)
            elif timeout and time.monotonic() - idle_since >= timeout:
                break
    finally:
        try:
            settled += _stop(running)
        finally:
            gate.restore()  # then a stop that came meanwhile reaches the handler it was meant for
    return settled


class _StopGate:
    """SIGTERM and Ctrl-C while exec_share runs, taken by handlers installed once for all of it
    that only note the stop (and wake the loop): no exception ever cuts exec_share short between a
    command's fork and its entry in `running`, nor before _stop (a command would run on after the
    member said it stopped). restore() then delivers the stop to the handler it would have reached.
    (Not by blocking the signals: the commands would inherit the mask and ignore our SIGTERM.)"""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake
        self.held: list[int] = []
        self._previous: dict[int, Any] = {}

    @property
    def stopped(self) -> bool:
        return bool(self.held)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # handlers are the main thread's: a caller on another thread stops it its own way
        for signum in STOP_SIGNALS:  # noted one by one: restore() undoes however many there are
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._note)

    def _note(self, signum: int, _frame: object) -> None:
        self.held.append(signum)
        self._wake.set()

    def restore(self) -> None:
        self._put_back(list(self._previous.items()))
        for signum in dict.fromkeys(self.held):
            signal.raise_signal(signum)

    def _put_back(self, handlers: list[tuple[int, Any]]) -> None:
        """Each in a `finally` of the next: a stop raised by a handler put back skips none of the others."""
        if handlers:
            (signum, handler), rest = handlers[0], handlers[1:]
            try:
                self._put_back(rest)
            finally:
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def _reap(running: list[Run]) -> int:
    finished = [run for run in running if run.code is not None]
    for run in finished:
        running.remove(run)
        run.settle()
    return len(finished)


def _stop(running: list[Run]) -> int:
    """SIGTERM to the groups of the commands still running, SIGKILL to those still running after
    STOP_GRACE, and wait until none runs; then ack the commands that exited 0. The others are not
    nacked: the exchange would hand them straight back to this member (counting a delivery) before
    its leave; the leave gives them to the other members, counting once."""
    groups = [run.proc.pid for run in running]  # a shell that exited may have left processes in its group
    for pgid in process_groups.stop_groups(groups, STOP_GRACE, KILL_WAIT):
        print(f"roq: process group {pgid} of an --exec command still runs after SIGKILL", file=sys.stderr)
    for run in running:
        run.thread.join(KILL_WAIT)  # its shell is gone: only the reaping is left
    for run in running:
        if run.code == 0:
            run.msg.ack()
    return len(running)
