#!/usr/bin/env python3
"""Round trip of a 4-element FP32 model through stubhost, against bare Python baselines (ARCHITECTURE §6).

Measured in one run, on the same machine:
  a. stubhost: server.infer("add_sub", {INPUT0, INPUT1: 4 x FP32}) through the in-process API,
     stubhost.Server(model_repository=<examples/models>, models=["add_sub"]), sequential.
  b. bare shared-memory ping-pong between two Python processes: a /dev/shm page with a sequence
     counter the parent bumps and the child echoes, both sides busy-polling in a tight Python loop
     (no sleeping, no syscalls); the 4 x FP32 payload is copied in and out with numpy on each side.
     The fastest honest pure-Python baseline. Bar: (a) <= 3.0 x (b), medians.
  c. multiprocessing.Pipe round trip with the same payload (numpy copy in and out on each side),
     as a second reference (posix semaphores would need posix_ipc, which is not a dependency).
  a2. the same calls awaited one by one, `await server.infer_async(...)` in an asyncio loop (the
     in-process API of asyncio servers; the stub wakes the loop through its doorbell). Information.
  d. load -> READY: wall time from constructing stubhost.Server until server.ready() (and every
     model's model_ready()), for add_sub alone (the server of a.) and for the whole repository.

Each run starts fresh echo children (spawn context) and fresh servers; cases are interleaved
across runs. Timed loops run with the GC off; results are checked outside the timed region.
A run during which other processes used >= 5% of a core is marked with *.
Usage: python3 benchmarks/bench_roundtrip.py [--quick] [--runs N] [--iterations N]
       [--repository DIR] [--baselines-only] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import mmap
import os
import secrets
import sys
import time
import traceback
from multiprocessing import resource_tracker  # multiprocessing's own helper process
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py, when run as a script
from _common import (CTX, async_time_series, child_process, child_setup, fmt, machine_facts,  # noqa: E402
                     measured, summarize_runs, time_series)

PREFIX = "bench_stubhost"      # /dev/shm/bench_stubhost_*: not matched by the tests' stubhost* checks
DEFAULT_REPOSITORY = Path(__file__).resolve().parent.parent / "examples" / "models"
MODEL = "add_sub"
BAR = 3.0                      # stubhost / bare ping-pong, medians
DISTURBED = 0.05               # a run is disturbed if other processes used this many cores meanwhile
WAIT = 30.0                    # seconds before a blocked side gives up
N = 4                          # FP32 elements per payload
PAYLOADS = [np.arange(i, i + N, dtype=np.float32) for i in range(256)]
INPUT1 = np.full(N, 0.5, dtype=np.float32)

# The ping-pong page: int64 slots; the parent's sequence number and the child's echo of it sit on
# separate cache lines, each followed by its 16-byte payload.
PAGE = mmap.PAGESIZE
SEQ, ACK, HELLO = 0, 16, 32                 # slot indexes (x 8 bytes)
REQ_OFF, REP_OFF = SEQ * 8 + 8, ACK * 8 + 8  # payload byte offsets
STOP = (1 << 63) - 1
SPIN = range(1 << 21)                       # polls between liveness checks of the peer

ROWS = {"infer": f"stubhost infer {MODEL} (4xFP32)", "infer_async": f"stubhost infer_async {MODEL}",
        "shm": "bare shm ping-pong (busy-poll)", "pipe": "mp.Pipe round trip", "load1": f"load->READY {MODEL}",
        "loadall": "load->READY repository"}
US_ROWS, MS_ROWS = ("infer", "infer_async", "shm", "pipe"), ("load1", "loadall")


class StubhostUnavailable(RuntimeError):
    """stubhost, or its in-process API stubhost.Server, cannot be used here."""


# ---- b. bare shared-memory ping-pong ----------------------------------------------------------
def _page_views(mm: mmap.mmap):
    """(int64 slots, request payload, reply payload) views of the ping-pong page."""
    return (memoryview(mm).cast("q"), np.frombuffer(mm, np.float32, N, REQ_OFF),
            np.frombuffer(mm, np.float32, N, REP_OFF))


def _child_shm(path: str) -> None:
    """Echo child: busy-polls the sequence slot; on a new number copies the request payload out
    (numpy), copies it into the reply payload, then publishes the number in the ack slot."""
    child_setup()
    ppid = os.getppid()
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, PAGE)
    os.close(fd)
    slots, req, rep = _page_views(mm)
    slots[HELLO] = os.getpid()
    last = 0
    while True:
        for _ in SPIN:
            seq = slots[SEQ]
            if seq != last:
                break
        else:
            if os.getppid() != ppid:
                return
            continue
        if seq == STOP:
            return
        x = req.copy()
        np.copyto(rep, x)
        slots[ACK] = seq
        last = seq


def measure_shm(cfg: dict) -> dict:
    """Parent of the bare ping-pong: copy the payload in, bump the sequence number, busy-poll for
    the child's echo, copy the reply out. The /dev/shm file is unlinked as soon as the child has it."""
    path = f"/dev/shm/{PREFIX}_pp_{os.getpid()}_{secrets.token_hex(8)}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, PAGE)
        mm = mmap.mmap(fd, PAGE)
    finally:
        os.close(fd)
    try:
        with child_process(_child_shm, path) as proc:
            slots, req, rep = _page_views(mm)
            try:
                deadline = time.monotonic() + WAIT
                while slots[HELLO] == 0:
                    if not proc.is_alive() or time.monotonic() > deadline:
                        raise RuntimeError(f"ping-pong child did not attach (exit code {proc.exitcode})")
                    time.sleep(0.001)
                os.unlink(path)

                def stalled(seq):
                    if not proc.is_alive():
                        raise RuntimeError(f"ping-pong child died (exit code {proc.exitcode}) at {seq}")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"ping-pong child did not echo {seq} within {WAIT} s")

                def step(i):
                    np.copyto(req, PAYLOADS[i & 0xFF])
                    seq = i + 1
                    slots[SEQ] = seq
                    while True:
                        for _ in SPIN:
                            if slots[ACK] == seq:
                                return rep.copy()
                        stalled(seq)

                def check(i, out):
                    if not np.array_equal(out, PAYLOADS[i & 0xFF]):
                        raise RuntimeError(f"ping-pong echo {i}: wrong payload {out}")

                deadline = time.monotonic() + WAIT + cfg["warmup_s"] + cfg["max_s"]
                return {"shm": time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"],
                                           warmup_n=10, check=check, no_gc=True)}
            finally:
                slots[SEQ] = STOP
                del req, rep
                slots.release()
    finally:
        mm.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# ---- c. multiprocessing.Pipe ------------------------------------------------------------------
def _child_pipe(conn) -> None:
    """Echo child: receive the payload, copy it into an array (numpy), send the array back; b"" stops."""
    child_setup()
    while msg := conn.recv_bytes():
        x = np.frombuffer(msg, np.float32).copy()
        conn.send_bytes(x)


def measure_pipe(cfg: dict) -> dict:
    """Parent side of the multiprocessing.Pipe round trip."""
    ours, theirs = CTX.Pipe()
    try:
        def step(i):
            ours.send_bytes(PAYLOADS[i & 0xFF])
            return np.frombuffer(ours.recv_bytes(), np.float32).copy()

        def check(i, out):
            if not np.array_equal(out, PAYLOADS[i & 0xFF]):
                raise RuntimeError(f"pipe echo {i}: wrong payload {out}")

        with child_process(_child_pipe, theirs):
            theirs.close()
            try:
                return {"pipe": time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"],
                                            warmup_n=10, check=check, no_gc=True)}
            finally:
                with contextlib.suppress(OSError):
                    ours.send_bytes(b"")
    finally:
        ours.close()


# ---- a. and d. stubhost -----------------------------------------------------------------------
def server_class():
    """stubhost.Server, or StubhostUnavailable saying why not."""
    try:
        import stubhost
    except ImportError as exc:
        raise StubhostUnavailable(f"cannot import stubhost ({exc}); install it first: python3 -m pip install .") from exc
    server = getattr(stubhost, "Server", None)
    if server is None:
        raise StubhostUnavailable(
            f"stubhost {getattr(stubhost, '__version__', '?')} at {Path(stubhost.__file__).parent} has no "
            "stubhost.Server (the in-process API arrives with the stub runtime); reinstall from a tree that "
            "has it, or run with --baselines-only")
    return server


def repository_models(repo: Path) -> list[str]:
    """Model directories of a repository: those with a numeric version folder."""
    return sorted(d.name for d in repo.iterdir()
                  if d.is_dir() and any(v.is_dir() and v.name.isdigit() for v in d.iterdir()))


def wait_ready(server, models: list[str], t0: int, timeout: float) -> int:
    """Polls server.ready() and each model's model_ready() every 0.2 ms; returns ns since t0."""
    deadline = t0 + int(timeout * 1e9)
    while True:
        if server.ready() and all(server.model_ready(m) for m in models):
            return time.perf_counter_ns() - t0
        if time.perf_counter_ns() > deadline:
            waiting = [m for m in models if not server.model_ready(m)]
            raise RuntimeError(f"not READY after {timeout:.0f} s (server ready: {server.ready()}, "
                               f"models not ready: {waiting})")
        time.sleep(0.0002)


def measure_stubhost(cfg: dict) -> dict:
    """Load add_sub alone (timed to READY), then time sequential server.infer round trips."""
    Server = server_class()
    t0 = time.perf_counter_ns()
    with Server(model_repository=str(cfg["repository"]), models=[MODEL]) as server:
        load = wait_ready(server, [MODEL], t0, cfg["load_timeout"])

        def step(i):
            return server.infer(MODEL, {"INPUT0": PAYLOADS[i & 0xFF], "INPUT1": INPUT1})

        def check(i, out):
            a = PAYLOADS[i & 0xFF]
            if not (np.array_equal(out["OUTPUT0"], a + INPUT1) and np.array_equal(out["OUTPUT1"], a - INPUT1)):
                raise RuntimeError(f"stubhost infer {i}: wrong outputs {out}")

        samples = time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"],
                              warmup_n=10, check=check, no_gc=True)
        async def awaited_step(i):
            return await server.infer_async(MODEL, {"INPUT0": PAYLOADS[i & 0xFF], "INPUT1": INPUT1})

        awaited = asyncio.run(async_time_series(awaited_step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"],
                                                warmup_n=10, check=check, no_gc=True))
    return {"infer": samples, "infer_async": awaited, "load1": np.asarray([load], dtype=np.int64)}



def measure_load_all(cfg: dict) -> dict:
    """Load the whole repository, timed from constructing the server to every model READY."""
    Server = server_class()
    models = repository_models(cfg["repository"])
    t0 = time.perf_counter_ns()
    with Server(model_repository=str(cfg["repository"])) as server:
        load = wait_ready(server, models, t0, cfg["load_timeout"])
    return {"loadall": np.asarray([load], dtype=np.int64)}


# ---- orchestration ----------------------------------------------------------------------------
def print_table(results: dict, errors: dict) -> dict:
    """Prints case | unit | median | p99 | runs | n/run | per-run medians; returns case -> per-run medians."""
    print(f"\n{'case':<34}| unit | {'median':>9} | {'p99':>9} | runs | {'n/run':>6} | per-run medians")
    print("-" * 34 + "+------+" + "-" * 11 + "+" + "-" * 11 + "+------+--------+" + "-" * 18)
    medians = {}
    for key, label in ROWS.items():
        runs = results.get(key, [])
        if key == "loadall" and "models" in results:
            label = f"{label} ({results['models']} models)"
        unit, scale = ("us", 1e3) if key in US_ROWS else ("ms", 1e6)
        if not runs:
            print(f"{label:<34}| {unit:>4} | {'-':>9} | {'-':>9} |    0 |      - | {errors.get(key, 'not run')}")
            continue
        medians[key], median, p99, n, per_run = summarize_runs(runs, scale)
        print(f"{label:<34}| {unit:>4} | {fmt(median):>9} | {fmt(p99):>9} | {len(runs):>4} | {n:>6} | {per_run}")
    print("median, p99: median over runs of each run's figure (load->READY: one sample per run, p99 = median)\n"
          f"* = other processes used >= {DISTURBED:.0%} of a core during that run")
    return medians


def print_ratios(medians: dict) -> bool | None:
    """Prints the ratios of medians; returns whether the bar holds (None if it could not be evaluated)."""
    checks = [("stubhost / bare ping-pong", "infer", "shm", BAR), ("stubhost / mp.Pipe", "infer", "pipe", None),
              ("mp.Pipe / bare ping-pong", "pipe", "shm", None), ("infer_async / infer", "infer_async", "infer", None)]
    print()
    verdict_bar = None
    for label, num, den, bar in checks:
        if num not in medians or den not in medians:
            if bar is not None:
                print(f"ratio {label} = n/a  (bar <= {bar})  NOT EVALUATED")
            continue
        ratio = float(np.median(medians[num])) / float(np.median(medians[den]))
        per_run = " ".join(f"{a / b:.2f}" for a, b in zip(medians[num], medians[den]))
        if bar is None:
            print(f"ratio {label} = {ratio:.2f}  (information)  info   [per run: {per_run}]")
        else:
            verdict_bar = ratio <= bar
            print(f"ratio {label} = {ratio:.2f}  (bar <= {bar})  {'PASS' if verdict_bar else 'FAIL'}   "
                  f"[per run: {per_run}]")
    return verdict_bar


def leftovers() -> None:
    """Warns about /dev/shm entries and child processes this run left behind (removes its own files)."""
    mine = f"{PREFIX}_pp_{os.getpid()}_"
    for entry in sorted(os.listdir("/dev/shm")):
        if entry.startswith(mine):
            print(f"WARNING: left /dev/shm/{entry}; removing it")
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", entry))
        elif entry.startswith(f"stubhost_{os.getpid()}_"):
            print(f"WARNING: the stubhost server left /dev/shm/{entry}")
    kids = set()
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
            kids.update(f.read().split())
    kids.discard(str(tracker))  # the resource tracker lives as long as this process
    if kids:
        print(f"WARNING: child processes still running: {sorted(kids, key=int)}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, help="timed round trips per case and run (default 20000, quick 2000)")
    ap.add_argument("--runs", type=int, help="fresh-process runs per case (default 3, quick 1)")
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    ap.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                    help=f"model repository with {MODEL} (default {DEFAULT_REPOSITORY})")
    ap.add_argument("--baselines-only", action="store_true",
                    help="measure only the ping-pong and mp.Pipe baselines (no stubhost needed)")
    ap.add_argument("--load-timeout", type=float, default=120.0, help="s to wait for READY (default 120)")
    ap.add_argument("--check", action="store_true", help=f"exit 1 if stubhost / bare ping-pong > {BAR} "
                    "or could not be measured")
    args = ap.parse_args()
    args.iterations = args.iterations or (2000 if args.quick else 20000)
    args.runs = args.runs or (1 if args.quick else 3)
    return args


def main() -> int:
    args = parse_args()
    repo = args.repository.resolve()
    cfg = {"iterations": args.iterations, "warmup_s": 0.1 if args.quick else 0.3, "max_s": 3.0,
           "repository": repo, "load_timeout": args.load_timeout}
    cases = [("shm", measure_shm), ("pipe", measure_pipe)]
    if not args.baselines_only:
        cases += [("infer", measure_stubhost), ("loadall", measure_load_all)]
    if machine_facts() < 2:
        print("WARNING: fewer than 2 usable CPUs: both sides of the busy-poll ping-pong spin, so its "
              "figures are meaningless here")
    print(f"runs {args.runs}; per run: round trips {cfg['iterations']} (<= {cfg['max_s']} s) per case; "
          f"repository {repo}")

    resource_tracker.ensure_running()  # started by the first spawn otherwise, inside a measured case

    started, results, errors = time.perf_counter(), {}, {}
    if not args.baselines_only:
        try:
            server_class()
            if not (repo / MODEL).is_dir():
                raise StubhostUnavailable(f"{repo} has no {MODEL} model")
            results["models"] = len(repository_models(repo))
        except StubhostUnavailable as exc:
            print(f"ERROR: {exc}")
            errors.update(dict.fromkeys(("infer", "load1", "loadall"), "stubhost unavailable (see ERROR above)"))
            cases = cases[:2]
    for run in range(args.runs):
        for name, fn in cases:
            try:
                # /proc/stat counts in clock ticks: allow one tick per CPU of rounding before calling
                # it disturbance
                result, others = measured(fn, cfg, slack=os.cpu_count() / os.sysconf("SC_CLK_TCK"))
                disturbed = others >= DISTURBED
                for key, samples in result.items():
                    results.setdefault(key, []).append((samples, disturbed))
            except Exception as exc:  # a failed case is reported, the others still run
                print(f"ERROR in run {run + 1}, case {name}: {exc}")
                if not isinstance(exc, RuntimeError):
                    traceback.print_exc()
                errors.setdefault(name, f"failed: {type(exc).__name__} (see ERROR above)")
                if name == "infer":
                    errors.setdefault("load1", errors["infer"])

    ok = print_ratios(print_table(results, errors))
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    leftovers()
    if errors:
        return 2
    if args.check and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
