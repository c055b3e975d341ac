"""glibc's thresholds, fixed by the fast path so that freed activations stay in the process.

Each behaviour is checked in fresh processes with glibc's defaults: a young process's thresholds
are what the fix is about, and the test process's own were fixed by earlier tests. The measure is
the heap's size from ``mallinfo``, not page faults: transparent huge pages change the fault count
on some machines, but they do not change how much heap glibc keeps.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import bertscope

from bertscope.fast import heap
from bertscope.fast.encoder import PackedEncoder
from heapkit import MALLINFO, glibc_defaults_env

MiB = 2**20

# Eight 20 MiB blocks (under the 32 MiB mmap threshold, so from the heap once the threshold is up),
# touched, freed, allocated and touched again: how much does the heap shrink when the second
# round's blocks are freed? Even with its dynamic thresholds at their highest, glibc gives most of
# the 160 MiB back to the system once the free top of the heap passes its trim threshold (62 MiB
# here, 64 MiB at most); with the heap kept (256 MiB) none of it.
PROBE = MALLINFO + """
import json, sys
from bertscope.fast.tuning import settle_allocator

policy = None
if sys.argv[1] == "keep":
    from bertscope.fast.heap import keep_heap
    policy = keep_heap().to_json()
elif sys.argv[1] == "load":  # the way users get it: a model run on the fast path
    import bertscope
    from bertscope.core.checkpoint import bundled_model_path
    bert = bertscope.load(bundled_model_path())
    bert.embed(["the fast path runs once"])
    policy = bert.fast.heap.to_json()
settle_allocator()  # glibc's dynamic thresholds at their highest (31 and 62 MiB), as in a long-running process
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
for _ in range(2):  # straight from C, so that no object of Python's or torch's lands between the blocks
    blocks = [libc.malloc(20 * 2**20) for _ in range(8)]
    for b in blocks:
        ctypes.memset(b, 1, 20 * 2**20)
    held = info().arena  # the heap's size with the blocks in use
    for b in reversed(blocks):
        libc.free(b)
print(json.dumps({"policy": policy, "returned_mib": (held - info().arena) / 2**20}))
"""


def probe(mode: str, **env) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300,
                       env={**glibc_defaults_env(), **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_keeping_the_heap_holds_freed_activations_that_glibc_would_return():
    young = probe("young")
    assert young["returned_mib"] >= 96  # glibc's defaults: all but at most 64 MiB of the 160 returned
    kept = probe("keep")
    assert kept["returned_mib"] == 0  # all eight blocks' memory still in the process
    assert kept["policy"]["kept"] is True
    assert kept["policy"]["mmap_threshold"] == 32 * MiB and kept["policy"]["trim_threshold"] == heap.KEEP_TRIM_BYTES


def test_the_fast_path_keeps_the_heap_at_its_first_cpu_run_unless_told_not_to():
    loaded = probe("load")
    assert loaded["policy"]["kept"] is True and loaded["returned_mib"] == 0
    system = probe("load", **{heap.HEAP_ENV: "system"})
    assert system["policy"]["kept"] is False and "BERTSCOPE_HEAP=system" in system["policy"]["detail"]
    assert system["returned_mib"] >= 96


@pytest.mark.parametrize("env, says", [
    ({heap.HEAP_ENV: "system"}, "BERTSCOPE_HEAP=system"),
    ({heap.HEAP_ENV: "always"}, "is not 'keep' or 'system'"),
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "MALLOC_TRIM_THRESHOLD_=1000000"),
    ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "MALLOC_MMAP_THRESHOLD_=65536"),
    ({"MALLOC_MMAP_MAX_": "0"}, "MALLOC_MMAP_MAX_=0"),
    ({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=1000000"},
     "GLIBC_TUNABLES sets glibc.malloc.trim_threshold"),
])
def test_thresholds_someone_else_set_are_left_alone(monkeypatch, env, says):
    for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
              "GLIBC_TUNABLES", heap.HEAP_ENV):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    called = []
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda *a, **k: called.append(a))  # mallopt must not be reached
    policy = heap.keep_heap()
    assert policy.kept is False and says in str(policy) and called == []
    assert policy.mmap_threshold is None and policy.trim_threshold is None


def test_glibc_tunables_that_are_not_thresholds_do_not_stop_it(monkeypatch):
    monkeypatch.delenv(heap.HEAP_ENV, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")
    monkeypatch.setattr(heap, "_glibc_version", lambda: "2.36")
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda *a, **k: FakeLibc(1))
    monkeypatch.setattr(heap, "_malloc_is_glibcs", lambda libc: True)
    assert heap._left_alone_because() is None
    assert heap.keep_heap().kept is True


class FakeLibc:
    """glibc's mallopt answering ``answer`` (1 accepted, 0 refused), recording its calls."""

    def __init__(self, answer: int):
        self.calls = []
        libc = self

        class Mallopt:
            def __call__(self, param, value):
                libc.calls.append((param, value))
                return answer

        self.mallopt = Mallopt()


def test_another_allocators_malloc_is_left_alone(monkeypatch):
    # here, a plain Python on glibc, the malloc in use is glibc's own: the comparison itself
    import ctypes
    assert heap._malloc_is_glibcs(ctypes.CDLL("libc.so.6")) is True
    monkeypatch.delenv(heap.HEAP_ENV, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    monkeypatch.setattr(heap, "_glibc_version", lambda: "2.36")
    fake = FakeLibc(1)
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda *a, **k: fake)
    monkeypatch.setattr(heap, "_malloc_is_glibcs", lambda libc: False)  # as under jemalloc or tcmalloc
    policy = heap.keep_heap()
    assert policy.kept is False and "malloc is not glibc's; LD_PRELOAD=" in policy.detail and fake.calls == []


def test_a_threshold_glibc_refuses_is_reported_not_raised(monkeypatch):
    monkeypatch.delenv(heap.HEAP_ENV, raising=False)
    monkeypatch.setattr(heap, "_glibc_version", lambda: "2.36")
    monkeypatch.setattr(heap, "_left_alone_because", lambda: None)
    monkeypatch.setattr(heap, "_malloc_is_glibcs", lambda libc: True)
    fake = FakeLibc(0)
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda *a, **k: fake)
    policy = heap.keep_heap()
    assert policy.kept is False and "refused" in policy.detail and fake.calls == [(-3, 32 * MiB)]


def test_a_c_library_other_than_glibc_is_left_alone(monkeypatch):
    monkeypatch.delenv(heap.HEAP_ENV, raising=False)
    monkeypatch.setattr(heap, "_glibc_version", lambda: None)
    monkeypatch.setattr(heap, "_left_alone_because", lambda: None)
    policy = heap.keep_heap()
    assert policy.kept is False and "not glibc" in policy.detail


def test_the_encoder_asks_once_and_only_for_cpu_models(monkeypatch):
    calls = []
    monkeypatch.setattr("bertscope.fast.encoder.keep_heap",
                        lambda: calls.append(1) or heap.HeapPolicy(True, "kept", 1, 2))
    config = bertscope.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=128)
    with torch.device("meta"):  # a model on another device: its allocations are not glibc's
        elsewhere = bertscope.BertModel(config).eval()
    enc = PackedEncoder()
    enc.prepare(elsewhere)
    assert calls == [] and enc.heap is None
    model = bertscope.BertModel(config).eval()
    enc.prepare(model)
    enc.prepare(model)
    assert calls == [1] and enc.heap.detail == "kept"
