"""The robustness suite behind `make soak` (minutes, not part of CI): bertscope's commands under
abuse, driven through the command line only, as a user would run them.

  embed:  `bertscope embed` killed with SIGKILL at K random moments, resumed with --resume after
          each kill, then run to the end; its output must be identical (bit for bit, and every
          row's status) to an uninterrupted run's, and an unfinished job must never read back
          as a finished one.
  serve:  `bertscope serve` under C concurrent clients for S seconds (analyze and attention
          requests on more distinct texts than its cache holds, and a share of measure requests
          hung up on within 0.5 s, as a page that moved on aborts them); no request may fail,
          and the server's resident memory must stay bounded (no growth once warm).

The results, with the command and the machine, replace the generated sections of
docs/RELIABILITY.md (``bertscope.files.update_section``). Exit status 0 only if everything held.

    python scripts/soak.py                      # both, as `make soak` runs them
    python scripts/soak.py --only embed --kills 3 --lines 1500
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
DOC = ROOT / "docs" / "RELIABILITY.md"
TITLE = "Reliability: bertscope under abuse"

WORDS = ("the animal street tired wide because it was too cross did not trophy suitcase fit "
         "attention head layer token query key value softmax model sentence embedding river bank "
         "money quickly slowly under over across beside between while although").split()


def bertscope_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertscope", *args]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    return e


def machine_line() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from bertscope.bench.machine import machine

    m = machine()
    flags = ", ".join(m["cpu_flags"]) if isinstance(m["cpu_flags"], list) else str(m["cpu_flags"])
    v = m["versions"]
    return (f"{m['cpu']} ({m['logical_cpus']} logical CPUs; flags: {flags or 'none of note'}), "
            f"torch {v['torch']}, Python {v['python']}, {m['platform']}")


# ------------------------------------------------------------------------------------- embed

def make_input(path: Path, lines: int, seed: int) -> None:
    """Texts of 1 to ~300 words, with the odd empty line, undecodable line and over-long line."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        r = rng.random()
        if r < 0.02:
            out.append(b"")
        elif r < 0.03:
            out.append(b"caf\xe9 \xff not utf-8")
        else:
            n = rng.choice([1, 3, 8, 15, 30, 60]) if r < 0.98 else rng.randint(300, 600)
            out.append(" ".join(rng.choice(WORDS) for _ in range(n)).encode())
    path.write_bytes(b"\n".join(out) + b"\n")


def run_embed(inp: Path, out: Path, resume: bool, shard_rows: int) -> subprocess.Popen:
    args = ["embed", str(inp), "--out", str(out), "--shard-rows", str(shard_rows), "--quiet"]
    if resume:
        args.append("--resume")
    return subprocess.Popen(bertscope_cmd(*args), env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def soak_embed(kills: int, lines: int, shard_rows: int, seed: int, work: Path) -> dict:
    from bertscope.fast.embedjob import read_embeddings

    rng = random.Random(seed)
    inp = work / "texts.txt"
    make_input(inp, lines, seed)
    one = work / "one.txt"
    one.write_text("a single line\n")

    def timed(path: Path, out: Path) -> float:
        started = time.monotonic()
        proc = run_embed(path, out, False, shard_rows)
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"soak: an uninterrupted embed run failed: {err.strip()}")
        return time.monotonic() - started

    startup_s = timed(one, work / "one")  # start, import, load the model, write: no real work
    reference_s = timed(inp, work / "reference")
    work_s = max(reference_s - startup_s, 0.0)
    want, want_status = read_embeddings(work / "reference")

    out = work / "killed"
    moments, early_finish, unfinished_read_as_done = [], 0, 0
    attempt = 0
    while len(moments) < kills:
        proc = run_embed(inp, out, resume=attempt > 0, shard_rows=shard_rows)
        attempt += 1
        # Anywhere from starting up and loading the model to the middle of the job: each run
        # gets at most 15% of the work done before it dies, so ten kills fit in one job.
        delay = rng.uniform(0.3 * startup_s, startup_s + 0.15 * work_s)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)  # our own child, by its id
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            try:
                got, got_status = read_embeddings(out)
            except Exception:
                moments.append(round(delay, 2))  # killed unfinished, and it reads as unfinished
                continue
            if not (np.array_equal(got, want) and got_status == want_status):
                moments.append(round(delay, 2))
                unfinished_read_as_done += 1  # a killed job must not read as a finished one
                continue
            # its manifest, written last, was on disk: the job had finished and the kill found
            # the process on its way out (a resumed run with a few shards left ends in seconds)
        else:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"soak: a resumed embed run failed: {err.strip()}")
        early_finish += 1  # it finished before the kill: start over from an empty folder
        import shutil

        shutil.rmtree(out)
        attempt = 0
    final = run_embed(inp, out, resume=True, shard_rows=shard_rows)
    _, err = final.communicate()
    if final.returncode != 0:
        raise SystemExit(f"soak: the final --resume run failed: {err.strip()}")
    got, got_status = read_embeddings(out)
    leftovers = sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp"))
    identical = bool(got.shape == want.shape and np.array_equal(got, want) and got_status == want_status)
    return {"lines": lines, "shard_rows": shard_rows, "rows": int(want.shape[0]), "dim": int(want.shape[1]),
            "reference_s": round(reference_s, 1), "startup_s": round(startup_s, 1), "kills": len(moments), "kill_moments_s": moments,
            "finished_before_kill": early_finish, "unfinished_read_as_done": unfinished_read_as_done,
            "identical": identical, "temp_files_left": leftovers,
            "ok": identical and not leftovers and unfinished_read_as_done == 0}


# ------------------------------------------------------------------------------------- serve

def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def post(base: str, path: str, body: dict, timeout: float = 120.0) -> int:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        r.read()
        return r.status


def abandon(base: str, body: dict, wait: float) -> None:
    """Send one request, wait ``wait`` seconds and hang up without reading the answer (a page
    that moved on: the server drops it if its computation has not begun)."""
    u = urllib.parse.urlsplit(base)
    data = json.dumps(body).encode()
    with socket.create_connection((u.hostname, u.port), timeout=60) as sock:
        sock.sendall(f"POST /api/attention HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        time.sleep(wait)


def load_test(base: str, proc: subprocess.Popen, clients: int, seconds: float, seed: int, texts: list[str],
              abandon_share: float = 0.0):
    """``clients`` threads post to the server for ``seconds``, while its RSS is sampled:
    (idle RSS, request stats, RSS samples, whether the server is still alive). A share
    ``abandon_share`` of the requests ask for a measure map and hang up within 0.5 s."""
    rss_idle = rss_mib(proc.pid)
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    stats = {"requests": 0, "errors": 0, "latencies": [], "first_errors": [], "abandoned": 0}
    samples: list[tuple[float, float]] = []

    def client(k: int) -> None:
        r = random.Random(seed * 1000 + k)
        while time.monotonic() < stop:
            text = r.choice(texts)
            if r.random() < abandon_share:
                try:
                    abandon(base, {"text": text, "layer": r.randrange(6), "heads": [0], "kind": "measure",
                                   "measure": r.choice(["norm", "norm-residual", "alti"])}, r.random() * 0.5)
                except OSError:
                    pass  # it was to be abandoned anyway; the server's health shows in the others
                with lock:
                    stats["abandoned"] += 1
                continue
            t0 = time.monotonic()
            try:
                if r.random() < 0.4:
                    status = post(base, "/api/analyze", {"text": text})
                else:
                    status = post(base, "/api/attention", {"text": text, "layer": r.randrange(6),
                                                           "heads": r.sample(range(12), r.randint(1, 3))})
                ok = status == 200
                why = f"HTTP {status}"
            except (urllib.error.URLError, OSError) as e:
                ok, why = False, f"{type(e).__name__}: {e}"
            with lock:
                stats["requests"] += 1
                stats["latencies"].append(time.monotonic() - t0)
                if not ok:
                    stats["errors"] += 1
                    if len(stats["first_errors"]) < 5:
                        stats["first_errors"].append(why)

    def sampler() -> None:
        t0 = time.monotonic()
        while time.monotonic() < stop:
            samples.append((time.monotonic() - t0, rss_mib(proc.pid)))
            time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    threads.append(threading.Thread(target=sampler))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rss_idle, stats, samples, proc.poll() is None


def soak_serve(clients: int, seconds: float, seed: int, abandon_share: float = 0.0) -> dict:
    from bertscope.see.launch import served

    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.choice([5, 12, 25, 50, 120]))) for _ in range(48)]
    try:
        with served(env=env(), timeout=120) as running:
            rss_idle, stats, samples, alive = load_test(running.base, running.proc, clients, seconds, seed, texts,
                                                        abandon_share)
    except RuntimeError as e:  # the server did not start
        raise SystemExit(f"soak: {e}") from None
    rss = [m for _, m in samples]
    third = max(1, len(rss) // 3)
    middle, last = max(rss[third:2 * third] or rss), max(rss[-third:])
    lat = sorted(stats["latencies"])
    # Bounded: once warm (the middle third), the last third may not grow by more than 10% + 32 MiB.
    bounded = last <= middle * 1.10 + 32
    return {"clients": clients, "seconds": seconds, "distinct_texts": len(texts),
            "requests": stats["requests"], "errors": stats["errors"], "first_errors": stats["first_errors"],
            "abandoned": stats["abandoned"],
            "latency_median_s": round(lat[len(lat) // 2], 3) if lat else None,
            "latency_p99_s": round(lat[int(len(lat) * 0.99)], 3) if lat else None,
            "rss_idle_mib": round(rss_idle), "rss_peak_mib": round(max(rss)), "rss_middle_third_max_mib": round(middle),
            "rss_last_third_max_mib": round(last), "server_alive": alive, "bounded": bounded,
            "ok": stats["errors"] == 0 and alive and bounded and stats["requests"] > 0}


# ------------------------------------------------------------------------------------- report

def embed_markdown(r: dict, command: str, machine: str, when: str) -> str:
    verdict = "**held**" if r["ok"] else "**FAILED**"
    return f"""## `embed`: killed and resumed

{verdict}. `bertscope embed` on {r['lines']:,} lines ({r['shard_rows']} lines per shard; empty,
undecodable and over-long lines included) was killed with SIGKILL {r['kills']} times, at random
moments from its start-up (a one-line run, start to exit, takes {r['startup_s']} s) to well into its work (an
uninterrupted run takes {r['reference_s']} s), each time resumed with `--resume`, then run to
the end.

| check | result |
|---|---|
| output equal to an uninterrupted run (every embedding bit for bit, every status) | {'yes' if r['identical'] else 'NO'} |
| an unfinished (killed) job read back as finished | {r['unfinished_read_as_done']} times |
| temporary files left at the end | {len(r['temp_files_left'])} |
| kills (seconds after the start of each run) | {', '.join(str(m) for m in r['kill_moments_s'])} |
| runs that finished before their kill came | {r['finished_before_kill']} |

Rows {r['rows']:,} × {r['dim']}. Machine: {machine}. Run {when}.
Command: `{command}`
"""


def serve_markdown(r: dict, command: str, machine: str, when: str) -> str:
    verdict = "**held**" if r["ok"] else "**FAILED**"
    errors = f" (first: {'; '.join(r['first_errors'])})" if r["first_errors"] else ""
    return f"""## `serve`: {r['clients']} concurrent clients

{verdict}. {r['clients']} clients sent analyze and attention requests for {r['seconds']:.0f} s
without pause, on {r['distinct_texts']} distinct texts (more than the 16 the server keeps), to
one `bertscope serve` process on the bundled model; some of their requests asked for a measure
map and hung up within 0.5 s.

| check | result |
|---|---|
| requests answered | {r['requests']:,} |
| measure requests sent and hung up on within 0.5 s (a page that moved on) | {r.get('abandoned', 0):,} |
| failed requests (not HTTP 200, or no answer) | {r['errors']}{errors} |
| latency, median / 99th percentile | {r['latency_median_s']} s / {r['latency_p99_s']} s |
| server resident memory: idle / peak | {r['rss_idle_mib']} MiB / {r['rss_peak_mib']} MiB |
| memory bounded (last third of the run at most 10% + 32 MiB above the middle third) | {'yes' if r['bounded'] else 'NO'} ({r['rss_middle_third_max_mib']} → {r['rss_last_third_max_mib']} MiB) |
| server still running at the end | {'yes' if r['server_alive'] else 'NO'} |

Machine: {machine}. Run {when}; the clients ran on the same machine (they share its CPUs).
Command: `{command}`
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["embed", "serve"], help="run one part")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--lines", type=int, default=6000)
    p.add_argument("--shard-rows", type=int, default=300)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--abandon", type=float, default=0.25, metavar="SHARE",
                   help="share of serve requests that ask for a measure map and hang up (default 0.25)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--doc", type=Path, default=DOC, help="the Markdown document to update (default docs/RELIABILITY.md)")
    p.add_argument("--no-doc", action="store_true", help="print the results; leave the document alone")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from bertscope.files import update_section

    command = shlex.join(["python", "scripts/soak.py", *(sys.argv[1:] if argv is None else argv)])
    machine = machine_line()
    when = datetime.date.today().isoformat()
    ok = True
    if args.only in (None, "embed"):
        with tempfile.TemporaryDirectory(prefix="bertscope-soak-") as work:
            r = soak_embed(args.kills, args.lines, args.shard_rows, args.seed, Path(work))
        print(json.dumps({"embed": r}, indent=1))
        ok &= r["ok"]
        if not args.no_doc:
            update_section(args.doc, "soak-embed", embed_markdown(r, command, machine, when), title=TITLE)
    if args.only in (None, "serve"):
        r = soak_serve(args.clients, args.seconds, args.seed, args.abandon)
        print(json.dumps({"serve": r}, indent=1))
        ok &= r["ok"]
        if not args.no_doc:
            update_section(args.doc, "soak-serve", serve_markdown(r, command, machine, when), title=TITLE)
    print("soak: " + ("everything held" if ok else "FAILED"), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
