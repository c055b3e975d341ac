"""bertscope on Ray: the Ray engine writes what the local engine writes, resumes after its driver
is killed, survives a worker's death; embed_dataset equals Bert.embed; heads --engine ray equals
the local statistics; bad input is one line. One local Ray (2 CPUs) serves the whole module."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import ray
import torch

from bertscope.cli.app import main
from bertscope.errors import InputError
from bertscope.fast.embedjob import KILL_HOOK_ENV, JobOptions, read_embeddings, run_embed_job
from bertscope.scale import EngineOptions, embed_dataset, ray_head_stats, run_ray_embed_job
from bertscope.scale.cluster import check_engine_options, check_local_capacity
from bertscope.scale.embed import WORKER_KILL_HOOK_ENV
from bertscope.understand.headstats import CLASSES, STATS, head_stats

SRC = str(Path(__file__).resolve().parents[1] / "src")
WORDS = ("the cat sat on a mat while two dogs ran far away from it quickly under bright blue "
         "skies and nobody saw where they went after that long day").split()


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module's tests (started here, shut down after the last one)."""
    # the workers import this module by name (for _Refuses below): put its folder on their path
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _env(**extra: str) -> dict:
    """This process's environment for a subprocess that imports bertscope from this tree."""
    return dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) for _ in range(n)]


def _mixed_jsonl(path: Path, n: int = 1200) -> Path:
    """JSON Lines with blank, non-UTF-8, bad-JSON and field-less lines mixed in."""
    rows = []
    for i, text in enumerate(_sentences(n, seed=7)):
        kind = i % 50
        if kind == 3:
            rows.append(b"")
        elif kind == 11:
            rows.append(b'{"text": "caf\xe9 \xff"}')
        elif kind == 19:
            rows.append(b'{"text": "unclosed')
        elif kind == 27:
            rows.append(json.dumps({"body": text}).encode())
        elif kind == 35:
            rows.append(json.dumps({"text": None}).encode())
        else:
            rows.append(json.dumps({"text": text, "id": i}).encode())
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


def _cli(args, capsys):
    code = main(args)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _driver_log_tail(pid: int, lines: int = 40) -> str:
    """The end of Ray's log for the driver process ``pid`` in this module's session, to explain a
    failure (where Ray ended a driver itself, this is where it says so)."""
    try:
        logs = Path(ray._private.worker._global_node.get_logs_dir_path())
        found = sorted(logs.glob(f"python-core-driver-*_{pid}.log"))
        records = [r for r in found[0].read_text(errors="replace").splitlines() if r.startswith("[")] if found else []
        text = records[-lines:] or ["(no log)"]  # its records, without the messages they print in full
    except Exception as e:  # a diagnostic only: never the reason a test fails
        text = [f"(no log: {e})"]
    return "\nRay's log for the driver:\n" + "\n".join(text)


def _table(out: Path):
    t = pq.read_table(out)
    return (t.column("line").to_pylist(), t.column("status").to_pylist(),
            np.stack(t.column("embedding").to_numpy(zero_copy_only=False)))


def test_ray_engine_equals_local_engine_row_for_row(cluster, tmp_path, capsys):
    inp = _mixed_jsonl(tmp_path / "in.jsonl")
    args = [str(inp), "--shard-rows", "200", "--format", "parquet", "--quiet"]  # 6 shards, 3 per worker
    code, _, err = _cli(["embed", *args, "--out", str(tmp_path / "local")], capsys)
    assert code == 0, err
    code, out_ray, err_ray = _cli(["embed", *args, "--out", str(tmp_path / "ray"), "--engine", "ray",
                                   "--workers", "2"], capsys)
    assert code == 0, err_ray
    assert err_ray == err  # the same problems reported, line by line
    lines_l, status_l, emb_l = _table(tmp_path / "local")
    lines_r, status_r, emb_r = _table(tmp_path / "ray")
    assert lines_r == lines_l == list(range(1, 1201))
    assert status_r == status_l
    assert {"empty", "undecodable", "bad_json", "no_field", "not_text"} <= set(status_l)
    # Ray's workers run one thread each, so their kernel choice is their own (another GEMM may
    # win), and shards batch texts differently: equal within 1e-5, the suite's cross-path bound
    assert np.abs(emb_r - emb_l).max() <= 1e-5
    ml = json.loads((tmp_path / "local" / "_manifest.json").read_text())
    mr = json.loads((tmp_path / "ray" / "_manifest.json").read_text())
    assert mr["problems"] == ml["problems"] and [s["sha256"] for s in mr["shards"]] == [s["sha256"] for s in ml["shards"]]
    assert [r["engine"] for r in mr["runs"]] == ["ray"] and [r["engine"] for r in ml["runs"]] == ["local"]
    emb, status = read_embeddings(tmp_path / "ray")  # the library reader reads it unchanged
    assert status == status_l and np.array_equal(emb, emb_r)


def test_ray_driver_killed_then_resumed_equals_an_uninterrupted_run(cluster, tmp_path, bert, capsys, monkeypatch):
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(_sentences(400, seed=3)) + "\n")
    whole = run_embed_job(bert, inp, tmp_path / "whole", JobOptions(shard_rows=20, fmt="parquet"))
    assert whole.shards == 20  # many: the killed driver leaves some to resume, however far the workers got

    out = tmp_path / "out"
    env = _env(**{KILL_HOOK_ENV: "3"})
    killed = subprocess.run([sys.executable, "-m", "bertscope", "embed", str(inp), "--out", str(out), "--shard-rows",
                             "20", "--format", "parquet", "--quiet", "--engine", "ray", "--address", cluster,
                             "--workers", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # the driver died after 3 shards
    deadline = time.monotonic() + 60  # Ray ends a dead driver's actors: wait until their CPUs are back
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    staged = {int(p.name[6:11]): p.stat().st_mtime_ns for p in (out / "_staging").glob("_part-*.json")}
    assert 3 <= len(staged) < 20
    try:
        table = pq.read_table(out)
    except Exception:  # a dataset reader that refuses the folder sees no rows either
        table = None
    assert table is None or table.num_rows == 0  # an unfinished job reads as nothing

    code, stdout, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "20", "--format", "parquet",
                              "--quiet", "--engine", "ray", "--workers", "2", "--resume"], capsys)
    assert code == 0, err
    assert f"({len(staged)} already done)" in stdout
    manifest = json.loads((out / "_manifest.json").read_text())
    runs = {s["shard"]: s["run"] for s in manifest["shards"]}
    assert {k for k, r in runs.items() if r == 1} == set(staged)  # what run 1 finished, run 2 did not redo
    assert {k for k, r in runs.items() if r == 2} == set(range(20)) - set(staged)
    lines_w, status_w, emb_w = _table(tmp_path / "whole")
    lines, status, emb = _table(out)
    assert lines == lines_w == list(range(1, 401)) and status == status_w
    assert np.abs(emb - emb_w).max() <= 1e-5  # Ray's workers against this process: the cross-path bound

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("bertscope.bert.load", no_load)  # the finished job, resumed again: confirmed
    code, stdout, err = _cli(["embed", str(inp), "--out", str(out), "--quiet", "--engine", "ray",  # without it
                              "--workers", "2", "--resume"], capsys)
    assert code == 0 and "(20 already done)" in stdout, err


def test_sigterm_stops_a_ray_job_with_one_line_and_it_resumes(cluster, tmp_path, capsys):
    """Ray's core worker installs a crash handler for SIGTERM (a stack dump, then death by the
    signal) over the CLI's; and once stopped, Ray's driver printed a "(raylet) Task ... killed by
    ray.kill" line per actor. Now: the CLI's one line, exit 143, and --resume finishes the job."""
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(_sentences(400, seed=5)) + "\n")
    out = tmp_path / "out"
    # Ray's own log at "info" (the CLI sets "fatal"): it goes to the driver's log file, not to stderr,
    # and says why if Ray ends the process itself (a CI run once saw status 1 and nothing on stderr)
    env = _env(RAY_BACKEND_LOG_LEVEL="info", **{KILL_HOOK_ENV: "2:TERM"})
    with subprocess.Popen([sys.executable, "-m", "bertscope", "embed", str(inp), "--out", str(out), "--shard-rows",
                           "40", "--quiet", "--engine", "ray", "--address", cluster, "--workers", "2"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out_text, err_text = proc.communicate(timeout=300)
    stopped = subprocess.CompletedProcess(proc.args, proc.returncode, out_text, err_text)
    assert stopped.returncode == 143, stopped.stderr + _driver_log_tail(proc.pid)
    assert stopped.stderr.splitlines()[-1] == "bertscope: terminated; rerun the same command with --resume to finish"
    assert "SIGTERM received" not in stopped.stderr and "ray.kill" not in stopped.stderr, stopped.stderr
    assert stopped.stdout == ""
    deadline = time.monotonic() + 60  # Ray ends the stopped driver's actors: wait until their CPUs are back
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    code, stdout, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "40", "--quiet",
                              "--engine", "ray", "--workers", "2", "--resume"], capsys)
    assert code == 0, err
    assert read_embeddings(out)[0].shape == (400, 384)


def test_a_worker_killed_mid_shard_is_retried_and_every_row_is_written_once(cluster, tmp_path, bert, monkeypatch):
    inp = tmp_path / "in.txt"
    texts = _sentences(240, seed=5)
    inp.write_text("\n".join(texts) + "\n")
    marker = tmp_path / "a-worker-died"
    monkeypatch.setenv(WORKER_KILL_HOOK_ENV, str(marker))
    res = run_ray_embed_job(None, inp, tmp_path / "out", JobOptions(shard_rows=40, fmt="parquet"),
                            engine=EngineOptions(workers=2))
    assert marker.exists()  # a worker really SIGKILLed itself in the middle of a shard
    assert res.rows == 240 and res.shards == 6
    lines, status, emb = _table(tmp_path / "out")
    assert lines == list(range(1, 241)) and status == ["ok"] * 240  # every row, once, in order
    assert np.abs(emb - bert.embed(texts)).max() <= 1e-5  # the cross-path bound (a worker's own kernels)


def test_a_job_begun_locally_is_finished_by_ray(cluster, tmp_path, bert, capsys):
    inp = tmp_path / "in.txt"
    texts = _sentences(120, seed=13)
    inp.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out"

    def stop_after_two_shards(n, seen=[0]):
        seen[0] += n
        if seen[0] > 80:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_embed_job(bert, inp, out, JobOptions(shard_rows=40), progress=stop_after_two_shards)
    code, stdout, err = _cli(["embed", str(inp), "--out", str(out), "--shard-rows", "40", "--engine", "ray",
                              "--workers", "1", "--resume", "--quiet"], capsys)
    assert code == 0 and "(2 already done)" in stdout, err
    manifest = json.loads((out / "_manifest.json").read_text())
    assert [r["engine"] for r in manifest["runs"]] == ["local", "ray"]
    assert [s["run"] for s in manifest["shards"]] == [1, 1, 2]
    emb, status = read_embeddings(out)
    assert status == ["ok"] * 120 and np.abs(emb - bert.embed(texts)).max() <= 1e-5


def test_embed_dataset_equals_bert_embed_and_writes_parquet(cluster, tmp_path, bert):
    import ray.data

    texts = _sentences(60, seed=9) + ["", "   ", "word " * 400]
    items = [{"text": t, "id": i} for i, t in enumerate(texts)] + [{"text": None, "id": len(texts)}]
    source = ray.data.from_items(items, override_num_blocks=8)
    ds = embed_dataset(source, text_column="text", workers=2, batch_size=8)
    assert not source.context.execution_options.preserve_order  # the caller's dataset keeps its own
    rows = ds.take_all()
    # in order, as the docstring says (two actors' batches came back in the order they finished)
    assert [r["id"] for r in rows] == list(range(len(items)))
    got = np.stack([np.asarray(r["embedding"], dtype=np.float32) for r in rows])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the long text is truncated, as Bert.embed warns
        ref = bert.embed(texts)
    assert got.dtype == np.float32 and got.shape == (len(items), bert.config.hidden_size)
    assert np.abs(got[:len(texts)] - ref).max() <= 1e-5  # the cross-path bound (a worker's own kernels)
    assert [r["status"] for r in rows][-5:] == ["ok", "empty", "empty", "truncated", "not_text"]
    assert not got[-1].any()

    ds.write_parquet(str(tmp_path / "pq"))  # composes with Ray Data's writers
    table = pq.read_table(tmp_path / "pq")
    assert str(table.schema.field("embedding").type) == f"fixed_size_list<element: float>[{bert.config.hidden_size}]"
    assert table.column("id").to_pylist() == list(range(len(items)))  # the files, read in name order
    back = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    assert np.abs(back - got).max() <= 1e-5  # computed again (lazy), perhaps by the other actor: its own kernels


def test_heads_on_ray_equals_the_local_engine(cluster, tmp_path, bert, capsys):
    corpus = tmp_path / "corpus.txt"
    lines = _sentences(14, seed=11)
    lines[3] = ""
    lines[5] = lines[5] + "\r" + lines[6]  # a lone "\r" stays inside its line (as embed counts lines)
    raw = ("\n".join(lines).encode() + b"\n\xff\xfe not utf-8\n\xff second bad\n"
           + b"The animal didn't cross the street, because it was tired.\n")
    corpus.write_bytes(raw)
    from bertscope.files import read_lines

    items, read_warns = read_lines(corpus)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count (1 CPU each): the same forward arithmetic
    try:
        local = head_stats(bert, items)
    finally:
        torch.set_num_threads(threads)
    seen: list[tuple[int, int]] = []
    hs, warns = ray_head_stats(corpus, engine=EngineOptions(workers=2), shard_lines=4,
                               progress=lambda done, total: seen.append((done, total)))
    n_lines = raw.count(b"\n")
    assert len(seen) == -(-n_lines // 4) and seen[-1] == (n_lines, n_lines)  # one call per shard; all lines at the end
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert warns == read_warns and len(warns) == 1  # the non-UTF-8 lines, with their numbers, once
    assert "2 lines are not UTF-8 text (lines 15, 16)" in warns[0]
    assert hs.num_texts == local.num_texts == 14 and hs.num_tokens == local.num_tokens
    for k in STATS:
        rel = ((hs.stats[k].double() - local.stats[k].double()).abs() / local.stats[k].double().abs().clamp_min(1e-30))
        assert float(rel.max()) <= 1e-9, k
    for k in local.features:
        assert torch.allclose(hs.features[k].double(), local.features[k].double(), rtol=1e-9, atol=0), k
    assert hs.classes == local.classes
    for c in CLASSES:
        assert torch.equal(hs.class_counts[c], local.class_counts[c])

    code, out, err = _cli(["heads", str(corpus), "--engine", "ray", "--workers", "2", "--json"], capsys)
    assert code == 0 and json.loads(out)["classes"] == local.classes
    assert "(lines 15, 16)" in err


@contextlib.contextmanager
def hang_guard(seconds: int):
    """Fail (rather than stall the suite) if the block has not returned after ``seconds``: a
    guard against hanging, far above any machine's time for it, not a measure of speed."""
    def hung(signum, frame):
        raise TimeoutError(f"no answer after {seconds} s: hung")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("args, message", [
    (["--engine", "ray", "--workers", "0"], "--workers must be at least 1"),
    (["--engine", "ray", "--cpus-per-worker", "inf"], "--cpus-per-worker must be a number above 0, not inf"),
    (["--engine", "ray", "--gpus-per-worker", "nan"], "--gpus-per-worker must be a number, 0 or more, not nan"),
    (["--engine", "ray", "--address", "127.0.0.1:1"], "cannot reach a Ray cluster at 127.0.0.1:1"),
    (["--engine", "ray", "--address", "no-such-host.invalid:6379"], "cannot reach a Ray cluster"),
    (["--address", "auto"], "--address needs --engine ray"),
    (["--engine", "ray", "--address", "localhost"],
     "--address must be auto, HOST:PORT or ray://HOST:PORT, not 'localhost'"),
])
@pytest.mark.parametrize("command", ["embed", "heads"])
def test_bad_engine_input_is_one_line(cluster, tmp_path, capsys, command, args, message):
    inp = tmp_path / "in.txt"
    inp.write_text("one text\nanother\n")
    extra = ["--out", str(tmp_path / "o")] if command == "embed" else []
    with hang_guard(300):  # an unreachable cluster is refused with a message, not waited on forever
        code, stdout, err = _cli([command, str(inp), *extra, *args], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not (tmp_path / "o").exists()


def test_ray_that_fails_to_start_leaves_output_as_it_was(tmp_path, capsys, monkeypatch):
    """Ray refusing to start (a cluster address that answers but is not Ray takes 20 s to fail, so
    the refusal is stood in for here) undoes the new job: the same command can simply be run again,
    without --resume. A job that already holds work is kept."""
    import bertscope.scale.embed as scale_embed
    from bertscope.errors import InputError

    @contextlib.contextmanager
    def no_ray(opts):
        raise InputError("cannot start or join Ray at 10.0.0.1:6379: Failed to connect")
        yield

    monkeypatch.setattr(scale_embed, "ray_session", no_ray)
    inp = tmp_path / "in.txt"
    inp.write_text("one text\nanother\n")
    new = tmp_path / "made" / "o"
    code, _, err = _cli(["embed", str(inp), "--out", str(new), "--engine", "ray"], capsys)
    assert code == 2 and "cannot start or join Ray" in err
    assert not (tmp_path / "made").exists()  # both folders it made, gone
    kept = tmp_path / "kept"
    kept.mkdir()
    assert _cli(["embed", str(inp), "--out", str(kept), "--engine", "ray"], capsys)[0] == 2
    assert kept.is_dir() and not any(kept.iterdir())  # the folder that was there stays, empty
    half = tmp_path / "half"  # a job stopped before its end (its manifest not written), then Ray fails
    assert _cli(["embed", str(inp), "--out", str(half), "--shard-rows", "1", "--quiet"], capsys)[0] == 0
    (half / "_manifest.json").unlink()
    before = sorted(p.relative_to(half) for p in half.rglob("*"))
    assert _cli(["embed", str(inp), "--out", str(half), "--engine", "ray", "--resume"], capsys)[0] == 2
    assert sorted(p.relative_to(half) for p in half.rglob("*") if p.name != ".lock") == \
        [p for p in before if p.name != ".lock"]


def test_glob_matching_nothing_is_one_line(cluster, tmp_path, capsys):
    code, _, err = _cli(["embed", str(tmp_path / "nothing-*.jsonl"), "--out", str(tmp_path / "o"),
                         "--engine", "ray"], capsys)
    assert code == 2 and err.strip().splitlines() == [f"bertscope: error: no input file matches {tmp_path}/nothing-*.jsonl"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["embed", "heads"])
def test_ray_missing_is_one_line_with_the_install_hint(tmp_path, capsys, monkeypatch, command):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import ray` now fails, as without the extra
    monkeypatch.setitem(sys.modules, "ray", None)
    inp = tmp_path / "in.txt"
    inp.write_text("one text\n")
    extra = ["--out", str(tmp_path / "o")] if command == "embed" else []
    code, _, err = _cli([command, str(inp), *extra, "--engine", "ray"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "bertscope: error: the Ray engine (--engine ray) needs Ray (with Ray Data): pip install 'bertscope[ray]'"]
    assert not (tmp_path / "o").exists()


class _Refuses:
    """A worker whose every shard fails as bad input does."""

    def __call__(self, batch):
        from bertscope.errors import InputError

        raise InputError("shard 0 cannot be read")


class _RefusesAtStart:
    """A worker that cannot start (as with --gpus-per-worker on a CPU-only torch)."""

    def __init__(self):
        from bertscope.errors import InputError

        raise InputError("device 'cuda': this torch has no CUDA device")

    def __call__(self, batch):
        return batch


def test_a_workers_input_error_reaches_the_driver_as_its_one_line(cluster):
    from bertscope.errors import InputError
    from bertscope.scale.cluster import map_shards, unwrap_error

    with pytest.raises(Exception) as info:
        list(map_shards(ray, [0], _Refuses, {}, EngineOptions(workers=1)))
    inner = unwrap_error(info.value)
    assert type(inner) is InputError and str(inner) == "shard 0 cannot be read"


def test_a_worker_that_cannot_start_reaches_the_driver_as_its_one_line(cluster):
    """Its error reaches the driver as Ray's ActorDiedError, which keeps only the text (the CLI
    said "ActorDiedError: The actor died because of an error raised in its creation task ...",
    after some 200 lines of Ray Data's stack traces, and exited with status 1)."""
    from bertscope.errors import InputError
    from bertscope.scale.cluster import map_shards, unwrap_error

    with pytest.raises(Exception) as info:
        list(map_shards(ray, [0], _RefusesAtStart, {}, EngineOptions(workers=1)))
    inner = unwrap_error(info.value)
    assert type(inner) is InputError and str(inner) == "device 'cuda': this torch has no CUDA device"


class _DiesAtStart:
    """A worker whose process dies as it starts, each time (as one out of memory loading the model)."""

    def __init__(self):
        os.kill(os.getpid(), signal.SIGKILL)

    def __call__(self, batch):
        return batch


def test_a_worker_that_dies_each_time_it_starts_ends_the_job_in_one_line(cluster, monkeypatch):
    """Ray Data restarts a dead worker for ever by default: this job hung (still running at
    240 s). Now a worker is started again WORKER_RESTARTS times, then the job ends with one line.
    Here it is started again once (each start takes seconds), and the line counts as set."""
    import threading

    from bertscope.errors import BertscopeError
    from bertscope.scale import cluster as engine
    from bertscope.scale.cluster import map_shards, unwrap_error

    assert engine.WORKER_RESTARTS >= 1  # a worker killed mid-shard is still started again (the test above)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert f"at most {engine.WORKER_RESTARTS} times in a job" in readme  # what the README promises
    monkeypatch.setattr(engine, "WORKER_RESTARTS", 1)
    ended: list = []

    def job():
        try:
            list(map_shards(ray, [0, 1], _DiesAtStart, {}, EngineOptions(workers=1)))
            ended.append(None)
        except Exception as e:  # noqa: BLE001 - what Ray raised, looked at below
            ended.append(e)

    t = threading.Thread(target=job, daemon=True)  # a hang fails this test, not the whole run
    t.start()
    t.join(timeout=240)
    assert ended, "the job with a worker that dies at start did not end in 240 s"
    inner = unwrap_error(ended[0])
    assert type(inner).__name__ == "WorkerDied" and isinstance(inner, BertscopeError), repr(ended[0])
    assert str(inner) == ("a Ray worker's process died 2 times in this job, once more than "
                          "Ray starts one again (1), Ray says: exit type SYSTEM_ERROR; it was "
                          "killed, ran out of memory or crashed: its log on the machine it ran on says which "
                          "(/tmp/ray/session_latest/logs), and fewer workers per machine give each more memory")


def test_what_ray_prints_during_a_session_goes_to_stderr_not_to_the_results(cluster, capsys):
    """Ray's driver prints messages such as "(raylet) A worker died ..." to sys.stdout, which
    once landed in `heads --engine ray --json`'s output in CI; inside a session they go to
    stderr, and stdout is back afterwards."""
    from ray._private.worker import print_to_stdstream

    from bertscope.scale.cluster import ray_session

    with ray_session(EngineOptions(address=cluster)):
        print_to_stdstream({"lines": ["A worker died or was killed (a test)"], "pid": "raylet", "is_err": False},
                           ignore_prefix=False)
    print("results")
    cap = capsys.readouterr()
    # Ray's own notes on an earlier test's actors may still reach stdout from its threads: the
    # note printed in the session is the one that must not
    assert cap.out.endswith("results\n") and "(a test)" not in cap.out
    assert "A worker died or was killed (a test)" in cap.err


_REFERENCES_FREED_AT_TEARDOWN = """
import gc, threading, time
import ray
from bertscope.scale import EngineOptions
from bertscope.scale import cluster
from bertscope.scale.cluster import ray_session

cluster.RAY_DATA_THREADS_WAIT_S = 300.0  # whatever this machine's speed: the wait, not its bound, is tested
start = threading.Event()
def collect():  # as Ray's own GC thread does: an explicit collection, from another thread
    start.wait()
    for _ in range(50):
        gc.collect()
threading.Thread(target=collect, daemon=True).start()
real_shutdown = ray.shutdown
def shutdown(*args, **kwargs):  # the collections start as Ray's teardown does
    start.set()
    return real_shutdown(*args, **kwargs)
ray.shutdown = shutdown
def drop(refs):  # as Ray Data's feeding threads do while a stopped dataset's iteration ends
    while refs:
        del refs[-500:]
        time.sleep(0.01)
class Cycle:
    pass
with ray_session(EngineOptions(workers=1)) as r:
    one = r.put(0)
    def ref():  # a reference of its own to one object: freeing it calls into Ray's core worker
        return ray.ObjectRef(one.binary(), one.owner_address())
    gc.disable()  # what a stopped dataset leaves: object references in reference cycles
    for i in range(100000):
        a, b = Cycle(), Cycle()
        a.other, b.other, a.ref = b, a, ref()
    del a, b
    refs = [ref() for _ in range(100000)]
    threading.Thread(target=drop, args=(refs,), name="iter_threaded", daemon=True).start()
    del refs, one
print("the session ended")
"""


def test_a_session_frees_no_object_reference_while_ray_tears_down():
    """An object reference freed while Ray tears its core worker down ends the process at once,
    with status 1 and no message ("The core worker has already been shutdown"): SIGTERM'd jobs in
    CI ended that way. Two ways it happened, both in this script:

    - references in cycles (which a Ray Data job leaves, finished or stopped), freed by a
      collection as the teardown starts: the session collects them first, and none runs during
      the teardown;
    - one of Ray Data's threads that feed ``iter_rows`` ("iter_threaded") still freeing its
      references as the main thread shut Ray down (1 stopped job of 6 here): the session waits
      for those threads.

    With a bare ray.shutdown() in the session, without its collections, or without its wait for
    the threads, this script ended with status 1 and no message in 3 runs of 3 each here (the
    references are copies of one object's, so that 100,000 of them take a second to make, where
    as many puts took over a minute)."""
    done = subprocess.run([sys.executable, "-c", _REFERENCES_FREED_AT_TEARDOWN], env=_env(), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0 and done.stdout == "the session ended\n", (done.returncode, done.stderr[-2000:])


def test_ray_data_still_names_the_threads_the_session_waits_for():
    """The wait above finds Ray Data's threads by name: a Ray release that renames them would
    make it wait for nothing, so the names are checked against Ray's own source."""
    import inspect

    import ray.data._internal.block_batching.util as batching
    import ray.data._internal.execution.metadata_fetcher as fetcher
    import ray.data._internal.execution.streaming_executor as executor

    from bertscope.scale.cluster import _RAY_DATA_THREADS

    assert 'name="iter_threaded"' in inspect.getsource(batching)
    assert 'f"StreamingExecutor-{' in inspect.getsource(executor)
    assert '"ray-data-metadata-prefetch"' in inspect.getsource(fetcher)
    assert set(_RAY_DATA_THREADS) == {"iter_threaded", "StreamingExecutor-", "ray-data-metadata-prefetch"}


_SIGTERM_AS_RAY_STARTS = """
import os, signal, sys
import ray._private.worker as worker
real = worker.connect
def connect(*args, **kwargs):  # a SIGTERM while ray.init runs, once Ray's handlers are in
    done = real(*args, **kwargs)
    signal.raise_signal(signal.SIGTERM)  # to this thread: os.kill can land on one of Ray's threads, late
    return done
worker.connect = connect
from bertscope.cli.app import main
from bertscope.errors import InputError
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigterm_as_ray_starts_is_the_clis_one_line_and_exit_143(cluster, tmp_path):
    """ray.init puts in a SIGTERM handler of its own, sys.exit(15), until it returns: a SIGTERM
    then ended the job with status 15 (a review saw 134 too) and no word. Before this change,
    this script ended with status 15 and an empty stderr."""
    inp = tmp_path / "in.txt"
    inp.write_text("one text\nanother\n")
    env = _env()
    done = subprocess.run([sys.executable, "-c", _SIGTERM_AS_RAY_STARTS, "embed", str(inp), "--out", str(tmp_path / "o"),
                           "--quiet", "--engine", "ray", "--address", cluster, "--workers", "1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 143 and done.stderr.strip().splitlines()[-1:] == ["bertscope: terminated"], \
        (done.returncode, done.stderr[-2000:])
    assert not (tmp_path / "o").exists()  # the new job, undone


_SIGTERM_AFTER_A_SESSION = """
import os, signal, time
from bertscope.scale import EngineOptions
from bertscope.scale.cluster import ray_session

signal.signal(signal.SIGTERM, lambda signum, frame: print("the process's handler", flush=True))
with ray_session(EngineOptions(workers=1)):
    pass
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("went on")
"""


_SIGTERM_AS_RAY_STARTS_LET_GO = """
import os, signal, sys
import ray._private.worker as worker
real, sent = worker.connect, []
def connect(*args, **kwargs):  # a SIGTERM while ray.init runs, the first time only
    done = real(*args, **kwargs)
    if not sent:
        sent.append(1)
        # to this thread, now: os.kill can land on one of Ray's threads, whose handler (a crash
        # dump first) hands it on late, once ray.init has returned (a CI run saw the process's
        # handler run inside the session's block)
        signal.raise_signal(signal.SIGTERM)
    return done
worker.connect = connect
from bertscope.scale import EngineOptions
from bertscope.scale.cluster import ray_session

if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda signum, frame: print("the process's handler", flush=True))
with ray_session(EngineOptions(address=sys.argv[2])) as ray:
    up = ray.is_initialized()
print("started", up, flush=True)  # (what the session's block prints goes to stderr)
"""


@pytest.mark.parametrize("how", ["ignore", "handle"])
def test_a_sigterm_as_ray_starts_that_the_process_lets_go_starts_ray_again(cluster, how):
    """A process that ignores SIGTERM, or handles it and goes on, gets its session: Ray's
    sys.exit(15) is undone and Ray started again (a review: it was refused)."""
    env = _env()
    done = subprocess.run([sys.executable, "-c", _SIGTERM_AS_RAY_STARTS_LET_GO, how, cluster], env=env,
                          capture_output=True, text=True, timeout=180)
    said = "started True\n" if how == "ignore" else "the process's handler\nstarted True\n"
    assert done.returncode == 0 and done.stdout == said, (done.returncode, done.stderr[-2000:])


def test_a_session_gives_ray_datas_loggers_their_levels_back(cluster):
    import logging

    from bertscope.scale.cluster import ray_session

    before = {name: logging.getLogger(name).level for name in ("ray.data", "ray._private.worker")}
    with ray_session(EngineOptions(address=cluster)):
        assert logging.getLogger("ray.data").level == logging.CRITICAL  # its stack traces: the error says it
    assert {name: logging.getLogger(name).level for name in before} == before


def test_the_processs_sigterm_handler_still_answers_after_a_ray_session():
    """ray.shutdown() resets SIGTERM underneath Python, whose record still names the process's
    handler: a SIGTERM after a session ended the process at once, with no word (here: no output,
    status -15, before this change)."""
    env = _env()
    done = subprocess.run([sys.executable, "-c", _SIGTERM_AFTER_A_SESSION], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0 and done.stdout == "the process's handler\nwent on\n", (done.returncode,
                                                                                       done.stderr[-2000:])


def test_an_address_where_something_else_answers_is_one_line_not_a_wait(tmp_path, capsys, monkeypatch):
    """A web server's port given as --address: ray.init retried for ever, with nothing said (a
    review killed it after 300 s). What answers must speak gRPC, as Ray's servers do."""
    import http.server
    import socketserver
    import threading

    from bertscope.scale import cluster as cl

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    class Tls(socketserver.BaseRequestHandler):  # what a TLS server answers a plaintext preface with
        def handle(self):
            self.request.recv(64)
            self.request.sendall(bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46]))  # an alert record

    web = socketserver.TCPServer(("127.0.0.1", 0), Quiet)
    tls = socketserver.TCPServer(("127.0.0.1", 0), Tls)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), says nothing
    for server in (web, tls):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    inp = tmp_path / "in.txt"
    inp.write_text("one text\nanother\n")
    try:
        for server, said in ((web, "does not speak gRPC (it answered b'"),
                             (tls, "answered with TLS (for a cluster that uses it, set RAY_USE_TLS=1"),
                             (silent, "sent no answer to gRPC within 0.5 s")):
            address = f"127.0.0.1:{(server if server is silent else server.socket).getsockname()[1]}"
            # the silent server's wait kept short; the others answer at once, however loaded the machine
            monkeypatch.setattr(cl, "GRPC_ANSWER_S", 0.5 if server is silent else 60.0)
            for command, extra in (("embed", ["--out", str(tmp_path / "o")]), ("heads", [])):
                with hang_guard(120):
                    code, stdout, err = _cli([command, str(inp), *extra, "--engine", "ray", "--address", address],
                                             capsys)
                lines = err.strip().splitlines()
                said_whole = f"bertscope: error: {address} is not a Ray cluster: what answers there {said}"
                assert code == 2 and len(lines) == 1 and lines[0].startswith(said_whole), err
                assert not (tmp_path / "o").exists()
        # no --address: ray.init joins RAY_ADDRESS where it is set, so that is what is checked
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{web.socket.getsockname()[1]}")
        code, _, err = _cli(["embed", str(inp), "--out", str(tmp_path / "o"), "--engine", "ray"], capsys)
        assert code == 2 and err.startswith(f"bertscope: error: RAY_ADDRESS: {os.environ['RAY_ADDRESS']} is not a "
                                            "Ray cluster: what answers there does not speak gRPC"), err
    finally:
        for server in (web, tls):
            server.shutdown()
            server.server_close()
        silent.close()


def test_a_ray_clusters_own_port_passes_the_grpc_check(cluster):
    from bertscope.scale.cluster import check_address

    check_address(cluster)  # the GCS answers HTTP/2's preface with its SETTINGS frame


def test_rays_notes_on_actors_it_killed_are_dropped_whole_and_the_rest_kept(capsys):
    """Ray prints a message (several lines, the "killed by `ray.kill`" one last) in one write,
    then its line end in another: the whole message goes, with no blank line left behind."""
    from bertscope.scale.cluster import KILLED_BY_US, _RayLines

    lines = _RayLines()
    print("(raylet) The actor died.\n\tclass_name: MapWorker\n\tpid: 1\nIt was " + KILLED_BY_US + ".", file=lines)
    print("(raylet) A worker died or was killed (a test)", file=lines)
    print("(raylet) Task failed: killed by `ray.kill`.\n", file=lines)  # it ends in a line end itself
    print(file=lines)  # a blank line of its own is kept
    lines.write("a last line without its end")
    lines.finish()
    lines.quiet = True
    print("(raylet) after the stop", file=lines)
    assert capsys.readouterr().err == ("(raylet) A worker died or was killed (a test)\n\n"
                                       "a last line without its end\n")


def test_gpus_per_worker_on_a_machine_without_them_is_refused_with_or_without_workers():
    """Without --workers the check returned early and the job waited for a GPU forever, silently."""
    from bertscope.errors import InputError
    from bertscope.scale.cluster import _check_resources

    class NoGPU:  # what ray.cluster_resources() says on this kind of machine
        @staticmethod
        def cluster_resources():
            return {"CPU": 2.0}

    for workers in (None, 1):
        with pytest.raises(InputError, match="--gpus-per-worker 1: this machine has 0 GPU"):
            _check_resources(NoGPU, EngineOptions(workers=workers, gpus_per_worker=1.0))
    _check_resources(NoGPU, EngineOptions(workers=None))  # CPU workers: fine
    # a cluster joined (RAY_ADDRESS) may grow its GPUs: not refused, only logged
    _check_resources(NoGPU, EngineOptions(workers=1, gpus_per_worker=1.0), started_here=False)


def test_an_address_of_another_cluster_is_refused_while_ray_runs_in_the_process(cluster):
    """A caller's own ``ray.init`` is used as it is; an --address naming some other cluster was
    ignored without a word, and the work ran on the running cluster. It is refused in one line;
    the running cluster's own address, by IP or as localhost, is accepted."""
    from bertscope.scale.cluster import ray_session

    port = int(cluster.rpartition(":")[2])
    # another port; another host (TEST-NET-2); another host through Ray Client (its own port)
    for other in (f"127.0.0.1:{port + 1}", f"198.51.100.1:{port}", "ray://198.51.100.1:10001"):
        with pytest.raises(InputError, match=re.escape(f"already running in this process, joined to the cluster at {cluster}")):
            with ray_session(EngineOptions(address=other)):
                pass
    for same in (cluster, f"localhost:{port}", f"0.0.0.0:{port}", f"[::ffff:127.0.0.1]:{port}", "auto", None):
        with ray_session(EngineOptions(address=same)) as ray:
            assert ray.get_runtime_context().gcs_address == cluster


def test_an_address_whose_name_does_not_resolve_is_said_so_while_ray_runs(monkeypatch):
    """With Ray running, a host name that resolves to nothing read as "names another cluster";
    it is its own line. (A stand-in for Ray's runtime context and for the resolver: no DNS.)"""
    from types import SimpleNamespace

    from bertscope.scale import cluster

    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if host == "nowhere.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    fake_ray = SimpleNamespace(get_runtime_context=lambda: SimpleNamespace(gcs_address="127.0.0.1:6379"),
                               util=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"))
    with pytest.raises(InputError, match=re.escape("cannot reach a Ray cluster at nowhere.example:6379: "
                                                   "nowhere.example does not resolve to an address")):
        cluster._refuse_another_cluster(fake_ray, "nowhere.example:6379")
    cluster._refuse_another_cluster(fake_ray, "[::ffff:127.0.0.1]:6379")  # this machine, another spelling
    with pytest.raises(InputError, match="names another"):
        cluster._refuse_another_cluster(fake_ray, "ray://198.51.100.1:10001")


def test_a_ray_started_here_refuses_more_workers_than_it_can_seat(monkeypatch):
    """No address: Ray starts on this machine with the CPUs the workers ask for. A thousand
    model-holding processes on a laptop, or a billion CPUs reserved, is refused in one line
    before Ray starts; a cluster's address, RAY_ADDRESS, or a Ray this process already runs
    leave the count to that cluster."""
    import bertscope.scale.cluster as cluster

    monkeypatch.setattr(cluster, "usable_cpus", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # no Ray running in this process
    for fine in (EngineOptions(workers=8), EngineOptions(workers=4, cpus_per_worker=2.0), EngineOptions(),
                 EngineOptions(cpus_per_worker=8.0), EngineOptions(workers=8, cpus_per_worker=0.25)):
        check_local_capacity(fine)
    with pytest.raises(InputError) as e:
        check_local_capacity(EngineOptions(workers=9, cpus_per_worker=0.5))
    assert str(e.value) == ("workers (--workers) 9 would start 9 processes on this machine, each holding a model; "
                            "it has 2 usable CPUs, and a Ray started here takes at most 8 (4 per CPU): give fewer "
                            "workers, or address (--address) of a cluster that has them")
    with pytest.raises(InputError) as e:
        check_local_capacity(EngineOptions(workers=5, cpus_per_worker=2.0))
    assert str(e.value) == ("workers (--workers) 5 of 2 CPUs each asks for 10 CPUs; it has 2 usable CPUs, and a "
                            "Ray started here takes at most 8 (4 per CPU): give fewer workers or a smaller "
                            "cpus_per_worker (--cpus-per-worker), or address (--address) of a cluster that has them")
    with pytest.raises(InputError, match=r"^workers \(--workers\) 1000000000 would start 1000000000 processes"):
        check_local_capacity(EngineOptions(workers=10**9))
    with pytest.raises(InputError, match=r"^cpus_per_worker \(--cpus-per-worker\) 1000000000 asks for 1000000000 CPUs"):
        check_local_capacity(EngineOptions(cpus_per_worker=1e9))  # no --workers: one worker of them
    with pytest.raises(InputError, match=r"^workers \(--workers\) 3 of 2\.75 CPUs each asks for 8\.25 CPUs"):
        check_local_capacity(EngineOptions(workers=3, cpus_per_worker=2.75))
    # no --workers: the pool fills the CPUs, one worker per --cpus-per-worker (pool_size)
    with pytest.raises(InputError, match=rf"^cpus_per_worker \(--cpus-per-worker\) 0\.01 without workers \(--workers\) "
                                         rf"would start {int(2.0 // 0.01)} processes on this machine"):
        check_local_capacity(EngineOptions(cpus_per_worker=0.01))
    check_local_capacity(EngineOptions(cpus_per_worker=0.01, gpus_per_worker=0.5))  # the GPUs bound that pool
    monkeypatch.setattr(cluster, "usable_cpus", lambda: 14)
    check_local_capacity(EngineOptions(workers=56, cpus_per_worker=1.0))
    check_local_capacity(EngineOptions(workers=50, cpus_per_worker=1.12))  # 56.00000000000001 in floats: the limit
    check_local_capacity(EngineOptions(workers=10**9, address="head:6379"))  # that cluster's to say
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    check_local_capacity(EngineOptions(workers=10**9))
    monkeypatch.setenv("RAY_ADDRESS", "local")
    with pytest.raises(InputError, match="would start 1000000000 processes"):
        check_local_capacity(EngineOptions(workers=10**9))

    class Running:  # a caller's own ray.init: its cluster decides
        @staticmethod
        def is_initialized():
            return True

    check_engine_options(EngineOptions(workers=10**9))  # the sizes' own check leaves the count alone
    monkeypatch.setitem(sys.modules, "ray", Running)
    check_local_capacity(EngineOptions(workers=10**9))


def test_the_cli_refuses_a_local_ray_of_a_billion_workers_in_one_line(tmp_path):
    from bertscope.fast.tuning import usable_cpus

    cpus = usable_cpus()  # the subprocess's own: it inherits this one's affinity and cgroup
    inp = tmp_path / "in.txt"
    inp.write_text("one text\n")
    env = {k: v for k, v in _env().items() if k != "RAY_ADDRESS"}
    r = subprocess.run([sys.executable, "-m", "bertscope", "embed", str(inp), "--out", str(tmp_path / "o"),
                        "--engine", "ray", "--workers", "1000000000"],
                       capture_output=True, text=True, env=env, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == ("bertscope: error: --workers 1000000000 would start 1000000000 processes on this machine, "
                        f"each holding a model; it has {cpus} usable CPU{'' if cpus == 1 else 's'}, "
                        f"and a Ray started here takes at most {4 * cpus} (4 per CPU): give fewer workers, "
                        "or --address of a cluster that has them"), lines
    assert not (tmp_path / "o").exists()


def test_a_ray_started_here_is_a_new_local_one_and_ray_address_is_joined(monkeypatch):
    """With no address, ray.init(address=None) would join a `ray start` cluster on this machine,
    and refuse the num_cpus it is given there; the docs promise a Ray started here. So: "local"
    with the workers' CPUs; with RAY_ADDRESS set, that cluster is joined, and no num_cpus."""
    import bertscope.scale.cluster as cluster

    started = []

    class Stop(Exception):
        pass

    def fake_start(ray_module, address, kwargs):
        started.append((address, kwargs.get("num_cpus")))
        raise Stop

    monkeypatch.setattr(cluster, "_start", fake_start)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster, "usable_cpus", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for opts in (EngineOptions(workers=3), EngineOptions(workers=3, cpus_per_worker=1.5), EngineOptions()):
        with pytest.raises(Stop), cluster.ray_session(opts):
            pass
    monkeypatch.setattr(cluster, "check_address", lambda address: None)  # no cluster to reach in a test
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(Stop), cluster.ray_session(EngineOptions(workers=3)):
        pass
    assert started == [("local", 3), ("local", 5), ("local", 2), (None, None)]


def test_the_library_refuses_an_oversized_local_ray_before_the_model_loads(tmp_path, monkeypatch):
    """run_ray_embed_job and ray_head_stats check the size before loading anything: a model
    folder that does not exist is not reached."""
    from bertscope.scale import cluster as cluster_module

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    inp = tmp_path / "in.txt"
    inp.write_text("one text\n")
    huge = EngineOptions(workers=10 ** 9)
    with pytest.raises(InputError, match="would start 1000000000 processes"):
        run_ray_embed_job(tmp_path / "no-model", inp, tmp_path / "o", engine=huge)
    with pytest.raises(InputError, match="would start 1000000000 processes"):
        ray_head_stats(inp, tmp_path / "no-model", engine=huge)
    assert not (tmp_path / "o").exists()

    class Refuses:  # ray.init on a RAY_ADDRESS that Ray cannot parse
        @staticmethod
        def init(address=None, **kw):
            raise ValueError("Invalid address format")

    monkeypatch.setenv("RAY_ADDRESS", "LOCAL")
    with pytest.raises(InputError) as e:
        cluster_module._start(Refuses, None, {})
    assert str(e.value) == "cannot start or join Ray at RAY_ADDRESS 'LOCAL': Invalid address format"
