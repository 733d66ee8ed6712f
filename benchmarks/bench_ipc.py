#!/usr/bin/env python3
"""IPC benchmarks of stubhost's shared-memory core against the obvious baselines (ARCHITECTURE §6).

1. Round trip of 64 bytes between two Python processes: stubhost (pool buffer + two MessageQueues,
   default spin budget and spin off), multiprocessing.Pipe, and a bare eventfd ping-pong over a
   shared mmap. Bars: stubhost <= 1.5x bare, <= 0.5x mp.Pipe.
2. Handing a 64 MiB float32 array to a child that reads one element per 4 KiB page and acks:
   stubhost (one copy into a pre-grown pool, zero-copy view in the child) and pickle over mp.Pipe,
   against one np.copyto of 64 MiB timed in the same process. Bar: stubhost <= 1.3x memcpy.

Each (case, run) gets a fresh driver process (the timing side) and echo child (spawn context);
runs are interleaved across cases. Runs wait briefly for an idle machine, and runs during which
other processes used >= 5% of a core are retried once and marked. Pools are named
bench_stubhost_*, out of the way of a concurrent test suite's stubhost* leak checks.
Usage: python3 benchmarks/bench_ipc.py [--quick] [--runs N] [--iterations N] [--only rtt|bulk]
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import sys
import time
import traceback
from multiprocessing import reduction
from pathlib import Path

import numpy as np

from stubhost import _core
from stubhost._core import MessageQueue, Pool
from stubhost.tensor import SharedTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py, when run as a script
from _common import (CTX, child_process, child_setup, cpu_seconds, fmt,  # noqa: E402
                     machine_facts, measured, summarize_runs, time_series)

PREFIX = "bench_stubhost"     # /dev/shm/bench_stubhost_*: not matched by the tests' stubhost* checks
MSG, BIG = 64, 64 << 20       # round-trip payload and bulk tensor, bytes
PAGE_ELEMS = 4096 // 4        # float32 elements per 4 KiB page
STOP, READY, BAD = 0, 1, 2    # queue values that are never pool handles (handles are 64-aligned)
DISTURBED = 0.05              # a run is disturbed if other processes used this many cores meanwhile
WAIT = 30.0                   # seconds before a blocked parent gives up
PAYLOADS = [bytes([i]) + bytes(range(1, MSG)) for i in range(256)]
RTT = ["rtt stubhost (default spin)", "rtt stubhost (spin off)", "rtt mp.Pipe", "rtt bare eventfd+shm"]
BULK = ["64MiB stubhost handoff", "64MiB memcpy (np.copyto)", "64MiB stubhost, already in pool",
        "64MiB pickle over mp.Pipe", "64MiB pool growth (once/run)"]


# ---- process plumbing -------------------------------------------------------------------------
class PassFd:
    """An fd that survives spawn: pickled during Process.start(), it joins the fds passed to the child."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(dup) -> int:
    return dup.detach()


def wait_ready(queue: MessageQueue, proc) -> None:
    """Waits for the READY a stubhost child pushes once attached; fails fast if the child died."""
    while (value := queue.pop(0.2)) is None:
        if not proc.is_alive():
            raise RuntimeError(f"child exited ({proc.exitcode}) before it was ready")
    if value != READY:
        raise RuntimeError(f"child sent {value} instead of READY")


# ---- 1. round trip of 64 bytes ----------------------------------------------------------------
def _child_stubhost(pool_name: str, qa_handle: int, qb_handle: int, spin_off: bool, expect=None) -> None:
    """Echo child of both stubhost cases. Round trip (expect None): view the handle's 64 bytes (a new
    view per message), bump byte 0, push the handle back. Bulk: view the tensor as numpy without a
    copy, touch it, ack with the handle (BAD if the data is wrong)."""
    child_setup()
    if spin_off:
        _core.set_spin_budget(0)
    with Pool.attach(pool_name) as pool:
        qa, qb = MessageQueue.attach(pool, qa_handle), MessageQueue.attach(pool, qb_handle)
        qb.push(READY)
        if expect is None:
            while (h := qa.pop()) != STOP:
                m = memoryview(pool.view(h, MSG))
                m[0] = (m[0] + 1) & 0xFF
                m = None
                qb.push(h)
        while expect is not None and (h := qa.pop()) != STOP:
            a = SharedTensor.read(pool, h).as_numpy()
            ok = a.shape == (BIG // 4,) and touch(a) == expect
            a = None
            qb.push(h if ok else BAD)


def drive_stubhost_rtt(cfg: dict, report, spin_off: bool = False) -> dict:
    """Parent: write 64 bytes into a pool buffer, push its handle on queue A, pop it from queue B."""
    if spin_off:
        _core.set_spin_budget(0)
    with Pool.create(prefix=PREFIX) as pool:
        report(pool.name)
        qa, qb = MessageQueue.create(pool, 16), MessageQueue.create(pool, 16)
        h = pool.allocate(MSG)
        buf = memoryview(pool.view(h, MSG))

        def step(i):
            buf[:] = PAYLOADS[i & 0xFF]
            qa.push(h)
            if qb.pop(WAIT) != h or buf[0] != (i + 1) & 0xFF:
                raise RuntimeError(f"stubhost echo {i}: wrong handle, wrong byte or timeout")

        with child_process(_child_stubhost, pool.name, qa.handle, qb.handle, spin_off) as proc:
            try:
                wait_ready(qb, proc)
                samples = time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"])
            finally:
                qa.push(STOP)
        buf.release()
    return {RTT[1 if spin_off else 0]: samples}


def _child_pipe(conn, expect=None) -> None:
    """Echo child of both mp.Pipe cases. Round trip (expect None): bump byte 0 and send the bytes
    back; b"" stops. Bulk: unpickle the array, touch it, ack b"k" (b"x" if wrong); None stops."""
    child_setup()
    if expect is None:
        while msg := conn.recv_bytes():
            b = bytearray(msg)
            b[0] = (b[0] + 1) & 0xFF
            conn.send_bytes(b)
    while expect is not None and (a := conn.recv()) is not None:
        ok = a.shape == (BIG // 4,) and touch(a) == expect
        a = None
        conn.send_bytes(b"k" if ok else b"x")


def drive_pipe_rtt(cfg: dict, report) -> dict:
    """Parent side of the multiprocessing.Pipe round trip."""
    ours, theirs = CTX.Pipe()

    def step(i):
        ours.send_bytes(PAYLOADS[i & 0xFF])
        if ours.recv_bytes()[0] != (i + 1) & 0xFF:
            raise RuntimeError(f"pipe echo {i}: wrong byte")

    with child_process(_child_pipe, theirs):
        theirs.close()
        try:
            samples = time_series(step, cfg["iterations"], cfg["warmup_s"], cfg["max_s"])
        finally:
            ours.send_bytes(b"")
    ours.close()
    return {RTT[2]: samples}


def _child_eventfd_rtt(efd_a: int, efd_b: int, memfd: int) -> None:
    """Echo: block on eventfd A, bump byte 0 of the shared page, signal eventfd B (2 on A = stop)."""
    child_setup()
    with mmap.mmap(memfd, mmap.PAGESIZE) as mm:
        while os.eventfd_read(efd_a) == 1:
            mm[0] = (mm[0] + 1) & 0xFF
            os.eventfd_write(efd_b, 1)


def drive_eventfd_rtt(cfg: dict, report) -> dict:
    """Parent of the bare ping-pong: 64 bytes in a memfd mmap, two blocking eventfds."""
    efd_a, efd_b, memfd = os.eventfd(0), os.eventfd(0), os.memfd_create("bench_ipc")
    os.ftruncate(memfd, mmap.PAGESIZE)
    try:
        with mmap.mmap(memfd, mmap.PAGESIZE) as mm:
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
    finally:
        for fd in (efd_a, efd_b, memfd):
            os.close(fd)
    return {RTT[3]: samples}


# ---- 2. handing a 64 MiB array to a child -----------------------------------------------------
def touch(a: np.ndarray) -> float:
    """The child's work on every array it gets: read one float32 per 4 KiB page and sum them."""
    return float(a.reshape(-1)[::PAGE_ELEMS].sum(dtype=np.float64))


def drive_stubhost_bulk(cfg: dict, report) -> dict:
    """Per iteration, interleaved: one 64 MiB memcpy, one stubhost handoff (copy into the pool +
    handle + child view/touch/ack), one re-send of the tensor already in the pool. The pool is
    grown once beforehand (timed on its own); the free after each handoff is not timed."""
    src = np.arange(BIG // 4, dtype=np.float32)
    dst = np.ones_like(src)  # pre-faulted destination for the memcpy baseline
    with Pool.create(prefix=PREFIX) as pool:
        report(pool.name)
        qa, qb = MessageQueue.create(pool, 16), MessageQueue.create(pool, 16)
        t0 = time.perf_counter_ns()
        pool.free(pool.allocate(_core.tensor_header_bytes(len("INPUT0"), 1) + BIG))
        growth, segments = time.perf_counter_ns() - t0, pool.segment_count

        def send(h, i):
            qa.push(h)
            if qb.pop(WAIT) != h:
                raise RuntimeError(f"stubhost bulk {i}: bad ack (wrong data or timeout)")

        series = {case: [] for case in BULK[:3]}
        with child_process(_child_stubhost, pool.name, qa.handle, qb.handle, False, touch(src)) as proc:
            try:
                wait_ready(qb, proc)
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
            print(f"  note: the pool grew in the timed loop ({segments} -> {pool.segment_count} segments)")
    out = {case: np.asarray(v, dtype=np.int64) for case, v in series.items()}
    out[BULK[4]] = np.asarray([growth], dtype=np.int64)
    return out


def drive_pickle_bulk(cfg: dict, report) -> dict:
    """Parent: send the array over multiprocessing.Pipe (pickled), wait for the ack."""
    src = np.arange(BIG // 4, dtype=np.float32)
    ours, theirs = CTX.Pipe()

    def step(i):
        ours.send(src)
        if ours.recv_bytes() != b"k":
            raise RuntimeError(f"pickle bulk {i}: the child saw wrong data")

    with child_process(_child_pipe, theirs, touch(src)):
        theirs.close()
        try:
            samples = time_series(step, cfg["pickle_iterations"], 0.0, cfg["max_s"], cfg["bulk_warmup"])
        finally:
            ours.send(None)
    ours.close()
    return {BULK[3]: samples}


# ---- driver processes and orchestration -------------------------------------------------------
DRIVERS = {"stubhost_rtt": drive_stubhost_rtt,
           "stubhost_rtt_nospin": lambda cfg, report: drive_stubhost_rtt(cfg, report, spin_off=True),
           "pipe_rtt": drive_pipe_rtt, "eventfd_rtt": drive_eventfd_rtt,
           "stubhost_bulk": drive_stubhost_bulk, "pickle_bulk": drive_pickle_bulk}


def _driver_main(conn, name: str, cfg: dict) -> None:
    """A fresh driver process: runs one case; sends ('pool', name)s, then ('result', dict) or ('error', text)."""
    child_setup()
    try:
        conn.send(("result", DRIVERS[name](cfg, lambda pool: conn.send(("pool", pool)))))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_driver(name: str, cfg: dict, timeout: float = 120) -> dict:
    """Runs one case in a fresh driver process, killed after `timeout` s; removes pools it leaves."""
    ours, theirs = CTX.Pipe(duplex=False)
    proc = CTX.Process(target=_driver_main, args=(theirs, name, cfg))
    proc.start()
    theirs.close()
    pools, deadline = [], time.monotonic() + timeout
    try:
        while True:
            if not ours.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{name}: no result after {timeout:.0f} s")
            kind, value = ours.recv()
            if kind == "error":
                raise RuntimeError(f"{name} failed in its driver process:\n{value}")
            if kind == "result":
                return value
            pools.append(value)
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        for pool in pools:  # a pool's names: its own and its segments' (<name>_<n>)
            for entry in [e for e in os.listdir("/dev/shm") if (e + "_").startswith(pool.lstrip("/") + "_")]:
                print(f"WARNING: {name} left /dev/shm/{entry}; removing it")
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join("/dev/shm", entry))


def wait_quiet(max_s: float, window: float = 0.25) -> None:
    """Waits (at most max_s) for a `window` in which the machine used under 10% of a core."""
    end = time.monotonic() + max_s
    while time.monotonic() < end:
        before = cpu_seconds()[0]
        time.sleep(window)
        if cpu_seconds()[0] - before < 0.1 * window:
            return


def print_table(results: dict) -> dict:
    """Prints case | median | p99 | runs | n/run | per-run medians; returns case -> per-run medians (us)."""
    print(f"\n{'case':<33}| {'median us':>10} | {'p99 us':>10} | runs | {'n/run':>6} | per-run medians (us)")
    print("-" * 33 + "+" + "-" * 12 + "+" + "-" * 12 + "+------+--------+" + "-" * 24)
    medians = {}
    for case in RTT + BULK:
        runs = results.get(case, [])
        if runs:
            medians[case], median, p99, n, per_run = summarize_runs(runs, 1e3)
            print(f"{case:<33}| {fmt(median):>10} | {fmt(p99):>10} | {len(runs):>4} | {n:>6} | {per_run}")
    print("median, p99: median over runs of each run's figure (p99 of a few bulk samples is about the max)\n"
          f"* = other processes used >= {DISTURBED:.0%} of a core during that run (after a retry)")
    return medians


def print_ratios(medians: dict) -> bool:
    """Prints ratios of medians against their bars (None: information only); True if all bars hold."""
    checks = [("stubhost/bare", RTT[0], RTT[3], 1.5), ("stubhost/mp.Pipe", RTT[0], RTT[2], 0.5),
              ("stubhost(spin off)/bare", RTT[1], RTT[3], None),
              ("stubhost(spin off)/mp.Pipe", RTT[1], RTT[2], None),
              ("stubhost handoff/memcpy", BULK[0], BULK[1], 1.3),
              ("pickle/stubhost handoff", BULK[3], BULK[0], None)]
    print()
    all_ok = True
    for label, num, den, bar in checks:
        if num in medians and den in medians:
            ratio = float(np.median(medians[num])) / float(np.median(medians[den]))
            per_run = " ".join(f"{a / b:.2f}" for a, b in zip(medians[num], medians[den]))
            verdict = "info" if bar is None else ("PASS" if ratio <= bar else "FAIL")
            all_ok &= verdict != "FAIL"
            print(f"ratio {label} = {ratio:.2f}  ({'information' if bar is None else f'bar <= {bar}'})  "
                  f"{verdict}   [per run: {per_run}]")
    return all_ok


def parse_args() -> argparse.Namespace:
    """Command line; --quick shrinks every count for a smoke run under 20 s."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, help="timed round trips per run (default 20000, quick 3000)")
    ap.add_argument("--bulk-iterations", type=int, help="timed 64 MiB handoffs per run (default 40, quick 8)")
    ap.add_argument("--runs", type=int, help="fresh-process runs per case (default 3, quick 2)")
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    ap.add_argument("--only", choices=["rtt", "bulk"], help="run only one of the two groups")
    ap.add_argument("--quiet-wait", type=float, help="max s to wait for an idle machine before each run "
                    "(default 2, quick 0.25; none after 60 s)")
    ap.add_argument("--retries", type=int, help="re-runs of a disturbed run (default 1, quick 0; none after 60 s)")
    args = ap.parse_args()
    q = args.quick
    args.iterations = args.iterations or (3000 if q else 20000)
    args.bulk_iterations = args.bulk_iterations or (8 if q else 40)
    args.runs = args.runs or (2 if q else 3)
    args.quiet_wait = (0.25 if q else 2.0) if args.quiet_wait is None else args.quiet_wait
    args.retries = (0 if q else 1) if args.retries is None else args.retries
    return args


def main() -> int:
    args = parse_args()
    cfg = {"iterations": args.iterations, "warmup_s": 0.1 if args.quick else 0.3, "max_s": 2.0,
           "bulk_iterations": args.bulk_iterations, "bulk_warmup": 2 if args.quick else 3,
           "pickle_iterations": max(3, args.bulk_iterations // 4)}
    names = [n for n in DRIVERS if args.only is None or args.only in n]
    machine_facts()
    print(f"stubhost default spin budget {_core.spin_budget() * 1e6:.0f} us; no CPU pinning; spawn context")
    print(f"runs {args.runs}; per run: round trips {cfg['iterations']} (<= {cfg['max_s']} s), 64 MiB handoffs "
          f"{cfg['bulk_iterations']}, pickles {cfg['pickle_iterations']}; quiet-wait {args.quiet_wait} s, "
          f"retries {args.retries}")
    started, results, failed = time.perf_counter(), {}, False
    for run in range(args.runs):
        for name in names:
            try:
                for attempt in range(args.retries + 1):
                    early = time.perf_counter() - started < 60
                    wait_quiet(args.quiet_wait if early else 0.0)
                    result, others = measured(run_driver, name, cfg)
                    if others < DISTURBED or not early:
                        break
                for case, samples in result.items():
                    results.setdefault(case, []).append((samples, others >= DISTURBED))
            except (RuntimeError, TimeoutError) as exc:
                print(f"ERROR in run {run + 1}: {exc}")
                failed = True
    ok = print_ratios(print_table(results))
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    if left := sorted(e for e in os.listdir("/dev/shm") if e.startswith((PREFIX, "stubhost"))):
        print(f"WARNING: /dev/shm holds {left} ({PREFIX}* are this script's; stubhost* may be a concurrent test run's)")
    return 1 if failed or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
