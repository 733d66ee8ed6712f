"""Helpers shared by the benchmark scripts in this folder (bench_ipc.py, bench_roundtrip.py).

Not a script: each benchmark puts its own folder on sys.path and imports this module by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import os
import platform
import resource
import signal
import sys
import time

import numpy as np

CTX = mp.get_context("spawn")


# ---- process plumbing -------------------------------------------------------------------------
def child_setup() -> None:
    """Dies with its parent (PR_SET_PDEATHSIG), and turns off the GC, in every spawned process."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    gc.disable()


@contextlib.contextmanager
def child_process(target, *args):
    """Starts a spawned child; on exit waits for it briefly, then kills it."""
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


# ---- timing -----------------------------------------------------------------------------------
@contextlib.contextmanager
def gc_off():
    """The GC off (after a collection) for a timed loop."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def time_series(step, iterations: int, warmup_s: float, max_s: float, warmup_n: int = 1,
                check=None, no_gc: bool = False) -> np.ndarray:
    """Calls step(i) untimed for warmup_s (and >= warmup_n times), then times up to `iterations`
    calls one by one, stopping after max_s; returns nanoseconds. check(i, result), if given, runs
    outside the timed region; no_gc runs the timed loop inside gc_off()."""
    i, end = 0, time.perf_counter() + warmup_s
    while i < warmup_n or time.perf_counter() < end:
        result = step(i)
        if check is not None:
            check(i, result)
        i += 1
    clock, out = time.perf_counter_ns, []
    deadline = clock() + int(max_s * 1e9)
    with gc_off() if no_gc else contextlib.nullcontext():
        for k in range(i, i + iterations):
            t0 = clock()
            result = step(k)
            t1 = clock()
            out.append(t1 - t0)
            if check is not None:
                check(k, result)
            if t1 > deadline:
                break
    return np.asarray(out, dtype=np.int64)


async def async_time_series(step, iterations: int, warmup_s: float, max_s: float, warmup_n: int = 1,
                            check=None, no_gc: bool = False) -> np.ndarray:
    """time_series for a coroutine function: each `await step(i)` is timed in the running loop."""
    i, end = 0, time.perf_counter() + warmup_s
    while i < warmup_n or time.perf_counter() < end:
        result = await step(i)
        if check is not None:
            check(i, result)
        i += 1
    clock, out = time.perf_counter_ns, []
    deadline = clock() + int(max_s * 1e9)
    with gc_off() if no_gc else contextlib.nullcontext():
        for k in range(i, i + iterations):
            t0 = clock()
            result = await step(k)
            t1 = clock()
            out.append(t1 - t0)
            if check is not None:
                check(k, result)
            if t1 > deadline:
                break
    return np.asarray(out, dtype=np.int64)


# ---- disturbance and reporting ----------------------------------------------------------------
def cpu_seconds() -> tuple[float, float]:
    """(non-idle CPU seconds of the whole machine, CPU seconds of this process and its reaped descendants)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK"),
            me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime)


def measured(fn, *args, slack: float = 0.0):
    """Runs fn(*args); returns its result and how many cores other processes used meanwhile
    (after discounting `slack` CPU seconds of rounding)."""
    t0, (busy0, own0) = time.monotonic(), cpu_seconds()
    result = fn(*args)
    busy1, own1 = cpu_seconds()
    return result, max(0.0, (busy1 - busy0) - (own1 - own0) - slack) / max(1e-9, time.monotonic() - t0)


def fmt(x: float) -> str:
    """A figure with two decimals below 100, none from 100 up."""
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def summarize_runs(runs: list, scale: float) -> tuple[list[float], float, float, int, str]:
    """One case's runs [(samples in ns, disturbed), ...] in units of `scale` ns: (per-run medians,
    their median, median of the per-run p99s, fewest samples in a run, per-run medians as text with
    * on disturbed runs)."""
    medians = [float(np.median(s)) / scale for s, _ in runs]
    p99 = float(np.median([np.percentile(s, 99) for s, _ in runs])) / scale
    per_run = " / ".join(fmt(m) + ("*" if bad else "") for m, (_, bad) in zip(medians, runs))
    return medians, float(np.median(medians)), p99, min(len(s) for s, _ in runs), per_run


def machine_facts() -> int:
    """Prints what the figures depend on (CPUs, load, Python, numpy, OS); returns the usable CPU count."""
    with open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    usable = len(os.sched_getaffinity(0))
    print(f"nproc {os.cpu_count()} (usable {usable}), cpu {model}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"python {platform.python_version()} ({sys.executable}), numpy {np.__version__}, {platform.platform()}")
    return usable
