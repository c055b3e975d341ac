"""For tests of glibc's heap in fresh processes: the environment with glibc's defaults, and the
lines a probe script starts with to read ``mallinfo`` (``info()``: the heap's byte counts)."""

from __future__ import annotations

import os

# the start of a probe script: `libc` (glibc) and `info()`, its mallinfo2 (mallinfo before 2.33)
MALLINFO = """
import ctypes
NAMES = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in NAMES]
class MallInfo(ctypes.Structure):  # glibc before 2.33 has only mallinfo, with int fields
    _fields_ = [(n, ctypes.c_int) for n in NAMES]
libc = ctypes.CDLL("libc.so.6")
if hasattr(libc, "mallinfo2"):
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2
else:
    libc.mallinfo.restype = MallInfo
    info = libc.mallinfo
"""


def glibc_defaults_env() -> dict:
    """This environment without anything that sets glibc's thresholds, puts another allocator in
    front of it, or tells bertscope to leave them alone."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD", "BERTSCOPE_HEAP")}
