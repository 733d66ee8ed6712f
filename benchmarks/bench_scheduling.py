#!/usr/bin/env python3
"""Throughput of add_sub under concurrency, with 1 and 2 instances, with and without dynamic
batching, measured by perf_analyzer against `stubhost serve` and, in the same run, Triton 2.51's
Python backend (--with-triton) or any KServe v2 server given by URL (issue: scheduling).

The repository (a temp dir) holds four variants of the example add_sub, the same model file:

  add_sub        max_batch_size 0, 1 instance (the example as it is)
  add_sub_i2     max_batch_size 0, 2 instances
  add_sub_db     max_batch_size 8, 1 instance, dynamic_batching {} (no queue delay)
  add_sub_i2_db  max_batch_size 8, 2 instances, dynamic_batching {}

plus the `identity` model bench_frontends.py uses (its server classes wait for it). perf_analyzer
2.51 (from the Triton peer scripts, ../shared/peers/triton/setup.sh) drives each (server,
variant, concurrency) point over gRPC (--protocol http for HTTP) with 4-element FP32 inputs
(batch 1 for the batching variants), `--concurrency-range c:c`, a --window ms measurement
interval, stability 50 % over at most 10 trials; the servers are measured interleaved, point by
point. Reported: inferences/s and the p99 latency perf_analyzer printed (its CSV), and per point
the ratio stubhost / peer of each.

Bar (the issue's): stubhost's throughput >= the peer's at every concurrency, and its p99 at c=16
no worse. On a 2-core machine perf_analyzer, the server and its stubs share the cores: compare the
ratios of one run, not absolute figures across runs.

--with-ceiling adds a third server, fixed_answer_server.py: the same front-end stack (grpcio's
asyncio server, uvicorn's Server with stubhost's HTTP protocol, uvloop) answering every call with
a prepared response and running no model. Its figures are the most any server on that stack can reach here; the ratio
peer / ceiling above 1 means the bar cannot be met without another front-end stack.

Usage: python3 benchmarks/bench_scheduling.py [--with-triton | --url H:P --grpc-url H:P] [--with-ceiling]
       [--concurrency 1,4,16,64] [--window MS] [--protocol grpc|http] [--models a,b] [--quick]
--quick: concurrency 1,16, a 1000 ms window, add_sub and add_sub_i2_db only.
Exit status: 0; 1 with --check when the bar fails; 2 when perf_analyzer or a server failed.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_frontends as bf  # noqa: E402  (the server classes, the repository, the peer)

VARIANTS = {
    "add_sub": (0, 1, False),
    "add_sub_i2": (0, 2, False),
    "add_sub_db": (8, 1, True),
    "add_sub_i2_db": (8, 2, True),
}
PA_TIMEOUT_S = 180


def variant_config(name: str, max_batch: int, count: int, batching: bool) -> str:
    """add_sub's config.pbtxt for one variant."""
    text = (bf.EXAMPLES / "add_sub" / "config.pbtxt").read_text()
    text = text.replace('name: "add_sub"', f'name: "{name}"')
    text = re.sub(r"max_batch_size: \d+", f"max_batch_size: {max_batch}", text)
    text = re.sub(r"count: \d+", f"count: {count}", text)
    if batching:
        text += "\ndynamic_batching { }\n"
    return text


def build_repository(root: Path) -> Path:
    """bench_frontends' repository plus the add_sub variants."""
    repo = bf.build_repository(root)
    for name, (max_batch, count, batching) in VARIANTS.items():
        if name == "add_sub":
            continue
        shutil.copytree(repo / "add_sub", repo / name)
        (repo / name / "config.pbtxt").write_text(variant_config(name, max_batch, count, batching))
    return repo


class FixedAnswerServer(bf.ServerUnderTest):
    """fixed_answer_server.py on the same repository: the ceiling of stubhost's front-end stack."""

    label = "ceiling"

    def __init__(self, repo: Path) -> None:
        super().__init__()
        self.repo = repo
        self.log: list[str] = []

    def log_text(self) -> str:
        if self.proc is not None and self.proc.stdout is not None and self.proc.poll() is not None:
            self.log.append(self.proc.stdout.read())
        return "".join(self.log)

    def start(self) -> float:
        http, grpc = bf.free_ports(2)
        self.http_url, self.grpc_url = f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"
        t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fixed_answer_server.py")),
                                      str(self.repo), str(http), str(grpc)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return self.wait_ready(list(VARIANTS), t0 + bf.START_TIMEOUT)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        self._terminate()
        return self.proc.returncode


def peer_perf_analyzer(peer: Path) -> tuple[str, str]:
    """(perf_analyzer path, its library dir) from the peer's env.sh (setup.sh must have run)."""
    env_sh = Path(os.environ.get("PEER_DIR", "/tmp/peer")) / "env.sh"
    if not env_sh.is_file():
        done = subprocess.run(["bash", str(peer / "setup.sh")], capture_output=True, text=True, timeout=900,
                              stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0 or not env_sh.is_file():
            raise bf.BenchError(f"the peer's setup.sh failed:\n{bf.tail(done.stdout + done.stderr)}")
    out = subprocess.run(["bash", "-c", 'source "$1" && printf "%s\\n%s" "$PEER_PERF_ANALYZER" "$PEER_PA_LIBS"',
                          "_", str(env_sh)], capture_output=True, text=True, check=True).stdout.split("\n")
    if not out or not out[0] or not os.access(out[0], os.X_OK):
        raise bf.BenchError("perf_analyzer is not available from the peer scripts (see their setup.sh output)")
    return out[0], out[1] if len(out) > 1 else ""


def run_pa(pa: tuple[str, str], url: str, protocol: str, model: str, conc: int, window_ms: int,
           workdir: Path) -> dict[str, float]:
    """One perf_analyzer point: inferences/s and p50/p99 latency in µs."""
    csv_path = workdir / f"pa_{model}_{conc}_{time.monotonic_ns()}.csv"
    cmd = [pa[0], "-u", url, "-i", protocol, "-m", model, "--shape", "INPUT0:4", "--shape", "INPUT1:4",
           "--concurrency-range", f"{conc}:{conc}", "--measurement-interval", str(window_ms),
           "--stability-percentage", "50", "--max-trials", "10", "-f", str(csv_path)]
    env = dict(os.environ)
    if pa[1]:
        env["LD_LIBRARY_PATH"] = pa[1]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PA_TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise bf.BenchError(f"perf_analyzer on {model} c={conc} did not finish in {PA_TIMEOUT_S} s") from None
    if done.returncode != 0 or not csv_path.is_file():
        raise bf.BenchError(f"perf_analyzer on {model} c={conc} failed ({done.returncode}):\n"
                            f"{bf.tail(done.stdout + done.stderr, 15)}")
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    return {"rps": float(row["Inferences/Second"]), "p50": float(row["p50 latency"]),
            "p99": float(row["p99 latency"])}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--with-triton", action="store_true", help="start Triton 2.51 from the peer scripts")
    ap.add_argument("--url", help="another KServe v2 server's HTTP host:port (serving the same models)")
    ap.add_argument("--grpc-url", help="its gRPC host:port")
    ap.add_argument("--peer-label", default="other")
    ap.add_argument("--with-ceiling", action="store_true",
                    help="also measure fixed_answer_server.py: the same front-end stack running no model")
    ap.add_argument("--triton-peer", type=Path, default=bf.DEFAULT_PEER)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--window", type=int, default=3000, help="perf_analyzer measurement interval, ms")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    ap.add_argument("--models", default=",".join(VARIANTS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true", help="exit 1 when the bar fails")
    args = ap.parse_args()
    if args.quick:
        args.concurrency, args.window, args.models = "1,16", 1000, "add_sub,add_sub_i2_db"
    unknown = set(args.models.split(",")) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown model(s) {sorted(unknown)}; choose from {list(VARIANTS)}")
    return args


def report(results: dict, servers: list, models: list[str], concs: list[int]) -> bool:
    """Prints the table and the ratios; True when the bar holds (or there is no peer)."""
    labels = [s.label for s in servers]
    peer = next((lab for lab in labels[1:] if lab != FixedAnswerServer.label), None)
    head = f"{'model':<15}{'c':>4}" + "".join(f"{lab + ' inf/s':>16}{lab + ' p99 us':>16}" for lab in labels)
    if peer:
        head += f"{'inf/s ratio':>13}{'p99 ratio':>11}"
    print("\n" + head)
    ok = True
    for model in models:
        for conc in concs:
            line = f"{model:<15}{conc:>4}"
            for lab in labels:
                r = results.get((lab, model, conc))
                line += f"{r['rps']:>16.0f}{r['p99']:>16.0f}" if r else f"{'failed':>16}{'':>16}"
            if peer:
                a, b = results.get(("stubhost", model, conc)), results.get((peer, model, conc))
                if a and b:
                    rps_ratio, p99_ratio = a["rps"] / b["rps"], a["p99"] / b["p99"]
                    line += f"{rps_ratio:>13.2f}{p99_ratio:>11.2f}"
                    ok = ok and rps_ratio >= 1.0 and (conc != 16 or p99_ratio <= 1.0)
                else:
                    ok = False
            print(line)
    if peer:
        print(f"\nbar: stubhost inf/s >= {peer} at every point, p99 at c=16 <= {peer}'s: "
              f"{'PASS' if ok else 'FAIL'} (ratios are stubhost / {peer})")
    ceiling = FixedAnswerServer.label
    if ceiling in labels:
        for other in [lab for lab in labels if lab != ceiling]:
            shares = [results[(other, m, c)]["rps"] / results[(ceiling, m, c)]["rps"] for m in models for c in concs
                      if (other, m, c) in results and (ceiling, m, c) in results]
            if shares:
                print(f"{other} inf/s / {ceiling} inf/s: {min(shares):.2f} .. {max(shares):.2f} "
                      f"(above 1: faster than the stack stubhost's front end runs on can ever be)")
    return ok


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, bf._on_sigterm)
    concs = [int(c) for c in args.concurrency.split(",")]
    models = args.models.split(",")
    bf.machine_facts()
    pa = peer_perf_analyzer(args.triton_peer)
    print(f"perf_analyzer {pa[0]}; protocol {args.protocol}; window {args.window} ms; concurrency {concs}")
    servers: list[bf.ServerUnderTest] = []
    results: dict[tuple[str, str, int], dict[str, float]] = {}
    failed = False
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench_scheduling_") as tmp:
        repo = build_repository(Path(tmp))
        try:
            stubhost = bf.StubhostServer(repo)
            servers.append(stubhost)
            print(f"stubhost ready after {stubhost.start():.2f} s")
            if args.url:
                other = bf.ExternalServer(args.peer_label, args.url, args.grpc_url or "")
                print(f"{other.label} ready after {other.start():.2f} s")
                servers.append(other)
            elif args.with_triton:
                why = bf.TritonServer.unavailable(args.triton_peer)
                if why is None:
                    triton = bf.TritonServer(args.triton_peer, repo, Path(tmp))
                    print(f"triton peer: {triton.setup(900)}")
                    servers.append(triton)
                    took = triton.start()
                    print(f"tritonserver {triton.version} ready after {took:.2f} s")
                else:
                    print(f"Triton columns skipped: {why}")
            if args.with_ceiling:
                ceiling = FixedAnswerServer(repo)
                servers.append(ceiling)
                print(f"fixed-answer server ready after {ceiling.start():.2f} s")
            for model in models:
                for conc in concs:
                    order = servers if (concs.index(conc) + models.index(model)) % 2 == 0 else servers[::-1]
                    for server in order:
                        url = server.grpc_url if args.protocol == "grpc" else server.http_url
                        try:
                            results[(server.label, model, conc)] = run_pa(pa, url, args.protocol, model, conc,
                                                                          args.window, Path(tmp))
                        except bf.BenchError as exc:
                            print(f"ERROR: {server.label} {model} c={conc}: {exc}")
                            failed = True
                        r = results.get((server.label, model, conc))
                        if r:
                            print(f"  {server.label:<9}{model:<15}c={conc:<4}{r['rps']:>9.0f} inf/s  "
                                  f"p50 {r['p50']:>7.0f} us  p99 {r['p99']:>7.0f} us", flush=True)
            ok = report(results, servers, models, concs)
        except bf.BenchError as exc:
            print(f"ERROR: {exc}")
            failed = True
        finally:
            for server in servers:
                code = server.stop()
                print(f"{server.label} stopped: exit code {code}")
                for problem in server.problems:
                    print(f"ERROR: {server.label}: {problem}")
                    failed = True
    if failed:
        return 2
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
