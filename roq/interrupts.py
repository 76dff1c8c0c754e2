"""Ctrl-C in commands that start processes: never lost, never hanging.

A terminal's Ctrl-C is SIGINT to its whole foreground process group. The `roq` commands turn it
into KeyboardInterrupt, which ends the command with "interrupted" and exit 130 (roq/cli/context.py). What
is here makes sure it does, promptly and tidily:

* `take_ctrl_c()` (the `roq` group calls it first) makes SIGINT this process's KeyboardInterrupt
  whatever disposition it inherited, and makes it stick: the loops that wait call
  `raise_if_interrupted()`, which raises it again should Python have swallowed it.
* `ctrl_c_held()` holds a Ctrl-C while child processes start, then raises it: it is not lost, and
  never strikes between a fork and the handle that stops the child. Workers started under it with
  `block_in_children` are born with SIGINT blocked and call `ignore_ctrl_c()` first, so only the
  parent acts on a Ctrl-C (by stopping them).
* `interrupt_handled()`, once the command has handled a Ctrl-C, makes sure the interpreter exits
  with the command's code (see there).

A queue that such a command created is deleted on its way out by roq/tools/own_queue.py.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_pressed = threading.Event()  # a Ctrl-C came (take_ctrl_c's handler): it stays until the process ends
_unraisable_hook: Any = None  # the hook take_ctrl_c() found, for everything but a swallowed Ctrl-C


def take_ctrl_c() -> None:
    """SIGINT raises KeyboardInterrupt, also in a process that was started with it ignored (a
    non-interactive shell starts its background jobs so), and it sticks: Python swallows one that
    comes while a finaliser or a weakref callback runs (an import, a garbage collection), with an
    "Exception ignored in ..." traceback. That traceback is kept quiet, and raise_if_interrupted()
    raises the Ctrl-C again. Only from the main thread (signal handlers are set there)."""
    global _unraisable_hook
    if threading.current_thread() is not threading.main_thread():
        return
    _pressed.clear()
    signal.signal(signal.SIGINT, _on_ctrl_c)
    if sys.unraisablehook is not _on_unraisable:
        _unraisable_hook, sys.unraisablehook = sys.unraisablehook, _on_unraisable


def raise_if_interrupted() -> None:
    """KeyboardInterrupt if a Ctrl-C came since take_ctrl_c(): for loops that wait, so that one Python
    swallowed still ends the command."""
    if _pressed.is_set():
        raise KeyboardInterrupt


def _on_ctrl_c(signum: int, frame: Any) -> None:
    _pressed.set()
    raise KeyboardInterrupt


def _on_unraisable(unraisable: Any) -> None:
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        _unraisable_hook(unraisable)


@contextmanager
def ctrl_c_held(block_in_children: bool = False) -> Iterator[None]:
    """Hold a Ctrl-C that comes during the block; raise KeyboardInterrupt once the block is done.

    `block_in_children`: processes started in the block are born with SIGINT blocked (a signal mask is
    inherited through fork and exec), until they call ignore_ctrl_c(). A process that ignored SIGINT
    before (SIG_IGN) drops a held Ctrl-C, as it would have."""
    held: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: held.append(1)) if main else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if block_in_children else None
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one that came meanwhile is delivered: held
        if main:
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    if held and previous is not signal.SIG_IGN:
        raise KeyboardInterrupt


def ignore_ctrl_c() -> None:
    """A worker's first step when started under ctrl_c_held(block_in_children=True): SIGINT ignored
    (which drops one that came while the process started), then unblocked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def interrupt_handled() -> None:
    """CPython 3.11 notes a KeyboardInterrupt raised inside exec() of a string (dataclasses and
    namedtuple make their classes so: a Ctrl-C during a lazy import) as unhandled even once caught,
    and then ends a `python -m` run by SIGINT, exit code and all: clear that note."""
    import ctypes
    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (AttributeError, ValueError):  # not this interpreter's: nothing to clear
        pass
