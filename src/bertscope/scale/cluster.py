"""Ray, started or joined, checked before any work; and a pool of model-holding actors over shards.

Everything here imports Ray inside the function that needs it: ``import bertscope.scale`` stays
light, and a missing Ray is one line with the pip hint (:func:`require_ray`).

The pool (:func:`map_shards`) is Ray Data's: a dataset with one row per shard index, one block
per row, mapped by ``map_batches`` with a fixed-size ``ActorPoolStrategy``. Each actor is built
once (it loads the model once) and handles one shard per call; Ray Data restarts an actor that
dies and retries its calls (``max_task_retries=-1``), so a lost worker costs only the shards it
held. It restarts a worker :data:`WORKER_RESTARTS` times, not Ray Data's default of for ever: a
worker that dies as it starts (out of memory as it loads the model, say) once hung the job for
ever; now the job ends with one line (:func:`unwrap_error`).
"""

from __future__ import annotations

import contextlib
import gc
import io
import ipaddress
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Iterator

from ..errors import BertscopeError, InputError, setting
from ..fast.tuning import usable_cpus

__all__ = ["EngineOptions", "WORKER_RESTARTS", "WorkerDied", "check_address", "check_engine_options",
           "check_local_capacity", "map_shards", "pool_size", "ray_session", "require_ray", "unwrap_error",
           "worker_remote_args"]

log = logging.getLogger(__name__)

RAY_HINT = "pip install 'bertscope[ray]'"
CONNECT_TIMEOUT_S = 3.0
# a Ray started on this machine (no address) reserves workers x cpus_per_worker CPUs; more than
# this many workers, or CPUs reserved, per usable CPU is refused (check_local_capacity): each
# worker is a process holding its own model, and past the machine's CPUs they only share them
LOCAL_CPUS_PER_CPU = 4
# a worker whose process dies (killed, out of memory, a crash) is started again this many times
# in a job; Ray Data's default (-1, for ever) left a worker that dies as it starts doing so for
# ever, the job hanging. Tasks it held are retried on its next life (max_task_retries -1).
WORKER_RESTARTS = 4


@dataclass(frozen=True)
class EngineOptions:
    """Where and how wide a Ray job runs.

    address:          None: start Ray on this machine (stopped afterwards), or join RAY_ADDRESS's
                      cluster where that is set; "auto": the cluster this machine belongs to
                      (``ray start``); "HOST:PORT" a cluster's head; "ray://HOST:10001" through
                      Ray Client (needs ``ray[client]``).
    workers:          actors, each holding one copy of the model (None: as many as the
                      cluster's CPUs / cpus_per_worker, at least 1). A Ray started here takes
                      at most LOCAL_CPUS_PER_CPU workers, and CPUs reserved, per usable CPU.
    cpus_per_worker:  CPUs Ray reserves per actor (also its torch threads).
    gpus_per_worker:  GPUs per actor (fractions share a GPU); > 0 runs the model on CUDA.
    """

    address: str | None = None
    workers: int | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus_per_worker))

    @property
    def device(self) -> str:
        return "cuda" if self.gpus_per_worker > 0 else "cpu"


def require_ray():
    """The ``ray`` module with Ray Data, or a one-line InputError saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise InputError(f"the Ray engine (--engine ray) needs Ray (with Ray Data): {RAY_HINT}") from None
    return ray


def check_engine_options(opts: EngineOptions) -> None:
    """Refuse impossible sizes before anything starts (one line each)."""
    if opts.workers is not None and (not isinstance(opts.workers, int) or opts.workers < 1):
        raise InputError(f"{setting('workers', '--workers')} must be at least 1, not {opts.workers}")
    if not (opts.cpus_per_worker > 0 and math.isfinite(opts.cpus_per_worker)):
        raise InputError(f"{setting('cpus_per_worker', '--cpus-per-worker')} must be a number above 0, "
                         f"not {opts.cpus_per_worker}")
    if not (opts.gpus_per_worker >= 0 and math.isfinite(opts.gpus_per_worker)):
        raise InputError(f"{setting('gpus_per_worker', '--gpus-per-worker')} must be a number, 0 or more, "
                         f"not {opts.gpus_per_worker}")


def _local_cpus(opts: EngineOptions) -> float:
    """The CPUs a Ray started here for ``opts`` is given to reserve: every worker's."""
    return (opts.workers or 1) * opts.cpus_per_worker


def check_local_capacity(opts: EngineOptions) -> None:
    """Where ``opts`` start Ray on this machine (:func:`_starts_here`), refuse in one line more
    than :data:`LOCAL_CPUS_PER_CPU` workers, or CPUs reserved, per usable CPU. Elsewhere the
    cluster's own resources decide (:func:`_check_resources`). The CPUs counted are those this
    process can use (:func:`~bertscope.fast.tuning.usable_cpus`: a container's, not its host's)."""
    if not _starts_here(opts):
        return
    cpus = usable_cpus()
    most = LOCAL_CPUS_PER_CPU * cpus
    where = (f"it has {cpus} usable CPU{'' if cpus == 1 else 's'}, and a Ray started here takes at most {most} "
             f"({LOCAL_CPUS_PER_CPU} per CPU)")
    elsewhere = f"or {setting('address', '--address')} of a cluster that has them"
    if opts.workers is not None and opts.workers > most:
        raise InputError(f"{setting('workers', '--workers')} {opts.workers} would start {opts.workers} processes on "
                         f"this machine, each holding a model; {where}: give fewer workers, {elsewhere}")
    need = _local_cpus(opts)
    if opts.workers is None and opts.gpus_per_worker == 0:  # the pool then fills the CPUs (pool_size)
        implied = int(float(max(cpus, math.ceil(need - 1e-9))) // opts.cpus_per_worker)
        if implied > most:
            raise InputError(
                f"{setting('cpus_per_worker', '--cpus-per-worker')} {_count(opts.cpus_per_worker)} without "
                f"{setting('workers', '--workers')} would start {implied} processes on this machine (its CPUs / "
                f"{_count(opts.cpus_per_worker)}), each holding a model; {where}: give "
                f"{setting('workers', '--workers')} N, or a larger {setting('cpus_per_worker', '--cpus-per-worker')}")
    if need > most + 1e-9:  # float sums (200 x 0.28) must not refuse what equals the limit
        per = f"{_count(opts.cpus_per_worker)} CPU{'' if opts.cpus_per_worker == 1 else 's'}"
        asked = (f"{setting('workers', '--workers')} {opts.workers} of {per} each" if opts.workers is not None
                 else f"{setting('cpus_per_worker', '--cpus-per-worker')} {_count(opts.cpus_per_worker)}")
        raise InputError(f"{asked} asks for {_count(need)} CPUs; {where}: give fewer workers or a smaller "
                         f"{setting('cpus_per_worker', '--cpus-per-worker')}, {elsewhere}")


def _count(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _starts_here(opts: EngineOptions) -> bool:
    """Whether a Ray session for ``opts`` starts Ray on this machine: no address, none in
    RAY_ADDRESS either (``ray.init`` joins that one), and no Ray already running in this process."""
    if opts.address is not None or os.environ.get("RAY_ADDRESS", "").strip() not in ("", "local"):
        return False
    ray = sys.modules.get("ray")
    return not (ray is not None and ray.is_initialized())


def _host_port(address: str) -> tuple[str, int] | None:
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _address_host_port(address: str) -> tuple[str, int]:
    """(host, port) of a HOST:PORT or ray://HOST:PORT address, or the one-line error."""
    hp = _host_port(address)
    if hp is None:
        raise InputError(f"{setting('address', '--address')} must be auto, HOST:PORT or ray://HOST:PORT, not {address!r}")
    return hp


def check_address(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Fail in seconds, with one line, when ``address`` names no reachable cluster.

    "HOST:PORT" and "ray://HOST:PORT" must accept a TCP connection within ``timeout`` seconds
    (an unresolvable name or a closed port fails at once); "auto" is resolved by Ray itself,
    which fails at once when this machine runs no cluster.

    What answers must then speak gRPC, as Ray's GCS and Ray Client servers do: sent HTTP/2's
    client preface, it answers with a SETTINGS frame within :data:`GRPC_ANSWER_S` seconds.
    Given the port of something else (a web server, a database), ``ray.init`` waited for ever,
    retrying, with nothing said. Where Ray's connections use TLS (``RAY_USE_TLS``), the port is
    only connected to.
    """
    if address is None or address == "auto":
        address = os.environ.get("RAY_ADDRESS", "").strip()  # what ray.init joins then, if set
        if _host_port(address) is None:  # unset, "auto", "local": Ray's own
            return
        try:
            check_address(address, timeout)
        except InputError as e:
            raise InputError(f"RAY_ADDRESS: {e}") from None  # the user set no --address: say where it came from
        return
    if address.startswith("ray://"):
        try:
            import grpc  # noqa: F401  (Ray Client's transport)
        except ImportError:
            raise InputError(f"{setting('address', '--address')} {address} uses Ray Client, which needs: "
                             "pip install 'ray[client]'") from None
    hp = _address_host_port(address)
    try:
        with socket.create_connection(hp, timeout=timeout) as sock:
            answer = None if _uses_tls() else _grpc_answer(sock, GRPC_ANSWER_S)
    except socket.timeout:
        raise InputError(f"cannot reach a Ray cluster at {address}: no answer within {timeout:g} s") from None
    except OSError as e:
        raise InputError(f"cannot reach a Ray cluster at {address}: {e.strerror or e}") from None
    if answer is not None:
        raise InputError(f"{address} is not a Ray cluster: what answers there {answer}")


def _addresses(host: str) -> set[str]:
    """The IP addresses ``host`` resolves to (none where it does not resolve)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return set()


def _is_loopback(ip: str) -> bool:
    try:
        a = ipaddress.ip_address(ip.split("%", 1)[0])  # an IPv6 zone ("fe80::1%eth0") is not part of it
    except ValueError:
        return False
    mapped = getattr(a, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return a.is_loopback or a.is_unspecified or bool(mapped and (mapped.is_loopback or mapped.is_unspecified))


def _this_machine(ips: set[str], own: set[str]) -> bool:
    """Whether every address in ``ips`` is this machine's: loopback (or 0.0.0.0, any of this
    machine's), or one of ``own``."""
    return bool(ips) and all(_is_loopback(ip) or ip in own for ip in ips)


def _refuse_another_cluster(ray, address: str | None) -> None:
    """With Ray already running in this process, refuse an address of another cluster.

    The process's own session is used as it is (a caller's ``ray.init``); an address naming some
    other cluster would otherwise be ignored without a word, and the work run where the caller
    did not ask. None and "auto" mean the running session. HOST:PORT must name the running
    cluster's GCS (its host by name or address, or this machine as localhost); ray://HOST:PORT
    is Ray Client's own port, so only its host is compared.
    """
    if address is None or address == "auto":
        return
    wanted = _address_host_port(address)
    try:
        running = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001  (a Ray without it, or a Ray Client session: nothing to compare with)
        return
    have = _host_port(running or "")
    if have is None:
        return
    refused = InputError(f"Ray is already running in this process, joined to the cluster at {running}; "
                         f"{setting('address', '--address')} {address} names another (call ray.shutdown() "
                         "first, or leave the address out to use the running one)")
    client = address.startswith("ray://")
    if not client and wanted[1] != have[1]:
        raise refused
    if wanted[0] == have[0]:
        return
    ips_wanted = _addresses(wanted[0])
    if not ips_wanted:
        raise InputError(f"cannot reach a Ray cluster at {address}: {wanted[0]} does not resolve to an address")
    ips_have = _addresses(have[0])
    if ips_wanted & ips_have:
        return
    own = _addresses(socket.gethostname())
    with contextlib.suppress(Exception):
        own.add(ray.util.get_node_ip_address())  # the address Ray's nodes here go by
    if not (_this_machine(ips_wanted, own) and _this_machine(ips_have, own)):
        raise refused


GRPC_ANSWER_S = 10.0
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # RFC 9113 3.4, then an empty SETTINGS frame:
_H2_SETTINGS = bytes([0, 0, 0, 0x4, 0, 0, 0, 0, 0])  # length 0, type 4 (SETTINGS), no flags, stream 0


def _uses_tls() -> bool:
    return os.environ.get("RAY_USE_TLS", "").lower() in ("1", "true")  # as Ray reads it


def _grpc_answer(sock: socket.socket, timeout: float) -> str | None:
    """None if the server on ``sock`` speaks HTTP/2 (gRPC's transport): its first frame, the
    server's preface, is a SETTINGS frame on stream 0. Else what it did instead, in words."""
    sock.settimeout(timeout)
    try:
        sock.sendall(_H2_PREFACE + _H2_SETTINGS)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except socket.timeout:
        return f"sent no answer to gRPC within {timeout:g} s"
    except OSError as e:
        return f"closed the connection ({e.strerror or e})"
    if len(head) == 9 and head[3] == 0x4 and head[5:9] == b"\0\0\0\0":
        return None
    if not head:
        return "closed the connection without a word of gRPC"
    if head[0] in (0x15, 0x16):  # a TLS record (an alert, a handshake)
        return "answered with TLS (for a cluster that uses it, set RAY_USE_TLS=1 and its certificates)"
    return f"does not speak gRPC (it answered {head[:9]!r})"


@contextlib.contextmanager
def _quiet_ray(ray) -> Iterator[None]:
    """Ray Data's progress bars and per-dataset log lines off (the CLI draws its own bar), and
    its error reports unless debugging: the error reaches the caller as an exception (which the
    CLI says in one line), and Ray Data logged it first as some 200 lines of stack traces. The
    loggers' levels are given back as the block ends (a library caller's own pipelines keep
    their reports)."""
    import ray.data

    with warnings.catch_warnings():  # Ray Data's deprecation notes, raised as it builds its context
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    debugging = log.isEnabledFor(logging.DEBUG)
    levels = {"ray.data": logging.WARNING if debugging else logging.CRITICAL,
              "ray.data._internal.execution.streaming_executor": logging.WARNING if debugging else logging.CRITICAL,
              "ray._private.worker": logging.WARNING if debugging else logging.ERROR}
    before = {name: logging.getLogger(name).level for name in levels}
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        yield
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def ray_session(opts: EngineOptions) -> Iterator[object]:
    """Ray, ready to use: the session already running in this process if there is one (left
    running), else one started or joined for this block (shut down after it).

    Without an address, Ray starts on this machine with at least ``workers x cpus_per_worker``
    CPUs, so the same command runs on a laptop and on a cluster.

    While the block runs, what Ray prints to stdout goes to stderr: its driver prints messages
    such as "(raylet) A worker died or was killed ..." to sys.stdout, which would corrupt a
    command's results there (``heads --engine ray --json`` in a CI run did). bertscope itself
    prints nothing inside the block. Once the block is stopped (Ctrl-C, SIGTERM) they go only
    to the debug log: Ray prints one per actor it stops. SIGTERM keeps the process's own handler
    (Ray's replaces it with a crash dump).

    Close the iterators over datasets inside the block (``contextlib.closing``, as
    :func:`map_shards` asks): the shutdown waits for Ray Data's threads that an open one keeps
    (:data:`RAY_DATA_THREADS_WAIT_S` at most).
    """
    ray = require_ray()
    lines = _RayLines()
    if ray.is_initialized():
        _refuse_another_cluster(ray, opts.address)
        try:
            with _quiet_ray(ray), contextlib.redirect_stdout(lines), lines.quiet_when_stopped():
                yield ray
        finally:
            lines.finish()
        return
    check_local_capacity(opts)
    check_address(opts.address)
    if not log.isEnabledFor(logging.DEBUG):
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")  # Ray's C++ log lines off the terminal
    kwargs: dict = {"include_dashboard": False, "logging_level": logging.ERROR,
                    "log_to_driver": log.isEnabledFor(logging.DEBUG)}
    address = opts.address
    here = _starts_here(opts)
    if here:
        # "local": a new Ray here, as the docs promise, and never a `ray start` cluster that
        # ray.init(address=None) would join (which refuses num_cpus); None joins RAY_ADDRESS's
        address = "local"
        kwargs["num_cpus"] = max(usable_cpus(), math.ceil(_local_cpus(opts) - 1e-9))
    _start(ray, address, kwargs)
    with contextlib.redirect_stdout(lines):  # until Ray is shut down: its last messages too
        try:
            with _quiet_ray(ray):
                _check_resources(ray, opts, started_here=here)
                with lines.quiet_when_stopped():
                    yield ray
        finally:
            _shut_down(ray)
            lines.finish()


def _start(ray, address: str | None, kwargs: dict) -> None:
    """``ray.init``, its failures one line each. A SIGTERM while it runs meets Ray's own handler,
    ``sys.exit(15)`` (the process ended with status 15, or 134, and no word): it goes again to
    the process's own handler, and where that one lets the process go on (SIG_IGN, or a handler
    that returns), Ray is started again, once."""
    for _ in range(2):
        try:
            with _quiet_fd2(not log.isEnabledFor(logging.DEBUG)), _keep_sigterm():
                ray.init(address=address, **kwargs)
            return
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = ("on this machine" if address == "local" else f"at {address}" if address
                     else f"at RAY_ADDRESS {os.environ.get('RAY_ADDRESS', '').strip()!r}")
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise InputError(f"cannot start or join Ray {where}: {first}") from None
        except SystemExit as e:
            if e.code != signal.SIGTERM:
                raise
            if ray.is_initialized():
                _shut_down(ray)
            # again, to the process's own handler (which may raise): raised in this thread, so the
            # handler runs now; os.kill may land on one of Ray's threads and the handler run later
            signal.raise_signal(signal.SIGTERM)
    raise InputError("Ray was stopped by a SIGTERM each time it started")


def _shut_down(ray) -> None:
    """``ray.shutdown()``, with nothing of this session's left for the garbage collector.

    A Ray Data job, finished or stopped part way (Ctrl-C, SIGTERM), leaves object references in
    reference cycles: 12 to 17 of them at this point, before this function collected them. If a
    collection (which can start on any allocation) frees one while Ray tears its core worker
    down, the reference reaches a core worker that is gone, and Ray ends the process on the spot
    ("The core worker has already been shutdown ... The process will exit": status 1, no
    message, so the CLI's own line and status never come). A CI run once ended a SIGTERM that
    way; this is the likeliest cause, and what is ruled out here: they are collected while Ray
    is up, and no collection runs during the teardown.

    A stop also leaves Ray Data's own driver threads running for a moment: the threads that
    feed ``iter_rows`` ("iter_threaded"), one of which may be shutting the dataset's executor
    down (reporting its stats to Ray), and the executor's scheduling loop. A Ray call from one
    of them after ``ray.shutdown()`` ends the process the same way; this was seen, in one
    SIGTERM'd job in six, with a feeding thread inside the executor's shutdown as the main
    thread reached here. They are waited for first (``RAY_DATA_THREADS_WAIT_S`` at most).

    ``ray.shutdown()`` also resets SIGTERM underneath Python (Python's record keeps the process's
    handler; a SIGTERM after it ended the process with no word): the handler is put back."""
    gc.collect()
    _wait_for_ray_data_threads(RAY_DATA_THREADS_WAIT_S)
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _keep_sigterm():
            ray.shutdown()
    finally:
        if enabled:
            gc.enable()


RAY_DATA_THREADS_WAIT_S = 5.0
# Ray Data's threads in the driver that end by themselves once a dataset's iteration is closed
# (or its iterator collected), and that call Ray while they end (its "Prefetcher" thread is not
# one: it parks until notified). An iterator left open past the session keeps them: the wait
# then ends at its bound, with a warning.
_RAY_DATA_THREADS = ("iter_threaded", "StreamingExecutor-", "ray-data-metadata-prefetch")


def _wait_for_ray_data_threads(timeout_s: float) -> None:
    """Join the threads named in ``_RAY_DATA_THREADS``, for ``timeout_s`` in all at most."""
    deadline = time.monotonic() + timeout_s
    for t in threading.enumerate():
        if t is threading.current_thread() or not t.name.startswith(_RAY_DATA_THREADS):
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            log.warning("Ray Data's thread %r is still running after %g s; shutting Ray down anyway",
                        t.name, timeout_s)
            return
        log.debug("waited for Ray Data's thread %r", t.name)


KILLED_BY_US = "killed by `ray.kill`"  # in Ray's note on an actor that its job's end (or a stop) killed


class _RayLines(io.TextIOBase):
    """Where what Ray's driver prints to stdout goes in a session: stderr, or (``quiet``, once the
    command is being stopped) only the debug log. Stopping kills Ray's actors, and its driver
    then prints a note per actor ("(raylet) Task ... failed ... killed by `ray.kill`"): those
    notes go only to the debug log at any time (they can come before the stop reaches here)."""

    def __init__(self) -> None:
        self.quiet = False
        self._mine = threading.local()  # per thread: Ray's log and error threads both print
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def quiet_when_stopped(self) -> Iterator[None]:
        """Quiet from a KeyboardInterrupt (Ctrl-C, or the CLI's SIGTERM) on, unless debugging."""
        try:
            yield
        except KeyboardInterrupt:
            self.quiet = not log.isEnabledFor(logging.DEBUG)
            raise

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        mine = self._mine  # a message is judged whole: print() writes it (lines and all), then its end
        end_of_dropped, mine.end_of_dropped = getattr(mine, "end_of_dropped", False), False
        if text == "\n" and end_of_dropped:
            return len(text)  # print()'s line end after a message that ended in one and was dropped
        mine.pending = getattr(mine, "pending", "") + text
        if mine.pending.endswith("\n"):
            dropped = self._emit(mine)
            mine.end_of_dropped = dropped and text != "\n"  # print() has its own line end to come
        return len(text)

    def _emit(self, mine) -> bool:
        message, mine.pending = mine.pending, ""
        if self.quiet or KILLED_BY_US in message:
            log.debug("ray: %s", message.rstrip())
            return True
        with self._lock:
            sys.stderr.write(message)
        return False

    def finish(self) -> None:
        """What is left of this thread's message without its line end, once the session is over."""
        mine = self._mine
        if getattr(mine, "pending", ""):
            mine.pending += "\n"
            self._emit(mine)

    def flush(self) -> None:
        sys.stderr.flush()


@contextlib.contextmanager
def _keep_sigterm() -> Iterator[None]:
    """The process's own SIGTERM handler, put back after the block: Ray's core worker installs a
    crash handler for SIGTERM that prints a stack dump and kills the process at once, so the
    CLI's handler (stop as Ctrl-C does, keep what was written, say so) would never run. Only
    the main thread can set a handler: started from another thread, Ray's stays.

    While Ray starts, a SIGTERM meets Ray's Python handler, ``sys.exit(15)``: the process ended
    with status 15 (or 134, as Ray's half-made core worker was torn down) and no word.
    :func:`ray_session` turns that exit back into a SIGTERM to the process's own handler."""
    handler = signal.getsignal(signal.SIGTERM)  # Python's record: Ray replaces it underneath
    try:
        yield
    finally:
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def _quiet_fd2(on: bool) -> Iterator[None]:
    """Send file descriptor 2 to /dev/null while Ray starts: its C++ logger writes a line there
    (about its own log level) before the level applies. Python errors are raised, not lost."""
    if not on:
        yield
        return
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _check_resources(ray, opts: EngineOptions, started_here: bool = True) -> None:
    """A Ray started here that can never hold even one worker is refused; a cluster joined
    (``--address``, RAY_ADDRESS) that is small is only logged (an autoscaling cluster may add nodes)."""
    res = ray.cluster_resources()
    cpus, gpus = res.get("CPU", 0.0), res.get("GPU", 0.0)
    if opts.gpus_per_worker > gpus and started_here:  # with or without --workers: it would wait forever
        raise InputError(f"--gpus-per-worker {opts.gpus_per_worker:g}: this machine has {gpus:g} GPU(s) for Ray")
    if opts.workers is None:
        return
    if opts.workers * opts.cpus_per_worker > cpus or opts.workers * opts.gpus_per_worker > gpus:
        log.warning("the cluster has %g CPU(s) and %g GPU(s); %d worker(s) want %g and %g: some wait "
                    "until the cluster grows", cpus, gpus, opts.workers, opts.workers * opts.cpus_per_worker,
                    opts.workers * opts.gpus_per_worker)


def map_shards(ray, shard_indices: list[int], actor_cls: type, ctor_kwargs: dict,
               opts: EngineOptions) -> Iterator[dict]:
    """Run ``actor_cls(**ctor_kwargs)(batch)`` over the shards on a pool of ``opts.workers`` actors.

    One row (``{"shard": k}``) and one block per shard, so Ray balances whole shards across the
    actors; yields each returned row as the shards finish (in no particular order).

    Close it (``contextlib.closing``) inside the :func:`ray_session` block, as a stop (Ctrl-C,
    SIGTERM) leaves it: closing shuts Ray Data's executor for this dataset down (its scheduling
    loop, its actors) while Ray is up. Left to the garbage collector, that clean-up would run
    whenever a collection does, perhaps during Ray's teardown (see ``_shut_down``).
    """
    if not shard_indices:
        return
    import ray.data

    workers = opts.workers or pool_size(ray, opts)
    log.info("%d worker(s) for %d shard(s)", workers, len(shard_indices))
    with warnings.catch_warnings():  # Ray Data's own deprecation notes, raised as it copies its context
        warnings.simplefilter("ignore", DeprecationWarning)
        # a worker's own error (an InputError naming a line, say) reaches the driver as itself,
        # not wrapped in Ray Data's UserCodeException (which loses it): see unwrap_error
        ray.data.DataContext.get_current().raise_original_map_exception = True
        ds = ray.data.from_items([{"shard": int(k)} for k in shard_indices],
                                 override_num_blocks=len(shard_indices))
        ds = ds.map_batches(actor_cls, fn_constructor_kwargs=ctor_kwargs, batch_size=1, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=min(workers, len(shard_indices)),
                                                               max_tasks_in_flight_per_actor=2),
                            **worker_remote_args(opts))
        rows = iter(ds.iter_rows())  # a generator: close() runs its clean-up
    try:
        yield from rows
    finally:
        rows.close()


def worker_remote_args(opts: EngineOptions) -> dict:
    """What Ray reserves for each worker of ``opts``, and how often it starts a dead one again."""
    remote: dict = {"num_cpus": opts.cpus_per_worker, "max_restarts": WORKER_RESTARTS}
    if opts.gpus_per_worker > 0:
        remote["num_gpus"] = opts.gpus_per_worker
    return remote


def pool_size(ray, opts: EngineOptions) -> int:
    """``opts.workers``, or as many workers as the cluster's CPUs (or GPUs) hold, at least 1."""
    if opts.workers is not None:
        return opts.workers
    res = ray.cluster_resources() if ray.is_initialized() else {"CPU": float(usable_cpus())}
    n = int(res.get("CPU", 1.0) // opts.cpus_per_worker)
    if opts.gpus_per_worker > 0:
        n = min(n, int(res.get("GPU", 0.0) // opts.gpus_per_worker))
    return max(1, n)


def unwrap_error(e: BaseException) -> BaseException:
    """The bertscope error inside a Ray error (a worker's InputError, say), else ``e`` itself.

    Ray re-raises a worker's exception as a RayTaskError subclass of the same class, whose text
    carries the remote traceback; the original, with its one-line message, is its ``cause``.
    A worker whose constructor raised (no CUDA where --gpus-per-worker asked for it, say)
    reaches the driver as an ActorDiedError that keeps only the text: its last line names the
    error, which is made again from it. A worker whose process died each time it was started
    (:data:`WORKER_RESTARTS`) is a :class:`WorkerDied`.
    """
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, BertscopeError) and type(cur).__module__.startswith("bertscope"):
            first = str(cur).split("\n", 1)[0]  # Ray Data appends its retry advice to the message
            return cur if first == str(cur) else type(cur)(first)
        if getattr(cur, "actor_init_failed", False) is True:
            said = _error_in_text(str(cur))
            if said is not None:
                return said
        if type(cur).__name__ == "ActorDiedError" and DIED in str(cur):
            return WorkerDied.from_ray(str(cur))
        inner = getattr(cur, "cause", None)
        cur = inner if isinstance(inner, BaseException) else (cur.__cause__ or cur.__context__)
    return e


DIED = "its worker process has died"  # what Ray's ActorDiedError says of a process that died


class WorkerDied(BertscopeError):
    """A Ray worker's process died (killed, out of memory, a crash) once more than Ray starts one
    again (:data:`WORKER_RESTARTS`, counted over the job: at its start or hours into it alike)."""

    @classmethod
    def from_ray(cls, text: str) -> "WorkerDied":
        kind = re.search(r"Worker exit type: (\w+)", text)
        return cls(f"a Ray worker's process died {WORKER_RESTARTS + 1} times in this job, once more than Ray "
                   f"starts one again ({WORKER_RESTARTS}){f', Ray says: exit type {kind.group(1)}' if kind else ''}; "
                   f"it was killed, ran out of memory or crashed: its log on the machine it ran on says which "
                   f"(/tmp/ray/session_latest/logs), and fewer workers per machine give each more memory")


def _error_in_text(text: str) -> BertscopeError | None:
    """The bertscope error a remote traceback's text ends with ("bertscope.errors.InputError:
    MESSAGE"), made again; None if it ends with anything else."""
    from .. import errors

    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    name, sep, message = lines[-1].partition(": ")
    cls = getattr(errors, name.removeprefix("bertscope.errors."), None) if name.startswith("bertscope.errors.") else None
    if not (sep and isinstance(cls, type) and issubclass(cls, BertscopeError)):
        return None
    return cls(message)
