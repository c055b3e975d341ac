"""Which threads of this process are running a model now.

A kernel choice is timed on one thread (:mod:`bertscope.fast.tuning`); a model run on another
thread of the same process meanwhile (a service that loads a second model while the first one
serves) takes the same CPUs, and no reading of other processes' CPU time can see it. So each
model run (the reference forward, the packed encoder) is marked here, and a measurement asks
whether any other thread ran one while it timed (:func:`watching`).

A run inside a run on the same thread counts once; a thread that is measuring does not count
its own runs (the candidates it times), and no other thread sees them either: measurements do not
overlap (:func:`bertscope.fast.tuning.measuring` holds one lock for them all).
"""

from __future__ import annotations

import functools
import os
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

__all__ = ["ProcessLock", "Watch", "marks_runs", "running", "watching"]

F = TypeVar("F", bound=Callable)

_lock = threading.Lock()
_depth: dict[int, int] = {}  # thread ident -> how deep in model runs it is now
_started = 0  # outermost runs started by any thread, ever
_local = threading.local()  # .watching: this thread is measuring


def _after_fork() -> None:
    """In a child made by fork only the forking thread lives on: the other threads' runs are
    gone, and a lock one of them held would be held for ever."""
    global _lock
    _lock = threading.Lock()
    me = threading.get_ident()
    for t in [t for t in _depth if t != me]:
        del _depth[t]


os.register_at_fork(after_in_child=_after_fork)


class ProcessLock:
    """A re-entrant lock of this process: a child made by fork gets a fresh one (a thread that
    held the parent's at the fork lives on only in the parent, and would hold it for ever)."""

    def __init__(self) -> None:
        self._pid, self._lock = os.getpid(), threading.RLock()

    def __enter__(self) -> "ProcessLock":
        if self._pid != os.getpid():
            self._pid, self._lock = os.getpid(), threading.RLock()
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def __getstate__(self) -> dict:  # for pickle and copy.deepcopy: a copy gets a lock of its own
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


@contextmanager
def running() -> Iterator[None]:
    """Mark a model run on this thread for as long as it lasts."""
    global _started
    if getattr(_local, "watching", False):  # the measuring thread's own candidates
        yield
        return
    me = threading.get_ident()
    with _lock:
        depth = _depth.get(me, 0)
        _depth[me] = depth + 1
        if depth == 0:
            _started += 1
    try:
        yield
    finally:
        with _lock:
            if depth == 0:
                del _depth[me]
            else:
                _depth[me] = depth


def marks_runs(fn: F) -> F:
    """``fn``, each call of it marked as a model run (:func:`running`)."""
    @functools.wraps(fn)
    def marked(*args, **kwargs):
        with running():
            return fn(*args, **kwargs)
    return marked  # type: ignore[return-value]


class Watch:
    """What other threads did while a :func:`watching` block ran: ``others`` is how many model
    runs on other threads were under way at its start or began before its end."""

    def __init__(self) -> None:
        self.others = 0


@contextmanager
def watching() -> Iterator[Watch]:
    """Measure on this thread: its own model runs are not counted, and the :class:`Watch`
    given says, once the block ends, how many runs other threads made meanwhile."""
    me = threading.get_ident()
    watch = Watch()
    before = getattr(_local, "watching", False)
    _local.watching = True
    with _lock:
        under_way = sum(1 for t in _depth if t != me)
        started = _started
    try:
        yield watch
    finally:
        _local.watching = before
        with _lock:
            # runs that began during the block, by other threads (this one counted none), and
            # those already under way at its start (still running or not: they overlapped it)
            watch.others = under_way + (_started - started)
