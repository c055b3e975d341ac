"""The C allocator's thresholds: keep the fast path's freed activations in the process.

torch allocates every activation with the C library's ``malloc``. glibc's ``malloc`` has two
dynamic thresholds that decide whether freed memory stays in the process:

    mmap threshold  a block this large or larger, when the free top of the heap cannot hold it,
                    is mapped fresh from the system, and unmapped on free. It starts at 128 KiB
                    and rises to the size of the largest such block freed, up to 32 MiB.
    trim threshold  once the free memory at the top of the heap reaches it, ``free`` returns
                    that memory to the system. It follows at twice the mmap threshold, so at
                    most 64 MiB.

Memory returned to the system is faulted back in, page by page, when the next batch touches it.
A BERT-base layer at 2,048 tokens leaves up to about 84 MiB free at the top of the heap
(measured with ``mallinfo2``), more than 64 MiB, so with glibc's defaults the process can give it
back and fault it in again on every layer of every batch. Whether it does depends on what else
the process has allocated. Measured on an AMD EPYC (docs/BENCHMARKS.md, "glibc's heap kept"),
BERT-base at T = 128:

- in processes of their own, with the kernel choice cached, the compiled int8 steps faulted
  from a few to about 515,000 pages per 4,096-token ``embed`` (2 GB), depending on the process,
  and fp32 up to about 34,000;
- in a process that also ran sentence-transformers, HF transformers and ONNX Runtime, fp32
  faulted 13,824 pages per call, the eager int8 steps 7,658 and the compiled int8 steps 314,336;
- there, fixing the mmap threshold alone (which freezes the trim threshold where it was, 64 MiB
  at most) left the faults, and raising the trim threshold to 1 GiB or to 256 MiB removed them:
  0 faults per call for every bertscope system.

:func:`keep_heap` fixes both thresholds for the whole process, the first time the fast path
runs a model on the CPU (inference or training):

- the mmap threshold at 32 MiB: blocks under it come from the heap. That is the highest glibc's
  own dynamic threshold can reach; :func:`bertscope.fast.tuning.too_wide` keeps batches under it;
- the trim threshold at ``KEEP_TRIM_BYTES`` (256 MiB): up to that much free memory at the top of
  the heap stays in the process, about three times the most measured above (84 MiB).

The cost is memory. In the main heap, up to 256 MiB of freed memory, on top of what the process
uses, is no longer returned to the system; the heaps of worker threads' arenas (64 MiB each at
most) are no longer shrunk either. ``malloc_trim`` (:func:`release_free_memory`) returns all of
it, and ``bertscope embed`` jobs call it after every shard. Fixing any glibc threshold also stops
the dynamic adjustment of both, which is why both are set. A threshold that another library
fixed with ``mallopt`` inside the process is overwritten.

The thresholds are left alone:

- when ``BERTSCOPE_HEAP=system``;
- when the environment sets glibc's malloc thresholds (``MALLOC_TRIM_THRESHOLD_``,
  ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_``, or those settings in
  ``GLIBC_TUNABLES``);
- when ``malloc`` is not glibc's (an allocator preloaded or linked in: jemalloc, tcmalloc, ...);
- when the C library is not glibc (musl, macOS, Windows).

``bertscope doctor`` prints which case applies, and ``bench`` records it in its JSON.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

__all__ = ["HEAP_ENV", "KEEP_MMAP_BYTES", "KEEP_TRIM_BYTES", "HeapPolicy", "keep_heap", "release_free_memory"]

HEAP_ENV = "BERTSCOPE_HEAP"  # "keep" (the default) or "system"
KEEP_MMAP_BYTES = 32 * 2**20  # glibc's own ceiling for its dynamic mmap threshold on 64-bit systems
KEEP_TRIM_BYTES = 256 * 2**20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_GLIBC_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
_GLIBC_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold", "glibc.malloc.top_pad",
                   "glibc.malloc.mmap_max")
_LIBC = "libc.so.6"  # glibc's soname on every Linux it ships for


@dataclass(frozen=True)
class HeapPolicy:
    """What :func:`keep_heap` did. ``kept``: the thresholds are fixed (then both byte counts are set);
    ``detail``: one line saying why or why not."""

    kept: bool
    detail: str
    mmap_threshold: int | None = None
    trim_threshold: int | None = None

    def __str__(self) -> str:
        return self.detail

    def to_json(self) -> dict:
        return asdict(self)


def _glibc_version() -> str | None:
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36" on glibc; unset or missing elsewhere
    except (AttributeError, ValueError, OSError):
        return None
    return v.split()[-1] if v and v.startswith("glibc") else None


def _left_alone_because() -> str | None:
    mode = os.environ.get(HEAP_ENV, "keep").strip().lower()
    if mode == "system":
        return f"left to glibc's defaults ({HEAP_ENV}=system)"
    if mode not in ("", "keep"):
        return f"left to glibc's defaults ({HEAP_ENV}={os.environ[HEAP_ENV]!r} is not 'keep' or 'system')"
    for name in _GLIBC_VARIABLES:
        if name in os.environ:
            return f"left as the environment sets it ({name}={os.environ[name]})"
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    set_there = [t for t in _GLIBC_TUNABLES if t in tunables]
    if set_there:
        return f"left as the environment sets it (GLIBC_TUNABLES sets {', '.join(set_there)})"
    return None


def _malloc_is_glibcs(libc) -> bool:
    """Whether the process's ``malloc`` is glibc's own, not one an allocator put in front of it
    (preloaded with ``LD_PRELOAD``, or linked into the program)."""
    in_use = ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value
    return in_use == ctypes.cast(libc.malloc, ctypes.c_void_p).value


def keep_heap() -> HeapPolicy:
    """Fix glibc's mmap threshold at 32 MiB and its trim threshold at 256 MiB for this process,
    unless the module doc's exceptions apply; what was done, as a :class:`HeapPolicy`.

    Process-wide: every library in the process allocates under these thresholds from then on,
    and nothing here restores glibc's defaults. Each call reads the environment again and sets
    the same values again."""
    why = _left_alone_because()
    if why is not None:
        return HeapPolicy(False, why)
    version = _glibc_version()
    if version is None:
        return HeapPolicy(False, "left to the system's allocator (the C library is not glibc)")
    try:
        libc = ctypes.CDLL(_LIBC)
        mallopt = libc.mallopt
        glibc_malloc = _malloc_is_glibcs(libc)
    except (OSError, AttributeError) as e:
        return HeapPolicy(False, f"left to glibc's defaults (mallopt not found: {e})")
    if not glibc_malloc:
        preload = os.environ.get("LD_PRELOAD")
        return HeapPolicy(False, "left to the allocator in use (malloc is not glibc's"
                          + (f"; LD_PRELOAD={preload})" if preload else ")"))
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not mallopt(_M_MMAP_THRESHOLD, KEEP_MMAP_BYTES):  # first: fixing any threshold freezes the other
        return HeapPolicy(False, f"left to glibc's defaults (glibc {version} refused a 32 MiB mmap threshold)")
    if not mallopt(_M_TRIM_THRESHOLD, KEEP_TRIM_BYTES):
        return HeapPolicy(False, f"mmap threshold 32 MiB; trim threshold refused by glibc {version}",
                          mmap_threshold=KEEP_MMAP_BYTES)
    detail = (f"glibc {version}: blocks under {KEEP_MMAP_BYTES >> 20} MiB from the heap, up to "
              f"{KEEP_TRIM_BYTES >> 20} MiB of freed heap kept ({HEAP_ENV}=system leaves glibc's defaults)")
    log.debug("heap: %s", detail)
    return HeapPolicy(True, detail, KEEP_MMAP_BYTES, KEEP_TRIM_BYTES)


def release_free_memory() -> bool:
    """Ask the C allocator to return the free memory it holds to the system (glibc's
    ``malloc_trim(0)``); whether it could (False where the C library is not glibc)."""
    try:
        trim = ctypes.CDLL(_LIBC).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
