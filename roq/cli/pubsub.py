"""`roq publish` and `roq subscribe` (also as a consumer group member)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from roq.cli.context import Context, handle_errors, pass_ctx
from roq.errors import Exit, UserError

# A printing group member holds one message unacked: each message a member holds when it stops (a
# closed pipe) goes back counting a delivery, so a larger prefetch and repeated `| head` runs could
# make dead letters of messages nobody read.
CLI_PREFETCH = 1


@click.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("message", required=False)
@click.option("--topic", "-t", default="default", show_default=True)
@click.option("--file", "-f", "source", type=click.File("rb"), default=None,
              help="publish each line of FILE as one message (default: stdin, when no MESSAGE is given)")
@click.option("--priority", type=click.IntRange(0, 255), default=None,
              help="0 (first, the default) to 255: the order consumer groups take messages in")
@click.option("--delay", type=click.FloatRange(0, 1e9), default=None, metavar="SECONDS",
              help="consumer groups take each message no sooner than this after it is published")
@click.option("--key", default=None, help="fairness key: consumer groups serve keys in turn")
@click.option("--header", "-H", "headers", multiple=True, metavar="KEY=VALUE",
              help="a header of every message (repeatable); subscribers see them with --format json")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=30.0, show_default=True,
              help="the most seconds the command waits for the cluster in all: connecting, room, confirms")
@pass_ctx
@handle_errors
def publish(ctx: Context, queue_name: str, message: str | None, topic: str, source: Any, priority: int | None,
            delay: float | None, key: str | None, headers: tuple[str, ...], timeout: float) -> None:
    """Publish MESSAGE to QUEUE, or each line of --file (or stdin) as one message.

    The headers, priority, delay and key apply to every message. --timeout bounds all the waiting
    for the cluster (not the reading of the input): the command ends within it once its input has."""
    from roq.names import check_queue_name, check_topic
    from roq.tools.data_cli import Attributes, argument_bytes, lines_of, parse_headers, publish_messages
    if message is not None and source is not None:
        raise click.UsageError("give a MESSAGE or --file, not both")
    try:  # checked before anything connects
        check_queue_name(queue_name)
        check_topic(topic)
        attributes = Attributes(priority, delay, key, parse_headers(headers))
    except UserError as exc:
        raise click.BadParameter(str(exc)) from None
    payloads: Iterable[bytes]
    if message is not None:
        payloads = [argument_bytes(message)]
    else:
        payloads = lines_of(source if source is not None else sys.stdin.buffer)
    sent, confirmed = publish_messages(ctx.config, queue_name, topic, payloads, attributes, timeout)
    click.echo(f"published {sent} message{'s' if sent != 1 else ''} to {queue_name}, {confirmed} confirmed",
               err=True)


@click.command()
@click.argument("queue_name", metavar="QUEUE")
@click.option("--topic", "-t", "topics", multiple=True, help="topic prefix (repeatable; default: all)")
@click.option("--count", "-n", type=click.IntRange(0), default=0, help="stop after N messages (0 = forever)")
@click.option("--timeout", type=click.FloatRange(0), default=0.0, help="stop after N idle seconds (0 = never)")
@click.option("--format", "output", type=click.Choice(["text", "json", "base64"]), default="text", show_default=True,
              help="text: topic<TAB>payload, escaped to one line; json: one object per message, headers included; "
                   "base64: topic<TAB>payload in base64")
@click.option("--durable", metavar="NAME", default=None,
              help="resume where the subscriber of this name stopped (position under client.state_dir)")
@click.option("--from", "start_from", metavar="beginning|now|TIME|FILE", default=None,
              help="where to start when there is no saved position: beginning (all the exchanges still "
                   "retain), now (the default), a TIME with its zone (2026-11-27T10:00:00Z) or in epoch "
                   "milliseconds (every message stored since, from memory or the queue's disk), or a "
                   "position FILE (a durable subscriber's saved one)")
@click.option("--group", metavar="NAME", default=None,
              help="join consumer group NAME: each message goes to one member of the group, acked once "
                   "the reader has its line (docs/work-queues.md)")
@click.option("--prefetch", type=click.IntRange(1, 100_000), default=None,
              help=f"with --group: unacked messages held per exchange (default {CLI_PREFETCH}; with --exec, "
                   "--concurrency)")
@click.option("--exec", "command", metavar="CMD", default=None,
              help="with --group: run CMD (/bin/sh -c) for each message, payload on stdin, attributes in ROQ_* "
                   "variables; ack when it exits 0, nack otherwise")
@click.option("--concurrency", type=click.IntRange(1, 256), default=None,
              help="with --exec: commands run at once (default 1)")
@pass_ctx
@handle_errors
def subscribe(ctx: Context, queue_name: str, topics: tuple[str, ...], count: int, timeout: float, output: str,
              durable: str | None, start_from: str | None, group: str | None, prefetch: int | None,
              command: str | None, concurrency: int | None) -> None:
    """Print the messages of QUEUE, one per line: topic<TAB>payload (--format text), a JSON object
    (--format json: headers, publisher, seq, time too) or topic<TAB>base64 (--format base64).

    A payload never spans two lines: text escapes backslash, LF and CR as \\\\, \\n and \\r.
    A new subscriber starts now: add --from beginning for what was published before. A --durable
    subscriber resumes from its saved position; --from only says where a new name starts.
    With --group it is a member of a consumer group: it prints its share, acking each message once
    its line is read (written, flushed, and out of the pipe), or with --exec runs a command for each."""
    from roq.client.subscriber import Subscriber
    from roq.tools.data_cli import formatter
    if command is not None and group is None:
        raise click.UsageError("--exec needs --group")
    if concurrency is not None and command is None:
        raise click.UsageError("--concurrency needs --exec")
    if group is not None:
        if durable is not None or start_from is not None:
            raise click.UsageError("--group takes no --durable or --from: the group keeps its own state")
        if command is not None and output != "text":
            raise click.UsageError("--format is for printing: --exec gives the command the payload itself")
        _work(ctx, queue_name, topics, count, timeout, group, prefetch, command, concurrency or 1, formatter(output))
        return
    if prefetch is not None:
        raise click.UsageError("--prefetch needs --group")
    start, position = _start_point(ctx, queue_name, durable, start_from)
    with Subscriber(queue_name, ctx.config, topics, durable=durable, start=start, position=position) as sub:
        # the with-block saves a durable position
        received, interrupted = _print_messages(sub, count, timeout, formatter(output))
        stats = sub.stats()
    click.echo(f"received {received} message{'s' if received != 1 else ''} (duplicates dropped "
               f"{stats.duplicates}, recovered frames {stats.recovered_frames}, unrecoverable gaps "
               f"{stats.gaps})", err=True)
    if interrupted:
        click.echo("interrupted", err=True)
        sys.exit(Exit.INTERRUPTED)


def _work(ctx: Context, queue_name: str, topics: tuple[str, ...], count: int, timeout: float, group: str,
          prefetch: int | None, command: str | None, concurrency: int, line: Callable[[Any], bytes]) -> None:
    """`roq subscribe --group`: print this member's share, or run `command` for each message
    (roq/tools/work_cli.py). Nothing is acked that the reader or the command did not finish."""
    from roq.client.group_member import GroupMember
    from roq.tools.work_cli import LineOut, Stop, exec_share, print_share
    out = LineOut(sys.stdout.buffer) if command is None else None
    prefetch = prefetch or (concurrency if command is not None else CLI_PREFETCH)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(Exit.OK))  # leaves through the with-block below
    stop, done, interrupted = Stop.DONE, 0, False
    with GroupMember(queue_name, ctx.config, topics, group=group, prefetch=prefetch, auto_ack=False) as sub:
        try:
            if out is not None:
                done, stop = print_share(sub, out, count, timeout, line)
            else:
                assert command is not None
                done = exec_share(sub, command, concurrency, count, timeout)
        except KeyboardInterrupt:
            interrupted = True
        stats = sub.stats()  # leaving the group gives what was not done back to the other members at once
    if stop is Stop.PIPE_CLOSED:  # nothing more can go there, not even at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    what = "printed" if out is not None else "ran the command for"
    click.echo(f"{what} {done} messages of group {group} (acked {stats.acked}, nacked {stats.nacked}, "
               f"redelivered to us {stats.redelivered}){'; ' + stop.value if stop is not Stop.DONE else ''}",
               err=True)
    if interrupted:
        click.echo("interrupted", err=True)
        sys.exit(Exit.INTERRUPTED)


def _print_messages(sub: Any, count: int, timeout: float, line: Callable[[Any], bytes]) -> tuple[int, bool]:
    """Print messages, one `line(msg)` each, until `count` or `timeout` idle seconds; (printed, interrupted)."""
    received = 0
    out = sys.stdout.buffer
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(Exit.OK))  # SIGTERM leaves through the caller's with-block
    try:
        while not count or received < count:
            msg = sub.receive(timeout=timeout or None)
            if msg is None:
                break
            text = line(msg)
            received += 1  # before the write: a Ctrl-C just after it must not leave a printed line uncounted
            out.write(text)
            out.flush()
    except KeyboardInterrupt:
        return received, True
    except BrokenPipeError:  # `roq subscribe ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return received, False


def _start_point(ctx: Context, queue_name: str, durable: str | None,
                 start_from: str | None) -> tuple[str | datetime, dict[str, Any] | None]:
    """`--from` as (start, position): a saved durable position wins over it."""
    from roq.client.subscriber.checkpoint import checkpoint_file, load_checkpoint
    from roq.names import check_subscriber_name
    if durable is not None and start_from is not None:
        saved = checkpoint_file(ctx.config.client.state_dir, queue_name, check_subscriber_name(durable))
        if saved.is_file():
            click.echo(f"roq: note: {durable!r} resumes from its saved position ({saved}); --from applies "
                       f"to a new name only (delete that file to start over)", err=True)
            return "now", None
    choice = (start_from or "now").lower()
    if choice in ("now", "beginning"):
        return choice, None
    path = Path(start_from or "")
    at = _start_time(start_from or "") if not path.is_file() else None
    if at is not None:
        return at, None
    position = load_checkpoint(path) if path.is_file() else None
    if position is None:
        raise click.BadParameter(f"expected beginning, now, a time (2026-11-27T10:00:00Z, or epoch "
                                 f"milliseconds) or a position file; there is no file {start_from!r}",
                                 param_hint="--from")
    return "now", position.to_json()


def _start_time(text: str) -> datetime | None:
    """A time as roq/start_time.py reads it (ISO 8601 with its zone, or epoch milliseconds); None if
    the text is not meant as a time (a file name: an existing file was preferred before this)."""
    from roq.start_time import looks_like_time, parse_start_time
    if not looks_like_time(text):
        return None
    try:
        return datetime.fromtimestamp(parse_start_time(text), UTC)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--from") from None
