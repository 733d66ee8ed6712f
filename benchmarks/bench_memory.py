#!/usr/bin/env python3
"""Memory over many requests (ARCHITECTURE §6 "Memory"): resident memory and /dev/shm use of the
server and its stubs must stay flat over 100k add_sub requests, on every path a request can take,
optionally side by side with the real Triton 2.51 Python backend on the same model files.

Cases (--cases picks; default inproc,bls,stream,http,grpc,http-shm), run one after the other:
  inproc    stubhost.Server in this process, server.infer("add_sub", 4 x FP32), one thread.
  bls       the same Server: bls_loop (bench_streams.py's model) makes BLS_CALLS pb_utils BLS
            calls to add_sub per request; counted in BLS calls.
  stream    the same Server: server.stream("repeat", IN of STREAM_LENGTH) (examples/models/repeat,
            decoupled); counted in responses.
  http      `python -m stubhost serve` (bench_frontends' StubhostServer), tritonclient.http,
  grpc      tritonclient.grpc, --workers threads, each with its own client.
  http-shm  as http/grpc, with INPUT0/1 and OUTPUT0/1 in the worker's client system shared-memory
  grpc-shm  regions (tritonclient.utils.shared_memory, registered with the server).
With --with-triton, tritonserver with its Python backend (bench_frontends' TritonServer, from the
peer scripts ../shared/peers/triton) runs the http/grpc cases too, on the same repository.

Each case is split into 10 equal parts; the workers stop between parts (a barrier), and after
SETTLE_S s one sample is taken, plus one before the first request. A sample holds, for the server
process (for in-process cases: this process, which hosts the Server) and each stub of the case's
models: RSS (VmRSS), anon (RssAnon: private heap and stacks, where a leak shows) and PSS (from
/proc/PID/smaps_rollup: shared pages divided among the processes mapping them, so a pool mapped by
parent and stub is not counted twice as it is in RSS); the server's /dev/shm segments
(stubhost_<pid>_* of the server's pools; Triton: the triton_python_backend_shm_region_* its stubs
name): their total size, their real usage (st_blocks * 512) and their count; and in-process, each
stub pool's bytes in use (capacity_bytes - free_bytes) and live allocations, read through the
internal objects Server.loaded() returns (model.instances()[i].process.pool: stubhost._core.Pool).
PSS also moves by megabytes when other processes map or unmap the same libraries: never read it alone.

Bar ("flat"), between the sample after the first 10% (warm-up) and the end, per case: the RSS of
each process grows by less than RSS_BAR (2 MiB) over the last 90% of the requests, the /dev/shm
segments' size, usage and count do not grow, and (in-process) the pools' bytes in use and
allocations do not grow (all requests are done when a sample is taken, so a growing count is a
leaked block). RSS is the figure the bar speaks of; anon and PSS are printed to tell why it moved.
Expected, bounded: a model's statistics keep ~250 B per request until 4096 requests, then fold them
(host/stats.py FOLD_EVERY): up to ~1 MiB of parent growth in bls (1000 bls_loop requests) and stream.

Usage: python3 benchmarks/bench_memory.py [--quick] [--requests N] [--workers N] [--cases a,b]
       [--with-triton] [--triton-peer DIR] [--check]
--requests N: requests per case (default 100000; --quick: 10000). The default run takes about
3.5 minutes on 2 cores for stubhost alone, about 5 with --with-triton (--quick: 30-40 s).
Exit status: 0; 1 with --check when a case fails the bar; 2 when a case or a server failed, or
processes or /dev/shm segments were left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from importlib.metadata import version
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules, when run as a script
import bench_frontends as bf  # the servers, clients, regions, add_sub checks
from _common import machine_facts
from bench_streams import BLS_LOOP_CONFIG, BLS_LOOP_PY  # the BLS model

import stubhost

MIB = 1 << 20
POINTS = 10                 # samples after the first request: every 10% of the requests
WARM = 1                    # the sample index growth is measured from (after 10%)
RSS_BAR = 2 * MIB           # most RSS growth of one process over the last 90%
SETTLE_S = 0.2              # after a part, before sampling: late frees and replies land
BLS_CALLS = 100             # BLS calls per bls_loop request
STREAM_LENGTH = 10          # responses per repeat stream
CHECK_EVERY = 64            # check the answer of every n-th request
PART_TIMEOUT = 900.0        # s for one tenth of a case
SERVED = ("http", "grpc", "http-shm", "grpc-shm")
ALL_CASES = ("inproc", "bls", "stream", *SERVED)
DEFAULT_CASES = "inproc,bls,stream,http,grpc,http-shm"


# ---- measuring --------------------------------------------------------------------------------
def proc_memory(pid: int) -> dict[str, int]:
    """RSS, anon (RssAnon) and PSS of a process, in bytes; {} when it is gone."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    out["RSS" if key == "VmRSS" else "anon"] = int(rest.split()[0]) * 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:   # not readable for another user's process
            for line in f:
                if line.startswith("Pss:"):
                    out["PSS"] = int(line.split()[1]) * 1024
    return out


def shm_usage(names: list[str]) -> dict[str, int]:
    """Total size, real usage (st_blocks * 512) and count of /dev/shm segments."""
    size = used = count = 0
    for name in names:
        with contextlib.suppress(OSError):
            st = os.stat(os.path.join(bf.SHM_DIR, name))
            size, used, count = size + st.st_size, used + st.st_blocks * 512, count + 1
    return {"shm size": size, "shm used": used, "shm segments": count}


class Target:
    """A server being measured: its processes, its /dev/shm segments, its pools if visible."""

    label = "?"

    def processes(self, models: list[str]) -> list[tuple[str, int]]:
        """(row label, pid) of the server process and of the stubs of `models`."""
        raise NotImplementedError

    def segments(self) -> list[str]:
        """The server's segments in /dev/shm now."""
        raise NotImplementedError

    def pools(self, models: list[str]) -> list[tuple[str, Any]]:
        """(row label, stubhost._core.Pool) of the stubs of `models`, where this process sees them."""
        return []


class InProcess(Target):
    """stubhost.Server in this process."""

    label = "stubhost"

    def __init__(self, server: Any) -> None:
        self.server = server

    def _instances(self, models: list[str]) -> list[Any]:
        return [inst for m in self.server.loaded() if m.name in models for inst in m.instances()]

    def processes(self, models: list[str]) -> list[tuple[str, int]]:
        return [("this process", os.getpid())] + [(f"{i.name} stub", i.process.pid) for i in self._instances(models)]

    def segments(self) -> list[str]:
        return sorted(n for n in os.listdir(bf.SHM_DIR) if n.startswith(f"stubhost_{os.getpid()}_"))

    def pools(self, models: list[str]) -> list[tuple[str, Any]]:
        return [(f"{i.name} pool", i.process.pool) for i in self._instances(models)]


class Served(Target):
    """A server child from bench_frontends (StubhostServer or TritonServer)."""

    def __init__(self, server: bf.ServerUnderTest) -> None:
        self.server = server
        self.label = server.label

    def processes(self, models: list[str]) -> list[tuple[str, int]]:
        out = [(f"{self.label} server", self.server.proc.pid)]   # type: ignore[union-attr] - started
        for model in models:
            pids = self.server.stub_pids(model)
            out += [(f"{model} stub" + (f" #{k}" if len(pids) > 1 else ""), p) for k, p in enumerate(pids)]
        return out

    def segments(self) -> list[str]:
        return self.server.segments()


@dataclass
class Sample:
    """One sample point: requests done so far, and each measure (row label -> bytes or count)."""

    requests: int
    values: dict[str, int]
    pids: dict[str, int]


def take_sample(target: Target, models: list[str], requests: int) -> Sample:
    """Reads every measure of the target now."""
    values, pids = {}, {}
    for label, pid in target.processes(models):
        pids[label] = pid
        for key, value in proc_memory(pid).items():
            values[f"{label} {key}"] = value
    values.update(shm_usage(target.segments()))
    for label, pool in target.pools(models):
        values[f"{label} in use"] = pool.capacity_bytes - pool.free_bytes
        values[f"{label} allocations"] = pool.allocations
    return Sample(requests, values, pids)


# ---- cases ------------------------------------------------------------------------------------
Step = Callable[[int], None]


@dataclass
class Case:
    """One path: which stubs it measures, what a step sends, how many workers send it."""

    name: str
    what: str
    models: list[str]
    worker: Callable[[int], AbstractContextManager[Step]]   # opens worker k's step (in the worker's thread)
    workers: int = 1
    unit: int = 1                                    # requests counted per step


@contextlib.contextmanager
def inproc_worker(server: Any, k: int) -> Iterator[Step]:
    """server.infer on add_sub."""
    inputs = {"INPUT0": bf.ADD_A, "INPUT1": bf.ADD_B}

    def step(i: int) -> None:
        out = server.infer("add_sub", inputs)
        if i % CHECK_EVERY == 0:
            bf.check_add_sub(types.SimpleNamespace(as_numpy=out.get), f"in-process request {i}")
    yield step


@contextlib.contextmanager
def bls_worker(server: Any, k: int) -> Iterator[Step]:
    """One bls_loop request: BLS_CALLS BLS calls to add_sub from inside the model."""
    inputs = {"CALLS": np.array([BLS_CALLS], np.int32)}

    def step(i: int) -> None:
        got = server.infer("bls_loop", inputs)["NS"]
        if len(got) != BLS_CALLS:
            raise bf.BenchError(f"bls_loop request {i} answered {len(got)} timings, expected {BLS_CALLS}")
    yield step


@contextlib.contextmanager
def stream_worker(server: Any, k: int) -> Iterator[Step]:
    """One repeat stream of STREAM_LENGTH responses."""
    values = np.arange(STREAM_LENGTH, dtype=np.int32)

    def step(i: int) -> None:
        got = [int(out["OUT"][0]) for out in server.stream("repeat", {"IN": values})]
        if got != list(range(STREAM_LENGTH)):
            raise bf.BenchError(f"repeat stream {i} answered {got}")
    yield step


@contextlib.contextmanager
def net_worker(server: bf.ServerUnderTest, proto: str, k: int) -> Iterator[Step]:
    """add_sub over HTTP or gRPC from one client (binary data / raw contents)."""
    with bf.open_client(server, proto) as client:
        inputs, outputs = bf.add_sub_call(proto)

        def step(i: int) -> None:
            result = client.infer("add_sub", inputs, outputs=outputs)
            if i % CHECK_EVERY == 0:
                bf.check_add_sub(result, f"{proto} request {i}")
        yield step


@contextlib.contextmanager
def shm_worker(server: bf.ServerUnderTest, proto: str, k: int) -> Iterator[Step]:
    """add_sub with inputs and outputs in this worker's two client regions (32 bytes each)."""
    mod = bf.client_module(proto)
    with bf.open_client(server, proto) as client, contextlib.ExitStack() as stack:
        in_name, in_handle = stack.enter_context(bf.client_region(client, f"mem_in{k}", 32))
        out_name, out_handle = stack.enter_context(bf.client_region(client, f"mem_out{k}", 32))
        view = bf.region_array(in_handle, 8)
        view[:4], view[4:] = bf.ADD_A, bf.ADD_B
        del view   # no view may outlive its region
        inputs = [mod.InferInput(name, [4], "FP32") for name in ("INPUT0", "INPUT1")]
        outputs = [bf.make_output(proto, name) for name in ("OUTPUT0", "OUTPUT1")]
        for n, (inp, out) in enumerate(zip(inputs, outputs)):
            inp.set_shared_memory(in_name, 16, offset=16 * n)
            out.set_shared_memory(out_name, 16, offset=16 * n)
        expected = np.concatenate([bf.ADD_A + bf.ADD_B, bf.ADD_A - bf.ADD_B])

        def step(i: int) -> None:
            if i % CHECK_EVERY:
                client.infer("add_sub", inputs, outputs=outputs)
                return
            view = bf.region_array(out_handle, 8)
            try:
                view.fill(0)   # a stale answer must not pass
                result = client.infer("add_sub", inputs, outputs=outputs)
                if bf.output_has_data(result, proto, "OUTPUT0") or not np.array_equal(view, expected):
                    raise bf.BenchError(f"{proto} shm request {i}: wrong outputs {view} (or data in the response)")
            finally:
                del view
        yield step


def build_cases(names: list[str], target: Target, workers: int) -> list[Case]:
    """The selected cases that apply to the target (in-process ones to InProcess only)."""
    if isinstance(target, InProcess):
        s = target.server
        known = {"inproc": Case("inproc", "server.infer add_sub, 1 thread", ["add_sub"],
                                lambda k: inproc_worker(s, k)),
                 "bls": Case("bls", f"bls_loop: {BLS_CALLS} BLS calls to add_sub per request, 1 thread; counted "
                             "in BLS calls", ["bls_loop", "add_sub"], lambda k: bls_worker(s, k), unit=BLS_CALLS),
                 "stream": Case("stream", f"server.stream repeat (decoupled), {STREAM_LENGTH} responses per "
                                "stream, 1 thread; counted in responses", ["repeat"], lambda k: stream_worker(s, k),
                                unit=STREAM_LENGTH)}
        return [known[name] for name in names if name in known]
    assert isinstance(target, Served)
    out = []
    for name in (n for n in names if n in SERVED):
        proto, shm = name.split("-")[0], name.endswith("-shm")
        out.append(Case(name, f"tritonclient.{proto} add_sub{', inputs/outputs in client shm' if shm else ''}, "
                        f"{workers} client threads", ["add_sub"],
                        lambda k, p=proto, m=shm_worker if shm else net_worker: m(target.server, p, k),
                        workers=workers))
    return out


# ---- driving ----------------------------------------------------------------------------------
@dataclass
class Outcome:
    """One case run: its samples and how long the requests took (sampling excluded)."""

    target: str
    case: Case
    samples: list[Sample] = field(default_factory=list)
    busy_s: float = 0.0
    error: str = ""


def drive(case: Case, target: Target, requests: int) -> Outcome:
    """Sends the case's requests in POINTS parts from case.workers threads, sampling before the
    first part and after each one while every worker waits at a barrier."""
    steps = max(POINTS, round(requests / case.unit))
    marks = [round(steps * (i + 1) / POINTS) for i in range(POINTS)]
    n = case.workers
    gate = threading.Barrier(n + 1, timeout=PART_TIMEOUT)
    errors: list[str] = []

    def work(k: int) -> None:
        try:
            with case.worker(k) as step:
                gate.wait()                 # set up: clients, regions
                prev = 0
                for mark in marks:
                    gate.wait()             # go
                    for i in range(prev + (k - prev) % n, mark, n):   # this worker's share of the part
                        if gate.broken:
                            return
                        step(i)
                    gate.wait()             # part done
                    prev = mark
        except threading.BrokenBarrierError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(f"worker {k}: {type(exc).__name__}: {exc}")
            if not isinstance(exc, bf.BenchError):
                traceback.print_exc()
            gate.abort()

    out = Outcome(target.label, case)
    threads = [threading.Thread(target=work, args=(k,), name=f"bench-memory-{k}", daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    try:
        gate.wait()
        out.samples.append(take_sample(target, case.models, 0))
        for mark in marks:
            gate.wait()
            t0 = time.perf_counter()
            gate.wait()
            out.busy_s += time.perf_counter() - t0
            time.sleep(SETTLE_S)
            out.samples.append(take_sample(target, case.models, mark * case.unit))
    except threading.BrokenBarrierError:
        out.error = "; ".join(errors[:3]) or "a worker timed out"
    finally:
        gate.abort()
        for t in threads:
            t.join(bf.NET_TIMEOUT)
    return out


# ---- reporting --------------------------------------------------------------------------------
def kind(row: str) -> str:
    """'MiB', 'KiB' or 'n' for a measure's row label."""
    return "n" if row.endswith(("allocations", "segments")) else "KiB" if row.endswith("in use") else "MiB"


def shown(value: int, unit: str) -> str:
    """A value in its row's unit."""
    return f"{value / MIB:.2f}" if unit == "MiB" else f"{value / 1024:.1f}" if unit == "KiB" else str(value)


def verdict(out: Outcome) -> list[str]:
    """The reasons the case fails the bar ([] = flat)."""
    if out.error or len(out.samples) <= WARM + 1:
        return [out.error or "too few samples"]
    warm, end = out.samples[WARM], out.samples[-1]
    bad = [f"{label} was replaced (pid {pid} -> {end.pids.get(label)})"
           for label, pid in warm.pids.items() if end.pids.get(label) != pid]
    for row, before in warm.values.items():
        grew = end.values.get(row, before) - before
        if row.endswith(" RSS") and grew >= RSS_BAR:
            bad.append(f"{row} grew {grew / MIB:.2f} MiB (bar < {RSS_BAR / MIB:.0f} MiB)")
        elif (row.startswith("shm ") or row.endswith((" in use", " allocations"))) and grew > 0:
            bad.append(f"{row} grew by {grew}")
    return bad


def print_case(out: Outcome) -> None:
    """The table of one case: a row per measure, a column per sample, then the growth."""
    reqs = out.samples[-1].requests if out.samples else 0
    rate = f", {reqs / out.busy_s:.0f}/s" if out.busy_s else ""
    print(f"\n== {out.target} {out.case.name}: {out.case.what}: {reqs} requests in {out.busy_s:.1f} s{rate}")
    if len(out.samples) <= WARM + 1:
        print(f"   ERROR: {out.error or 'no samples'}")
        return
    span = out.samples[-1].requests - out.samples[WARM].requests
    cols = [f"{s.requests / 1000:g}k" for s in out.samples]
    head = f"{'measure':<28}{'unit':>4} |" + "".join(f"{c:>8}" for c in cols)
    head += f" | {'growth ' + cols[WARM] + '->end':>17} | {'per 1k req':>10}"
    print(head + "\n" + "-" * len(head))
    for row in out.samples[0].values | out.samples[-1].values:
        unit = kind(row)
        line = f"{row:<28}{unit:>4} |" + "".join(f"{shown(s.values[row], unit) if row in s.values else '-':>8}"
                                              for s in out.samples)
        a, b = out.samples[WARM].values.get(row), out.samples[-1].values.get(row)
        if a is not None and b is not None:   # growth in bytes (counts for 'n' rows), and per 1k requests
            delta = f"{b - a:+,d}" + (" B" if unit != "n" else "")
            line += f" | {delta:>17} | {(b - a) * 1000 / max(span, 1):>+10,.0f}"
        print(line)
    bad = verdict(out)
    print("flat: " + ("PASS" if not bad else "FAIL: " + "; ".join(bad)))


def footprint(out: Outcome) -> int:
    """RSS of the server and the case's stubs at the end of a case (0 if unknown). RSS, not PSS:
    PSS moves whenever other processes on the machine map or unmap the same libraries."""
    end = out.samples[-1] if out.samples else None
    return sum(v for k, v in end.values.items() if k.endswith(" RSS")) if end else 0


def print_summary(outcomes: list[Outcome]) -> bool:
    """One line per case, the stubhost / Triton footprint ratios; True when every case is flat."""
    head = (f"{'case':<20}| {'requests':>8} | {'req/s':>6} | {'server RSS +':>12} | {'stub RSS + (max)':>16} | "
            f"{'shm used +':>10} | {'RSS end MiB':>11} | verdict")
    print("\n" + head + "\n" + "-" * len(head))
    ok = True
    for out in outcomes:
        bad = verdict(out)
        ok = ok and (not bad or out.target != "stubhost")   # the bar is stubhost's; Triton's is shown
        name = f"{out.target} {out.case.name}"
        if len(out.samples) <= WARM + 1:
            print(f"{name:<20}| ERROR: {out.error}")
            continue
        warm, end = out.samples[WARM].values, out.samples[-1].values
        grew = {row: end[row] - warm[row] for row in warm if row in end and row.endswith(" RSS")}
        server = next(iter(grew.values()), 0)   # processes() lists the server first
        stubs = max(list(grew.values())[1:], default=0)
        reqs = out.samples[-1].requests
        print(f"{name:<20}| {reqs:>8} | {reqs / max(out.busy_s, 1e-9):>6.0f} | {server / 1024:>+8.0f} KiB | "
              f"{stubs / 1024:>+12.0f} KiB | {end['shm used'] - warm['shm used']:>+10,d} | "
              f"{footprint(out) / MIB:>11.1f} | {'PASS' if not bad else 'FAIL'}")
    print(f"(growth from the {100 // POINTS}% sample to the end; RSS end: server + the case's stubs, summed; "
          f"bar: RSS + < {RSS_BAR / MIB:.0f} MiB per process, no /dev/shm or pool growth)")
    by = {(o.target, o.case.name): footprint(o) for o in outcomes if o.samples}
    for name in SERVED:
        a, b = by.get(("stubhost", name)), by.get(("triton", name))
        if a and b:
            print(f"ratio footprint (RSS server + add_sub stub) {name} stubhost / triton = {a / b:.2f}  (info)")
    return ok


# ---- main -------------------------------------------------------------------------------------
def build_repositories(root: Path) -> tuple[Path, Path]:
    """(served, in-process): bench_frontends' add_sub + identity; the same plus repeat and bls_loop."""
    served = bf.build_repository(root / "served")
    inproc = bf.build_repository(root / "inproc")
    shutil.copytree(bf.EXAMPLES / "repeat", inproc / "repeat", ignore=shutil.ignore_patterns("__pycache__"))
    (inproc / "bls_loop" / "1").mkdir(parents=True)
    (inproc / "bls_loop" / "config.pbtxt").write_text(textwrap.dedent(BLS_LOOP_CONFIG))
    (inproc / "bls_loop" / "1" / "model.py").write_text(textwrap.dedent(BLS_LOOP_PY))
    return served, inproc


def run_cases(target: Target, names: list[str], args: argparse.Namespace, outcomes: list[Outcome]) -> None:
    """Every selected case against one target, printing each table as it completes."""
    for case in build_cases(names, target, args.workers):
        out = drive(case, target, args.requests)
        outcomes.append(out)
        print_case(out)


def run_in_process(repo: Path, names: list[str], args: argparse.Namespace, outcomes: list[Outcome]) -> list[str]:
    """The in-process cases on one stubhost.Server; returns hygiene problems after its close()."""
    t0 = time.monotonic()
    with stubhost.Server(repo, models=["add_sub", "bls_loop", "repeat"]) as server:
        target = InProcess(server)
        stubs = [pid for _, pid in target.processes(["add_sub", "bls_loop", "repeat"])[1:]]
        print(f"\nstubhost.Server in this process (pid {os.getpid()}): ready after {time.monotonic() - t0:.2f} s")
        run_cases(target, names, args, outcomes)
    time.sleep(0.2)
    problems = [f"in-process stub {p} still running after close()" for p in stubs if bf._is_zombie(p) is False]
    left = InProcess(None).segments()
    return problems + ([f"in-process Server left /dev/shm segments: {left}"] if left else [])


def run_served(server: bf.ServerUnderTest, names: list[str], args: argparse.Namespace,
               outcomes: list[Outcome]) -> bool:
    """Starts a server child, runs the served cases, stops it; returns False if it misbehaved."""
    ok = True
    try:
        took = server.start()
        version = f" {server.version}" if isinstance(server, bf.TritonServer) else ""
        print(f"\n{server.label}{version} pid {server.proc.pid}: http {server.http_url}, grpc {server.grpc_url}, "
              f"ready after {took:.2f} s")
        run_cases(Served(server), names, args, outcomes)
    except bf.BenchError as exc:
        print(f"ERROR: {server.label}: {exc}")
        ok = False
    finally:
        code = server.stop()
        print(f"{server.label} stopped with SIGTERM: exit code {code}")
        for problem in server.problems:
            print(f"ERROR: {server.label}: {problem}")
            ok = False
        if isinstance(server, bf.StubhostServer):
            ok = ok and code == 0
            for line in server.suspicious_log_lines()[:10]:
                print(f"    | {line}")
    return ok


def parse_args() -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, help="requests per case (default 100000; --quick 10000)")
    ap.add_argument("--quick", action="store_true", help="10000 requests per case")
    ap.add_argument("--workers", type=int, default=4, help="client threads of the served cases (default 4)")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"from {','.join(ALL_CASES)} (default {DEFAULT_CASES})")
    ap.add_argument("--with-triton", action="store_true", help="also run the served cases against Triton 2.51")
    ap.add_argument("--triton-peer", type=Path, default=bf.DEFAULT_PEER, help=f"peer scripts ({bf.DEFAULT_PEER})")
    ap.add_argument("--triton-setup-timeout", type=float, default=300.0, help="s allowed for setup.sh")
    ap.add_argument("--check", action="store_true", help="exit 1 when a case is not flat")
    args = ap.parse_args()
    args.requests = args.requests or (10_000 if args.quick else 100_000)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if unknown := sorted(set(args.cases) - set(ALL_CASES)):
        ap.error(f"unknown case(s) {unknown}; choose from {','.join(ALL_CASES)}")
    if args.requests < 10 * POINTS or args.workers < 1:
        ap.error(f"--requests must be >= {10 * POINTS} and --workers >= 1")
    return args


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, bf._on_sigterm)
    machine_facts()
    print(f"{args.requests} requests per case; cases {','.join(args.cases)}; {args.workers} client threads "
          f"for the served cases; a sample before the first request and after every {100 // POINTS}%")
    import tritonclient.grpc
    import tritonclient.http  # noqa: F401 - fail early if a client is missing; load both before any sample
    print(f"stubhost from {Path(stubhost.__file__).parent}, tritonclient {version('tritonclient')}")
    resource_tracker.ensure_running()   # tritonclient's shm regions use it; start it before any sample
    started = time.monotonic()
    outcomes: list[Outcome] = []
    failed = False
    served_cases = [c for c in args.cases if c in SERVED]
    with tempfile.TemporaryDirectory(prefix="bench_memory_") as tmp:
        served_repo, inproc_repo = build_repositories(Path(tmp))
        if set(args.cases) - set(SERVED):
            for problem in run_in_process(inproc_repo, args.cases, args, outcomes):
                print(f"ERROR: {problem}")
                failed = True
        if served_cases:
            failed = not run_served(bf.StubhostServer(served_repo), served_cases, args, outcomes) or failed
        why = (bf.TritonServer.unavailable(args.triton_peer) if args.with_triton
               else "run with --with-triton to measure Triton 2.51's Python backend too")
        if served_cases and why is None:
            triton = bf.TritonServer(args.triton_peer, served_repo, Path(tmp))
            try:
                print(f"triton peer: {triton.setup(args.triton_setup_timeout)}")
                run_served(triton, served_cases, args, outcomes)   # Triton's own troubles are not ours
            except bf.BenchError as exc:
                print(f"Triton cases skipped: the peer could not be set up: {exc}")
        elif served_cases:
            print(f"\nTriton cases skipped: {why}")
    ok = print_summary(outcomes)
    failed = failed or any(o.error for o in outcomes if o.target == "stubhost")
    if left := bf.own_leftovers():
        print(f"ERROR: client regions were left in /dev/shm (removed): {left}")
        failed = True
    print(f"\ntotal {time.monotonic() - started:.1f} s")
    return 2 if failed else 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
