#!/usr/bin/env python3
"""IPC micro-benchmarks for stubhost's shared-memory core, against the obvious baselines.

Two questions, answered as ratios measured in one run on the same machine (ARCHITECTURE.md §6):

1. Round trip of a 64-byte message between two Python processes:
   stubhost pool buffer + two MessageQueues (default spin budget, and spin disabled),
   multiprocessing.Pipe send_bytes/recv_bytes, and a bare eventfd ping-pong over a shared mmap.
   Bars: stubhost <= 1.5x bare eventfd, and <= 0.5x multiprocessing.Pipe.
2. Handing a 64 MiB float32 array to a child that touches one element per 4 KiB page and acks:
   stubhost (one copy into a pre-grown pool + handle on a queue), pickle over multiprocessing.Pipe,
   and one np.copyto of 64 MiB timed in the same process. Bar: stubhost <= 1.3x one memcpy.

Every (case, run) gets a fresh "driver" process (the parent side, which does the timing) and a
fresh echo child, both started with the multiprocessing spawn context. Runs are interleaved across
cases (run 1 of every case, then run 2, ...) so slow phases of the host hit all cases alike.
Each series has a warm-up; latencies are timed one iteration at a time with perf_counter_ns.
The table shows the median over runs of each run's median and p99, plus every run's median.

    python3 benchmarks/bench_ipc.py            # ~30 s
    python3 benchmarks/bench_ipc.py --quick    # < 20 s
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import mmap
import multiprocessing as mp
import os
import platform
import resource
import signal
import sys
import time
import traceback
from multiprocessing import reduction

import numpy as np

from stubhost import _core
from stubhost._core import MessageQueue, Pool
from stubhost.tensor import SharedTensor

CTX = mp.get_context("spawn")
PREFIX = "stubhost_bench"           # pools made here are /dev/shm/stubhost_bench_*
MSG = 64                            # round-trip payload, bytes
BIG = 64 << 20                      # bulk tensor, bytes
PAGE_ELEMS = 4096 // 4              # float32 elements per 4 KiB page
STOP = 0                            # never a valid pool handle: tells a stubhost child to exit
DISTURBED = 0.05                    # a run is "disturbed" if others used this many cores meanwhile
WAIT = 30.0                         # seconds before a blocked parent gives up
PAYLOADS = [bytes([i]) + bytes(range(1, MSG)) for i in range(256)]

RTT_CASES = ["rtt stubhost (spin 20us)", "rtt stubhost (spin off)", "rtt mp.Pipe", "rtt bare eventfd+shm"]
BULK_CASES = ["64MiB stubhost handoff", "64MiB memcpy (np.copyto)", "64MiB stubhost, already in pool",
              "64MiB pickle over mp.Pipe", "64MiB pool growth (once/run)"]


# ---- process plumbing -------------------------------------------------------------------------
def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process if its parent dies, so no child outlives a run."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    gc.disable()  # same for every case: no collector pauses in the timed loops


class PassFd:
    """An fd that survives a spawn: pickling it during Process.start() adds it to the passed fds."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(dup) -> int:
    return dup.detach()


@contextlib.contextmanager
def child_process(target, *args):
    """Starts a spawned echo child; on exit waits for it briefly, then kills it."""
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def time_series(step, iterations: int, warmup_s: float, max_s: float) -> np.ndarray:
    """Calls step(i) untimed for warmup_s, then times up to `iterations` calls one by one (ns)."""
    step(0)  # the first exchange also waits for the child to be ready
    i, end = 1, time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        step(i)
        i += 1
    clock, out = time.perf_counter_ns, []
    deadline = clock() + int(max_s * 1e9)
    for k in range(i, i + iterations):
        t0 = clock()
        step(k)
        t1 = clock()
        out.append(t1 - t0)
        if t1 > deadline:
            break
    return np.asarray(out, dtype=np.int64)


# ---- 1. round trip of 64 bytes ----------------------------------------------------------------
def _child_stubhost_rtt(pool_name: str, qa_handle: int, qb_handle: int, spin_off: bool) -> None:
    """Echo: pop a handle, map its 64 bytes, bump byte 0, push the handle back."""
    _die_with_parent()
    if spin_off:
        _core.set_spin_budget(0)
    pool = Pool.attach(pool_name)
    try:
        qa, qb = MessageQueue.attach(pool, qa_handle), MessageQueue.attach(pool, qb_handle)
        while (h := qa.pop()) != STOP:
            m = memoryview(pool.view(h, MSG))
            m[0] = (m[0] + 1) & 0xFF
            m = None
            qb.push(h)
    finally:
        pool.close()


def drive_stubhost_rtt(cfg: dict, report, spin_off: bool) -> dict:
    """Parent side: write 64 bytes into a pool buffer, push its handle on A, pop it from B."""
    if spin_off:
        _core.set_spin_budget(0)
    pool = Pool.create(prefix=PREFIX)
    report(pool.name)
    try:
        qa, qb = MessageQueue.create(pool, 16), MessageQueue.create(pool, 16)
        h = pool.allocate(MSG)
        buf = memoryview(pool.view(h, MSG))

        def step(i):
            buf[:] = PAYLOADS[i & 0xFF]
            qa.push(h)
            if qb.pop(WAIT) != h or buf[0] != (i + 1) & 0xFF:
                raise RuntimeError(f"stubhost echo {i}: wrong handle, wrong byte or timeout")

        with child_process(_child_stubhost_rtt, pool.name, qa.handle, qb.handle, spin_off):
            try:
                samples = time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"])
            finally:
                qa.push(STOP)
        buf.release()
        return {RTT_CASES[1 if spin_off else 0]: samples}
    finally:
        pool.close()


def _child_pipe_rtt(conn) -> None:
    """Echo over a multiprocessing Connection, bumping byte 0."""
    _die_with_parent()
    while msg := conn.recv_bytes():
        b = bytearray(msg)
        b[0] = (b[0] + 1) & 0xFF
        conn.send_bytes(b)


def drive_pipe_rtt(cfg: dict, report) -> dict:
    """Parent side of the multiprocessing.Pipe round trip."""
    ours, theirs = CTX.Pipe()

    def step(i):
        ours.send_bytes(PAYLOADS[i & 0xFF])
        if ours.recv_bytes()[0] != (i + 1) & 0xFF:
            raise RuntimeError(f"pipe echo {i}: wrong byte")

    with child_process(_child_pipe_rtt, theirs):
        theirs.close()
        try:
            samples = time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"])
        finally:
            ours.send_bytes(b"")
    ours.close()
    return {RTT_CASES[2]: samples}


def _child_eventfd_rtt(efd_a: int, efd_b: int, memfd: int) -> None:
    """Echo: wait on eventfd A, bump byte 0 of the shared page, signal eventfd B (2 on A = stop)."""
    _die_with_parent()
    with mmap.mmap(memfd, mmap.PAGESIZE) as mm:
        while os.eventfd_read(efd_a) == 1:
            mm[0] = (mm[0] + 1) & 0xFF
            os.eventfd_write(efd_b, 1)


def drive_eventfd_rtt(cfg: dict, report) -> dict:
    """Parent side of the bare ping-pong: 64 bytes in a memfd mmap, two blocking eventfds."""
    efd_a, efd_b, memfd = os.eventfd(0), os.eventfd(0), os.memfd_create("bench_ipc")
    os.ftruncate(memfd, mmap.PAGESIZE)
    mm = mmap.mmap(memfd, mmap.PAGESIZE)
    try:
        def step(i):
            mm[0:MSG] = PAYLOADS[i & 0xFF]
            os.eventfd_write(efd_a, 1)
            os.eventfd_read(efd_b)
            if mm[0] != (i + 1) & 0xFF:
                raise RuntimeError(f"eventfd echo {i}: wrong byte")

        with child_process(_child_eventfd_rtt, PassFd(efd_a), PassFd(efd_b), PassFd(memfd)):
            try:
                samples = time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"])
            finally:
                os.eventfd_write(efd_a, 2)
        return {RTT_CASES[3]: samples}
    finally:
        mm.close()
        for fd in (efd_a, efd_b, memfd):
            os.close(fd)


# ---- 2. handing a 64 MiB array to a child -----------------------------------------------------
def touch(a: np.ndarray) -> float:
    """The child's work on every received array: read one float32 per 4 KiB page and sum them."""
    return float(a.reshape(-1)[::PAGE_ELEMS].sum(dtype=np.float64))


def _child_stubhost_bulk(pool_name: str, qa_handle: int, qb_handle: int, expect: float) -> None:
    """Pop a tensor handle, view it as numpy without a copy, touch it, ack with the handle (1 = bad data)."""
    _die_with_parent()
    pool = Pool.attach(pool_name)
    try:
        qa, qb = MessageQueue.attach(pool, qa_handle), MessageQueue.attach(pool, qb_handle)
        while (h := qa.pop()) != STOP:
            a = SharedTensor.read(pool, h).as_numpy()
            ok = a.shape == (BIG // 4,) and touch(a) == expect
            a = None
            qb.push(h if ok else 1)
    finally:
        pool.close()


def drive_stubhost_bulk(cfg: dict, report) -> dict:
    """Interleaves, per iteration: one 64 MiB memcpy, one stubhost handoff, one re-send of the
    tensor already in the pool (descriptor only). The pool is grown once, untimed for the rest."""
    src = np.arange(BIG // 4, dtype=np.float32)
    dst = np.ones_like(src)  # pre-faulted
    expect = touch(src)
    pool = Pool.create(prefix=PREFIX)
    report(pool.name)
    try:
        qa, qb = MessageQueue.create(pool, 16), MessageQueue.create(pool, 16)
        need = _core.tensor_header_bytes(len("INPUT0"), 1) + BIG
        t0 = time.perf_counter_ns()
        pool.free(pool.allocate(need))
        growth = np.asarray([time.perf_counter_ns() - t0], dtype=np.int64)
        segments = pool.segment_count

        def send(h, i):
            qa.push(h)
            if qb.pop(WAIT) != h:
                raise RuntimeError(f"stubhost bulk {i}: bad ack (wrong data or timeout)")

        series = {c: [] for c in BULK_CASES[:3]}
        with child_process(_child_stubhost_bulk, pool.name, qa.handle, qb.handle, expect):
            try:
                for i in range(cfg["bulk_warmup"] + cfg["bulk_iterations"]):
                    t = [time.perf_counter_ns()]
                    np.copyto(dst, src)
                    t.append(time.perf_counter_ns())
                    tensor = SharedTensor.from_numpy(pool, "INPUT0", src)
                    send(tensor.handle, i)
                    t.append(time.perf_counter_ns())
                    send(tensor.handle, i)
                    t.append(time.perf_counter_ns())
                    tensor.free()
                    if i >= cfg["bulk_warmup"]:
                        for k, case in enumerate(series):
                            series[case].append(t[k + 1] - t[k])
            finally:
                qa.push(STOP)
        if pool.segment_count != segments:
            print(f"  note: the pool grew during the timed loop ({segments} -> {pool.segment_count} segments)")
        out = {c: np.asarray(v, dtype=np.int64) for c, v in series.items()}
        out[BULK_CASES[4]] = growth
        return out
    finally:
        pool.close()


def _child_pickle_bulk(conn, expect: float) -> None:
    """Receive pickled arrays, touch them, ack b'k' (b'x' = bad data); None stops."""
    _die_with_parent()
    while (a := conn.recv()) is not None:
        ok = a.shape == (BIG // 4,) and touch(a) == expect
        a = None
        conn.send_bytes(b"k" if ok else b"x")


def drive_pickle_bulk(cfg: dict, report) -> dict:
    """Parent side: send the array over multiprocessing.Pipe (pickled), wait for the ack."""
    src = np.arange(BIG // 4, dtype=np.float32)
    ours, theirs = CTX.Pipe()

    def step(i):
        ours.send(src)
        if ours.recv_bytes() != b"k":
            raise RuntimeError(f"pickle bulk {i}: child saw wrong data")

    with child_process(_child_pickle_bulk, theirs, touch(src)):
        theirs.close()
        try:
            for i in range(cfg["bulk_warmup"]):
                step(i)
            samples = time_series(step, cfg["pickle_iterations"], 0.0, cfg["max_s"])
        finally:
            ours.send(None)
    ours.close()
    return {BULK_CASES[3]: samples}


# ---- driver processes and orchestration -------------------------------------------------------
DRIVERS = {
    "stubhost_rtt": lambda cfg, report: drive_stubhost_rtt(cfg, report, spin_off=False),
    "stubhost_rtt_nospin": lambda cfg, report: drive_stubhost_rtt(cfg, report, spin_off=True),
    "pipe_rtt": drive_pipe_rtt,
    "eventfd_rtt": drive_eventfd_rtt,
    "stubhost_bulk": drive_stubhost_bulk,
    "pickle_bulk": drive_pickle_bulk,
}


def _driver_main(conn, name: str, cfg: dict) -> None:
    """Entry point of a fresh driver process: runs one case, sends ('result', dict) or ('error', text)."""
    _die_with_parent()
    try:
        conn.send(("result", DRIVERS[name](cfg, lambda pool: conn.send(("pool", pool)))))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def remove_leftovers(pool_name: str) -> list[str]:
    """Unlinks /dev/shm names of a pool (its base name and its _N segments); returns what it removed."""
    base, gone = pool_name.lstrip("/"), []
    for entry in sorted(os.listdir("/dev/shm")):
        if entry == base or entry.startswith(base + "_"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", entry))
                gone.append(entry)
    return gone


def run_driver(name: str, cfg: dict, timeout: float) -> dict:
    """Runs one case in a fresh driver process; kills it after `timeout` s; cleans up its pools."""
    ours, theirs = CTX.Pipe(duplex=False)
    proc = CTX.Process(target=_driver_main, args=(theirs, name, cfg))
    proc.start()
    theirs.close()
    pools, result, deadline = [], None, time.monotonic() + timeout
    try:
        while result is None:
            if not ours.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{name}: no result after {timeout:.0f} s")
            kind, value = ours.recv()
            if kind == "pool":
                pools.append(value)
            elif kind == "error":
                raise RuntimeError(f"{name} failed in the driver process:\n{value}")
            else:
                result = value
        return result
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        for pool in pools:
            if gone := remove_leftovers(pool):
                print(f"WARNING: {name} left {gone} in /dev/shm (removed)")


def machine_busy_s() -> float:
    """Non-idle CPU seconds of the whole machine so far (/proc/stat, all CPUs; guest time is in user)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds used by this process and every descendant it has reaped."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def wait_quiet(max_s: float, window: float = 0.25, limit: float = 0.10) -> None:
    """Waits (at most max_s) until a window passes with the machine under `limit` cores busy."""
    end = time.monotonic() + max_s
    while time.monotonic() < end:
        before = machine_busy_s()
        time.sleep(window)
        if machine_busy_s() - before < limit * window:
            return


def measured_run(name: str, cfg: dict) -> tuple[dict, float]:
    """Runs one driver; returns its result and the cores that other processes used meanwhile."""
    t0, busy0, own0 = time.monotonic(), machine_busy_s(), own_cpu_s()
    result = run_driver(name, cfg, timeout=120)
    others = (machine_busy_s() - busy0) - (own_cpu_s() - own0)
    return result, max(0.0, others) / max(1e-9, time.monotonic() - t0)


def stats(samples: np.ndarray) -> tuple[float, float]:
    """(median, p99) of one run, in microseconds."""
    return float(np.median(samples)) / 1e3, float(np.percentile(samples, 99)) / 1e3


def fmt(us: float) -> str:
    return f"{us:.2f}" if us < 100 else f"{us:.0f}"


def print_table(results: dict) -> dict:
    """Prints case | median | p99 | runs | n/run | per-run medians; returns case -> per-run medians."""
    print(f"\n{'case':<34}| {'median us':>10} | {'p99 us':>10} | runs | {'n/run':>6} | per-run medians (us)")
    print("-" * 34 + "+" + "-" * 12 + "+" + "-" * 12 + "+------+--------+" + "-" * 24)
    medians = {}
    for case in RTT_CASES + BULK_CASES:
        runs = results.get(case, [])
        if not runs:
            continue
        per_run = [stats(s) for s, _ in runs]
        medians[case] = [m for m, _ in per_run]
        med = float(np.median(medians[case]))
        p99 = float(np.median([p for _, p in per_run]))
        print(f"{case:<34}| {fmt(med):>10} | {fmt(p99):>10} | {len(runs):>4} | {min(len(s) for s, _ in runs):>6} | "
              + " / ".join(fmt(m) + ("*" if bad else "") for m, (_, bad) in zip(medians[case], runs)))
    print("(median and p99: median over runs of each run's value; bulk p99 over few samples is about the max;\n"
          f" * = other processes used >= {DISTURBED:.0%} of a core during that run, even after retries)")
    return medians


def print_ratios(medians: dict) -> bool:
    """Prints each ratio of medians with its bar (None = information only); True if every bar holds."""
    checks = [("stubhost/bare", RTT_CASES[0], RTT_CASES[3], 1.5),
              ("stubhost/mp.Pipe", RTT_CASES[0], RTT_CASES[2], 0.5),
              ("stubhost(spin off)/bare", RTT_CASES[1], RTT_CASES[3], None),
              ("stubhost(spin off)/mp.Pipe", RTT_CASES[1], RTT_CASES[2], None),
              ("stubhost handoff/memcpy", BULK_CASES[0], BULK_CASES[1], 1.3),
              ("pickle/stubhost handoff", BULK_CASES[3], BULK_CASES[0], None)]
    print()
    all_ok = True
    for label, num, den, bar in checks:
        if num not in medians or den not in medians:
            continue
        ratio = float(np.median(medians[num])) / float(np.median(medians[den]))
        per_run = " ".join(f"{a / b:.2f}" for a, b in zip(medians[num], medians[den]))
        verdict = "info" if bar is None else ("PASS" if ratio <= bar else "FAIL")
        all_ok &= verdict != "FAIL"
        bar_text = "(information)" if bar is None else f"(bar <= {bar})"
        print(f"ratio {label} = {ratio:.2f}  {bar_text}  {verdict}   [per run: {per_run}]")
    return all_ok


def machine_facts() -> None:
    """Prints what the figures depend on."""
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"nproc {os.cpu_count()} (usable {len(os.sched_getaffinity(0))}), cpu {model}")
    print(f"python {platform.python_version()} ({sys.executable}), numpy {np.__version__}, {platform.platform()}")
    print(f"stubhost._core default spin budget {_core.spin_budget() * 1e6:.0f} us; processes are not pinned; "
          f"children start with multiprocessing 'spawn'")


def parse_args() -> argparse.Namespace:
    """Command line; --quick shrinks every count for a smoke run under 20 s."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, help="timed round trips per run (default 20000, quick 3000)")
    ap.add_argument("--bulk-iterations", type=int, help="timed 64 MiB handoffs per run (default 40, quick 8)")
    ap.add_argument("--runs", type=int, help="fresh-process runs per case (default 3, quick 2)")
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    ap.add_argument("--only", choices=["rtt", "bulk"], help="run only one of the two groups")
    ap.add_argument("--quiet-wait", type=float, help="max seconds to wait for an idle machine before "
                    "each run (default 2, quick 0.25)")
    ap.add_argument("--retries", type=int, help="re-runs of a disturbed run (default 1, quick 0); "
                    "skipped once the benchmark has run 80 s")
    args = ap.parse_args()
    q = args.quick
    args.quiet_wait = (0.25 if q else 2.0) if args.quiet_wait is None else args.quiet_wait
    args.retries = (0 if q else 1) if args.retries is None else args.retries
    args.iterations = args.iterations or (3000 if q else 20000)
    args.bulk_iterations = args.bulk_iterations or (8 if q else 40)
    args.runs = args.runs or (2 if q else 3)
    return args


def main() -> int:
    args = parse_args()
    cfg = {"iterations": args.iterations, "warmup_s": 0.1 if args.quick else 0.3, "max_s": 2.0,
           "bulk_iterations": args.bulk_iterations, "bulk_warmup": 2 if args.quick else 3,
           "pickle_iterations": max(3, args.bulk_iterations // 4)}
    names = [n for n in DRIVERS if args.only is None or args.only in n]
    machine_facts()
    print(f"runs {args.runs}, round trips {cfg['iterations']}/run (<= {cfg['max_s']} s), 64 MiB handoffs "
          f"{cfg['bulk_iterations']}/run, pickles {cfg['pickle_iterations']}/run, quiet-wait {args.quiet_wait} s, "
          f"retries {args.retries}")
    shm_before = {e for e in os.listdir("/dev/shm") if e.startswith("stubhost")}
    started, results, failed = time.perf_counter(), {}, False
    for run in range(args.runs):
        for name in names:
            try:
                for attempt in range(args.retries + 1):
                    wait_quiet(args.quiet_wait)
                    result, others = measured_run(name, cfg)
                    if others < DISTURBED or time.perf_counter() - started > 80:
                        break
                for case, samples in result.items():
                    results.setdefault(case, []).append((samples, others >= DISTURBED))
            except (RuntimeError, TimeoutError) as exc:
                print(f"ERROR run {run + 1} {exc}")
                failed = True
    medians = print_table(results)
    ok = print_ratios(medians)
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    left = sorted(e for e in os.listdir("/dev/shm") if e.startswith("stubhost"))
    if ours := [e for e in left if e.startswith(PREFIX)]:
        print(f"WARNING: /dev/shm still holds names made by this script: {ours}")
    if others := [e for e in left if not e.startswith(PREFIX) and e not in shm_before]:
        print(f"WARNING: stubhost* names appeared in /dev/shm during the run, not from this script: {others}")
    return 1 if failed or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
