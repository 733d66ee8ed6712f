#!/usr/bin/env python3
"""Start and restart (ARCHITECTURE §6): the time from `load` to READY, and from a stub crash to
serving again, over KServe v2 HTTP (tritonclient.http), for `stubhost serve` and, in the same run,
Triton 2.51's Python backend on the same model files (--with-triton).

Both servers run in explicit model-control mode (--load-model add_sub, identity) on bench_frontends'
temp repository; add_sub (the example, 1 instance, KIND_CPU) is measured, the servers interleaved
repetition by repetition (the order alternates). Cases:

  1. load -> READY: unload add_sub and wait until it is not ready and its stub has exited
     (untimed), then time load_model until it returns and until is_model_ready is true.
  2. crash -> serving (busy): a client thread sends add_sub back to back (one connection,
     --client-timeout s per request, answers checked); the model's stub is SIGKILLed (stubhost: the
     child `python -m stubhost.stub SPEC` whose SPEC names instance add_sub_0_0; Triton: the
     `triton_python_backend_stub` child running add_sub's model.py). Recorded: kill -> the first
     correct answer to a request sent after it, the requests that failed meanwhile (first error
     text), kill -> a new stub pid seen (20 ms polling), and that the pid is new.
  3. crash -> serving (idle): the same with no traffic for --idle s after the kill (is a dead stub
     replaced without a request?); timed from the first request to its first correct answer.
  4. crash -> unload+load -> serving: the kill, then at once unload + load + one request, as an
     operator would do where the server does not restart stubs itself.
A server that does not serve again within --recover-timeout s is shown as >T (Triton 2.51 does
not replace a dead stub: each request waits about 1 s and fails with "Stub process 'add_sub_0_0'
is not healthy.", while the model stays READY).

stubhost's RestartPolicy (docs/design/lifecycle.md) backs off 0.1 s * 2^(n-1) before restart n
of an instance within 60 s, and the 6th crash leaves it FAILED. So every crash round starts from
a freshly loaded add_sub (unload + load, untimed; a new instance has no crash history); busy
rounds have --crashes-per-load crashes (default 1), each reported with its backoff.

A figure marked * was taken while other processes (not this client, not the servers with their
stubs) used >= 10% of a core: compare the ratios of one run, not absolute figures. The peer's own
leftovers after crashes (Triton leaves the killed stubs' shm regions, and exits 1 after its exit
timeout) are printed as notes, and the regions removed.

--url HOST:PORT [--peer-label NAME]: compare with a running KServe v2 server in explicit mode that
serves add_sub and identity instead of Triton; only case 1 (its stubs are not ours to kill).

Usage: python3 benchmarks/bench_restart.py [--quick] [--with-triton | --url H:P [--peer-label N]]
       [--loads N] [--crashes N] [--idle-crashes N] [--reload-crashes N] [--crashes-per-load K]
       [--pause S] [--idle S] [--recover-timeout S] [--client-timeout S] [--triton-peer DIR]
Defaults: 10 loads; 5 busy, 2 idle, 3 unload+load crash rounds; recover timeout 10 s (about
3 minutes with Triton on 2 cores). --quick: 3 loads; 2, 1, 1 rounds; 5 s (about 1 minute).
Exit status: 0; 2 when stubhost failed or left processes or /dev/shm segments, or a case failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_frontends as bf  # noqa: E402  (the server classes, the repository, the peer)

MODEL = "add_sub"
EXPLICIT = ["--model-control-mode=explicit", f"--load-model={MODEL}", "--load-model=identity"]
RECOVER_TIMEOUT = 60.0   # s for a load to make the model ready
STEADY_TIMEOUT = 30.0    # s for unload to finish / traffic to flow before a crash
POLL_PIDS_S = 0.02       # stub pid polling period (walking a server's /proc tree costs CPU)
DISTURBED = 0.10         # cores used by other processes during a measurement that mark it *
STUBS_SEEN: set[int] = set()   # every add_sub stub pid seen: none may outlive the run


# ---- measurements -----------------------------------------------------------------------------
@dataclass
class Sample:
    """One measurement: its value (s), whether the machine was disturbed, and what else was seen."""

    value: float | None       # None: not serving again within --recover-timeout s
    disturbed: bool = False
    failed: int = 0            # requests that failed between the crash and serving again
    first_error: str = ""
    extra: float | None = None  # load: load call returned (s); crash: kill -> new stub pid (s)


def tree_cpu(server: bf.ServerUnderTest) -> float:
    """CPU seconds of the server and its descendants, reaped children included (a killed stub's
    time moves into its parent's cutime, so it does not show up as another process's)."""
    if server.proc is None:
        return 0.0
    total, tick = 0, os.sysconf("SC_CLK_TCK")
    for p in bf.process_tree(server.proc.pid):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{p}/stat") as f:
            total += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:15])
    return total / tick


class Disturbance:
    """Cores other processes used between start and stop (minus the servers and this process)."""

    def __init__(self, servers: list[bf.ServerUnderTest]) -> None:
        self.servers = servers
        self.t0 = time.monotonic()
        self.busy0, self.own0 = bf.cpu_seconds()
        self.srv0 = sum(tree_cpu(s) for s in servers)

    def disturbed(self) -> bool:
        """Whether others used >= DISTURBED of a core meanwhile (one tick per CPU of slack)."""
        busy1, own1 = bf.cpu_seconds()
        srv1 = sum(tree_cpu(s) for s in self.servers)
        slack = os.cpu_count() / os.sysconf("SC_CLK_TCK")
        others = (busy1 - self.busy0) - (own1 - self.own0) - (srv1 - self.srv0) - slack
        return max(0.0, others) / max(1e-9, time.monotonic() - self.t0) >= DISTURBED


def http_client(server: bf.ServerUnderTest, timeout: float) -> Any:
    """A tritonclient.http client with a short timeout (use it in the thread that made it)."""
    import tritonclient.http as httpclient
    return httpclient.InferenceServerClient(server.http_url, connection_timeout=timeout, network_timeout=timeout)


def wait_for(what: str, cond: Any, timeout: float, period: float = 0.01) -> float:
    """Polls cond() until true; returns the seconds waited (BenchError after timeout)."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise bf.BenchError(f"{what}: not after {timeout:.0f} s")
        time.sleep(period)
    return time.monotonic() - t0


def infer_ok(client: Any, what: str) -> None:
    """One add_sub request whose answer must be right."""
    inputs, outputs = bf.add_sub_call("http")
    bf.check_add_sub(client.infer(MODEL, inputs, outputs=outputs), what)


def unload(server: bf.ServerUnderTest, client: Any) -> None:
    """Unloads add_sub and waits until it is not ready and its stub has exited (untimed)."""
    client.unload_model(MODEL)
    wait_for(f"{server.label}: {MODEL} still ready after unload", lambda: not client.is_model_ready(MODEL),
             STEADY_TIMEOUT)
    wait_for(f"{server.label}: {MODEL}'s stub still running after unload", lambda: not server.stub_pids(MODEL),
             STEADY_TIMEOUT, POLL_PIDS_S)


def measure_load(server: bf.ServerUnderTest, servers: list[bf.ServerUnderTest], timeout: float) -> Sample:
    """Unload (untimed), then load_model until it returns and until is_model_ready. Also the untimed
    reload before each crash round: a new instance has no crash history."""
    client = http_client(server, max(timeout, 120.0))   # a load may take long on a busy box
    try:
        unload(server, client)
        probe = Disturbance(servers)
        t0 = time.monotonic()
        client.load_model(MODEL)
        returned = time.monotonic() - t0
        wait_for(f"{server.label}: {MODEL} ready after load", lambda: client.is_model_ready(MODEL), RECOVER_TIMEOUT,
                 0.001)
        ready = time.monotonic() - t0
        disturbed = probe.disturbed()
        infer_ok(client, f"{server.label} after load")
        if not isinstance(server, bf.ExternalServer):
            one_stub(server)
        return Sample(ready, disturbed, extra=returned)
    finally:
        client.close()


class Traffic:
    """A thread sending add_sub back to back on one HTTP connection; it logs every request as
    (start, end, error or None), monotonic seconds. A transport error (timeout, reset) makes it
    open a new connection; a server error keeps the connection."""

    def __init__(self, server: bf.ServerUnderTest, timeout: float) -> None:
        self.server, self.timeout = server, timeout
        self.log: list[tuple[float, float, str | None]] = []   # appended by the thread only
        self.crashed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from tritonclient.utils import InferenceServerException
        client = None
        try:
            inputs, outputs = bf.add_sub_call("http")
            while not self._stop.is_set():
                if client is None:
                    client = http_client(self.server, self.timeout)
                t0, err = time.monotonic(), None
                try:
                    bf.check_add_sub(client.infer(MODEL, inputs, outputs=outputs), "after the crash")
                except (InferenceServerException, bf.BenchError) as exc:
                    err = str(exc)
                except Exception as exc:  # noqa: BLE001 - transport errors are what a crash may cause
                    err = f"{type(exc).__name__}: {exc}"
                    with contextlib.suppress(Exception):
                        client.close()
                    client = None
                self.log.append((t0, time.monotonic(), err))
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            self.crashed = f"{type(exc).__name__}: {exc}"
        finally:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()

    def first_ok_after(self, t: float) -> float | None:
        """End of the first correct answer to a request started at or after t."""
        return next((end for start, end, err in list(self.log) if start >= t and err is None), None)

    def failures(self, t: float, until: float) -> list[str]:
        """Errors of the requests that ended between t and until."""
        return [err for _, end, err in list(self.log) if err is not None and t <= end <= until]

    def stop(self) -> None:
        """Stops the thread (waits for its last request)."""
        self._stop.set()
        self._thread.join(self.timeout + 10)


def one_stub(server: bf.ServerUnderTest) -> int:
    """The pid of add_sub's only stub."""
    pids = server.stub_pids(MODEL)
    if len(pids) != 1:
        raise bf.BenchError(f"{server.label}: expected one stub process of {MODEL}, found {pids}")
    STUBS_SEEN.add(pids[0])
    return pids[0]


def poll_new_stub(server: bf.ServerUnderTest, old: int, t_kill: float, seen: dict[str, float]) -> None:
    """Records in seen['new_stub'] when a stub other than `old` first shows up (s after the kill)."""
    if "new_stub" not in seen and [p for p in server.stub_pids(MODEL) if p != old]:
        seen["new_stub"] = time.monotonic() - t_kill


def await_recovery(server: bf.ServerUnderTest, traffic: Traffic, old: int, since: float, t_kill: float,
                   seen: dict[str, float], limit: float) -> float | None:
    """Waits for a correct answer to a request started at or after `since`, polling the stub pids
    meanwhile; returns the end of that answer, or None after `limit` s from the kill."""
    next_poll = 0.0
    while True:
        now = time.monotonic()
        if now >= next_poll:
            poll_new_stub(server, old, t_kill, seen)
            next_poll = now + POLL_PIDS_S
        end = traffic.first_ok_after(since)
        if end is not None:
            return end
        if traffic.crashed:
            raise bf.BenchError(f"{server.label}: the client thread failed: {traffic.crashed}")
        if now - t_kill > limit:
            return None
        time.sleep(0.002)


def check_replaced(server: bf.ServerUnderTest, old: int, seen: dict[str, float], t_kill: float) -> int:
    """The new stub's pid; BenchError unless the old one is gone and one new one serves."""
    wait_for(f"{server.label}: stub {old} replaced", lambda: old not in server.stub_pids(MODEL) and
             len(server.stub_pids(MODEL)) == 1, 10.0, POLL_PIDS_S)
    seen.setdefault("new_stub", time.monotonic() - t_kill)
    new = one_stub(server)
    if new == old:
        raise bf.BenchError(f"{server.label}: the stub was not replaced (pid {old} still serves)")
    return new


def measure_crash(server: bf.ServerUnderTest, servers: list[bf.ServerUnderTest], args: argparse.Namespace,
                  kind: str) -> tuple[Sample, int, int | None]:
    """SIGKILLs add_sub's stub and times how it serves again; returns (the sample, old pid, new pid
    or None when it did not serve again within --recover-timeout s). kind: 'busy' (a client sends
    requests back to back throughout), 'idle' (no traffic for --idle s, then requests), or 'reload'
    (at once unload + load, as an operator would, then one request)."""
    old = one_stub(server)
    seen: dict[str, float] = {}
    traffic = None
    errors: list[str] = []
    try:
        if kind == "busy":
            traffic = Traffic(server, args.client_timeout)
            wait_for(f"{server.label}: traffic before the crash", lambda: sum(e is None for *_, e in traffic.log) >= 20,
                     STEADY_TIMEOUT, 0.005)
            if errs := traffic.failures(0.0, time.monotonic()):
                raise bf.BenchError(f"{server.label}: requests failed before the crash: {errs[0]}")
        probe = Disturbance(servers)
        t_kill = time.monotonic()
        os.kill(old, signal.SIGKILL)
        since, end = t_kill, None
        if kind == "reload":
            client = http_client(server, 120.0)
            try:
                unload(server, client)
                client.load_model(MODEL)
                wait_for(f"{server.label}: {MODEL} ready after load", lambda: client.is_model_ready(MODEL),
                         RECOVER_TIMEOUT)
                infer_ok(client, f"{server.label} after the reload")
                end = time.monotonic()
            finally:
                client.close()
        else:
            if kind == "idle":   # no traffic: does the server replace the stub by itself?
                while time.monotonic() - t_kill < args.idle:
                    poll_new_stub(server, old, t_kill, seen)
                    time.sleep(POLL_PIDS_S)
                since = time.monotonic()
                traffic = Traffic(server, args.client_timeout)
            assert traffic is not None
            end = await_recovery(server, traffic, old, since, t_kill, seen, args.recover_timeout + since - t_kill)
            errors = traffic.failures(t_kill, end if end is not None else time.monotonic())
        disturbed = probe.disturbed()
    finally:
        if traffic is not None:
            traffic.stop()
    new = check_replaced(server, old, seen, t_kill) if end is not None else None
    return Sample(end - since if end is not None else None, disturbed, len(errors), errors[0] if errors else "",
                  seen.get("new_stub")), old, new


# ---- the run ----------------------------------------------------------------------------------
def backoff_text(k: int) -> str:
    """stubhost's backoff before restart k of an instance (RestartPolicy's defaults)."""
    from stubhost.host.instance_spec import RestartPolicy
    p = RestartPolicy()
    return f"{min(p.backoff_s * 2 ** (k - 1), p.max_backoff_s):g} s"


CASES = {"busy": "crash -> serving (busy)", "idle": "crash -> serving (idle)",
         "reload": "crash -> unload+load -> serving"}


def run_all(args: argparse.Namespace, servers: list[bf.ServerUnderTest]) -> tuple[dict, dict]:
    """Every case against every server, interleaved; returns (results, errors) keyed by (label, case)."""
    results: dict[tuple[str, str], list[Sample]] = {}
    errors: dict[tuple[str, str], str] = {}
    crashable = [s for s in servers if not isinstance(s, bf.ExternalServer)]

    def attempt(server: bf.ServerUnderTest, case: str, fn: Any) -> Any:
        if (server.label, case) in errors or (server.label, "reload before a crash") in errors:
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - one failed case is reported, the rest still run
            msg = f"{type(exc).__name__}: {exc}"
            print(f"ERROR {server.label} {case}: {msg}", flush=True)
            errors[(server.label, case)] = msg.splitlines()[0][:160]
            if server.proc is not None and server.proc.poll() is not None:
                print(f"ERROR: {server.label} exited with {server.proc.returncode}:\n{bf.tail(server.log_text())}")
            return None

    for rep in range(args.loads):
        for server in servers if rep % 2 == 0 else servers[::-1]:
            s = attempt(server, "load", lambda srv=server: measure_load(srv, servers, args.client_timeout))
            if s is not None:
                results.setdefault((server.label, "load"), []).append(s)
                print(f"  load {rep + 1}/{args.loads} {server.label:<9} call {s.extra:.3f} s, ready "
                      f"{s.value:.3f} s{'*' if s.disturbed else ''}", flush=True)
    counts = {"busy": args.crashes, "idle": args.idle_crashes, "reload": args.reload_crashes}
    rounds = [(kind, r) for kind, n in counts.items() for r in range(n)]
    for i, (kind, rep) in enumerate(rounds):
        for server in crashable if i % 2 == 0 else crashable[::-1]:
            # a fresh instance per round: stubhost's crash count starts at 0 (and a server that
            # does not restart stubs by itself serves again)
            if not attempt(server, "reload before a crash", lambda srv=server: measure_load(srv, [], args.client_timeout)):
                continue
            crashes = args.crashes_per_load if kind == "busy" else 1
            for k in range(1, crashes + 1):
                case = f"busy#{k}" if kind == "busy" else kind
                got = attempt(server, case, lambda srv=server, kd=kind: measure_crash(srv, servers, args, kd))
                if got is None:
                    break
                s, old, new = got
                results.setdefault((server.label, case), []).append(s)
                seen = f"new stub {new} seen after {s.extra:.3f} s" if s.extra is not None else "no new stub"
                how = (f"serving after {s.value:.3f} s{'*' if s.disturbed else ''}" if s.value is not None else
                       f"NOT serving within {args.recover_timeout:g} s")
                print(f"  crash {kind} {rep + 1}/{counts[kind]}{f' #{k}' if crashes > 1 else ''} {server.label:<9}"
                      f"{how}, {s.failed} failed, stub {old} killed, {seen}"
                      f"{'; first error: ' + s.first_error[:110] if s.first_error else ''}", flush=True)
                time.sleep(args.pause)
                if new is None:
                    break   # nothing serves add_sub until the next round's reload
    for server in crashable:   # stop from a healthy state (untimed)
        attempt(server, "final reload", lambda srv=server: measure_load(srv, [], args.client_timeout))
    return results, errors


def report(results: dict, errors: dict, labels: list[str], args: argparse.Namespace,
           external: tuple[str, ...] = ()) -> None:
    """The table (median, max, failed requests per case and server) and the ratios stubhost / peer."""
    peer = next((lab for lab in labels if lab != "stubhost"), None)
    limit = args.recover_timeout
    cases = [("load", "load call returns"), ("load", "load -> READY")]
    cases += [(f"busy#{k}", CASES["busy"].replace("crash", f"crash #{k}") if args.crashes_per_load > 1
               else CASES["busy"]) for k in range(1, args.crashes_per_load + 1)]
    cases += [("idle", CASES["idle"]), ("reload", CASES["reload"])]
    head = (f"{'case':<33}| {'server':<9}| {'n':>3} | {'median s':>9} | {'max s':>9} | {'failed req':>10} | "
            f"{'new stub s':>10} | notes")
    print(f"\n{head}\n" + "-" * len(head))
    medians: dict[tuple[str, str], float] = {}

    def sec(v: float) -> str:
        return f"{v:.3f}" if v != float("inf") else f">{limit:g}"

    for ci, (case, name) in enumerate(cases):
        for label in labels:
            samples = results.get((label, case), [])
            if not samples:
                why = ("ERR: " + errors[(label, case)][:60] if (label, case) in errors else
                       "not measured (--url: its stubs are not ours to kill)" if label in external and case != "load"
                       else "not measured")
                print(f"{name:<33}| {label:<9}| {0:>3} | {'-':>9} | {'-':>9} | {'-':>10} | {'-':>10} | {why}")
                continue
            vals = [s.extra if ci == 0 else s.value if s.value is not None else float("inf") for s in samples]
            star = "*" if any(s.disturbed for s in samples) else " "
            med = float(np.median(vals))
            medians[(label, name)] = med
            failed = stub = "-"
            notes = []
            if case != "load":
                fails = [s.failed for s in samples]
                failed = f"{int(np.median(fails))} ({max(fails)})" if max(fails) != min(fails) else f"{fails[0]}"
                stubs = [s.extra for s in samples if s.extra is not None]
                stub = f"{np.median(stubs):.3f}" if stubs else "none"
                if label == "stubhost" and case != "reload":   # there, the unload cuts the backoff short
                    notes.append(f"backoff {backoff_text(int(case[5:]) if case.startswith('busy') else 1)}")
                never = sum(s.value is None for s in samples)
                if never:
                    notes.append(f"not serving within {limit:g} s in {never}/{len(samples)}")
            print(f"{name:<33}| {label:<9}| {len(vals):>3} | {sec(med):>8}{star} | {sec(max(vals)):>9} | "
                  f"{failed:>10} | {stub:>10} | {', '.join(notes) or '-'}")
    print("(median and max over repetitions, s; >T: not serving again within --recover-timeout T s;\n"
          " failed req: median (max) of requests that failed between the kill and serving again (or T);\n"
          " new stub s: kill -> a new stub pid seen (20 ms polling). busy: the kill -> the first correct answer to\n"
          f" a request sent after it; idle: the first request, sent {args.idle:g} s after the kill -> its first correct\n"
          " answer; unload+load: the kill, then at once unload + load + one request -> its answer;\n"
          " * = disturbed by other processes)")
    first: dict[tuple[str, str], str] = {}
    for (label, case), samples in results.items():
        for s in samples:
            if s.first_error and (label, case) not in first:
                first[(label, case)] = s.first_error
    for (label, case), text in sorted(first.items()):
        print(f"first error seen by a request, {label} {case}: {text[:300]}")
    if peer:
        print()
        for _, name in cases:
            a, b = medians.get(("stubhost", name)), medians.get((peer, name))
            if a and b and a != float("inf") and b != float("inf"):
                print(f"ratio {name} stubhost / {peer} = {a / b:.2f}  (medians; lower is better for stubhost)")
            elif b == float("inf") and a and a != float("inf"):
                print(f"ratio {name} stubhost / {peer} < {a / limit:.2g}  ({peer} did not serve again within "
                      f"{limit:g} s: it does not replace a dead stub by itself)")
            else:
                print(f"ratio {name} stubhost / {peer} = n/a")


def shm_entries(prefixes: tuple[str, ...]) -> set[str]:
    """Names in /dev/shm with one of these prefixes."""
    return {n for n in os.listdir(bf.SHM_DIR) if n.startswith(prefixes)}


def parse_args() -> argparse.Namespace:
    """The command line, with the --quick defaults filled in."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 loads, 2 busy crashes, 1 idle crash")
    ap.add_argument("--loads", type=int, help="load -> READY repetitions per server (default 10, quick 3)")
    ap.add_argument("--crashes", type=int, help="busy crash rounds per server (default 5, quick 2)")
    ap.add_argument("--idle-crashes", type=int, help="idle crash rounds per server (default 2, quick 1)")
    ap.add_argument("--crashes-per-load", type=int, default=1, help="busy crashes per freshly loaded instance "
                    "(default 1; stubhost's backoff doubles with each, and the 6th in 60 s is fatal)")
    ap.add_argument("--pause", type=float, default=1.0, help="s between two crashes (default 1)")
    ap.add_argument("--idle", type=float, default=2.0, help="s without requests after an idle crash (default 2)")
    ap.add_argument("--reload-crashes", type=int, help="crash + unload/load rounds per server (default 3, quick 1)")
    ap.add_argument("--recover-timeout", type=float, help="s to wait for a crashed model to serve again by itself "
                    "(default 10, quick 5)")
    ap.add_argument("--client-timeout", type=float, default=5.0, help="s per infer request (default 5)")
    ap.add_argument("--with-triton", action="store_true", help="also measure the real Triton 2.51 Python backend "
                    "from the peer scripts, interleaved")
    ap.add_argument("--triton-peer", type=Path, default=bf.DEFAULT_PEER, help=f"default {bf.DEFAULT_PEER}")
    ap.add_argument("--url", metavar="HOST:PORT", help="also measure this running KServe v2 server (HTTP, explicit "
                    "model control, serving add_sub and identity): load -> READY only")
    ap.add_argument("--peer-label", default="peer", help="column label of the --url server (default peer)")
    args = ap.parse_args()
    args.loads = args.loads if args.loads is not None else (3 if args.quick else 10)
    args.crashes = args.crashes if args.crashes is not None else (2 if args.quick else 5)
    args.idle_crashes = args.idle_crashes if args.idle_crashes is not None else (1 if args.quick else 2)
    args.reload_crashes = args.reload_crashes if args.reload_crashes is not None else (1 if args.quick else 3)
    args.recover_timeout = args.recover_timeout or (5.0 if args.quick else 10.0)
    if not 1 <= args.crashes_per_load <= 5:
        ap.error("--crashes-per-load must be 1..5 (the 6th crash within 60 s leaves a stubhost instance FAILED)")
    return args


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, bf._on_sigterm)
    bf.machine_facts()
    from importlib.metadata import version
    print(f"tritonclient {version('tritonclient')}; model {MODEL} (1 instance, KIND_CPU) over HTTP; "
          f"{args.loads} loads; crash rounds: {args.crashes} busy x {args.crashes_per_load}, {args.idle_crashes} idle, "
          f"{args.reload_crashes} unload+load; pause {args.pause:g} s, idle {args.idle:g} s, recover timeout "
          f"{args.recover_timeout:g} s, client timeout {args.client_timeout:g} s")
    print(f"stubhost: a fresh instance per crash round; busy crash #k waits the backoff 0.1 s * 2^(k-1) "
          f"({', '.join(backoff_text(k) for k in range(1, args.crashes_per_load + 1))})")
    shm_before = shm_entries(("stubhost_", "triton_python_backend_shm_region"))
    started = time.perf_counter()
    failed = False
    servers: list[bf.ServerUnderTest] = []
    with tempfile.TemporaryDirectory(prefix="bench_restart_") as tmp:
        repo = bf.build_repository(Path(tmp))
        try:
            stubhost = bf.StubhostServer(repo, EXPLICIT)
            servers.append(stubhost)
            took = stubhost.start()
            print(f"stubhost serve pid {stubhost.proc.pid}: http {stubhost.http_url}, ready after {took:.2f} s")
            if args.url:
                other = bf.ExternalServer(args.peer_label, args.url, "")
                print(f"{other.label} at http {args.url}: ready after {other.start():.2f} s (crash cases skipped: "
                      "its stubs are not ours to kill)")
                servers.append(other)
            elif args.with_triton:
                why = bf.TritonServer.unavailable(args.triton_peer)
                if why is None:
                    triton = bf.TritonServer(args.triton_peer, repo, Path(tmp), EXPLICIT)
                    try:
                        print(f"triton peer: {triton.setup(300)}")
                        servers.append(triton)
                        took = triton.start()
                        print(f"tritonserver {triton.version} pid {triton.proc.pid}: http {triton.http_url}, "
                              f"ready after {took:.2f} s")
                    except bf.BenchError as exc:
                        if triton in servers:
                            servers.remove(triton)
                        print(f"Triton columns skipped: the peer could not be started: {exc}")
                        failed = True
                else:
                    print(f"Triton columns skipped: {why}")
            else:
                print("Triton columns skipped: run with --with-triton to measure the real Triton 2.51 "
                      "Python backend side by side")
            results, errors = run_all(args, servers)
            report(results, errors, [s.label for s in servers], args,
                   tuple(s.label for s in servers if isinstance(s, bf.ExternalServer)))
            failed = failed or bool(errors)
        except bf.BenchError as exc:
            print(f"ERROR: {exc}")
            failed = True
        finally:
            for server in servers:
                if isinstance(server, bf.ExternalServer):
                    print(f"{server.label}: not ours, left running")
                    continue
                code = server.stop()
                extra = ""
                if isinstance(server, bf.StubhostServer):
                    lines = [ln for ln in server.suspicious_log_lines() if "not healthy" not in ln]
                    extra = f"; {len(lines)} warning/error lines in its log besides the crashes"
                    for ln in lines[:10]:
                        print(f"    | {ln}")
                print(f"{server.label} stopped with SIGTERM: exit code {code}{extra}")
                ours = isinstance(server, bf.StubhostServer)
                for problem in server.problems:   # the peer's hygiene after crashes is a finding, not a failure
                    print(f"{'ERROR' if ours else 'note'}: {server.label}: {problem}")
                    failed = failed or ours
                if isinstance(server, bf.TritonServer):   # regions of the stubs we killed: ours to remove
                    for ln in server.log_text().splitlines():
                        if "failed to stop server" in ln or "Exit timeout" in ln:
                            print(f"note: {server.label} log: {ln.strip()[:200]}")
                    for region in server.segments():   # every stub's region it had, still in /dev/shm
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(bf.SHM_DIR, region))
                            print(f"note: removed {region}, left by {server.label}")
    left = sorted(shm_entries(("stubhost_", "triton_python_backend_shm_region")) - shm_before)
    ours = [n for n in left if any(s.proc is not None and n.startswith(f"stubhost_{s.proc.pid}_") for s in servers)]
    if ours:
        print(f"ERROR: /dev/shm entries left by this run: {ours}")
        failed = True
    if set(left) - set(ours):
        print(f"note: new /dev/shm entries not named after our servers (another run?): {sorted(set(left) - set(ours))}")
    alive = [p for p in sorted(STUBS_SEEN) if bf._is_zombie(p) is False]
    if alive:
        print(f"ERROR: stub processes still running: {alive}")
        failed = True
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
