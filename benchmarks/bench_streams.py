#!/usr/bin/env python3
"""BLS calls and decoupled streams through stubhost, against a direct in-process infer (issue 5).

Measured in one run, on the same machine, cases interleaved across runs:
  a. direct: server.infer("add_sub", 4 x FP32) through the in-process API, sequential (the
     stub round trip every other figure is compared with).
  b. BLS call: inside a model's execute, pb_utils.InferenceRequest(model_name="add_sub",
     ...).exec(), timed by the calling model around each exec() (model -> parent -> add_sub's
     stub -> parent -> model). Bar: (b) <= 2.0 x (a), medians. Also, without a bar, the same
     call to "add_sub_pair", add_sub with two instances (so its requests go through a queue).
  c. decoupled stream of 100 responses from the example model "repeat" (one response per
     element of IN, sent from a worker thread): time to first response, and the cost per
     response after the first ((last - first) / 99). Bar: per response <= 2.0 x (a).
Usage: python3 benchmarks/bench_streams.py [--quick] [--runs N] [--check]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py, when run as a script
from _common import fmt, machine_facts, measured, summarize_runs, time_series  # noqa: E402

import stubhost  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
BAR_BLS = 2.0       # BLS call / direct infer
BAR_STREAM = 2.0    # per streamed response / direct infer
DISTURBED = 0.05
STREAM_LENGTH = 100

BLS_LOOP_PY = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            calls = int(pb_utils.get_input_tensor_by_name(request, "CALLS").as_numpy()[0])
            x = np.arange(4, dtype=np.float32)
            inputs = [pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]
            times = np.empty(calls, dtype=np.int64)
            clock = time.perf_counter_ns
            for i in range(calls):
                t0 = clock()
                response = pb_utils.InferenceRequest(model_name="add_sub", inputs=inputs,
                                                     requested_output_names=["OUTPUT0", "OUTPUT1"]).exec()
                times[i] = clock() - t0
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("NS", times)]))
        return responses
'''

BLS_LOOP_CONFIG = '''
name: "bls_loop"
backend: "python"
max_batch_size: 0
input [{ name: "CALLS" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "NS" data_type: TYPE_INT64 dims: [ -1 ] }]
'''


def make_repository(root: Path) -> Path:
    repo = root / "models"
    for name in ("add_sub", "repeat"):
        shutil.copytree(EXAMPLES / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "add_sub", repo / "add_sub_pair")
    pair_config = (repo / "add_sub" / "config.pbtxt").read_text().replace('name: "add_sub"', 'name: "add_sub_pair"')
    (repo / "add_sub_pair" / "config.pbtxt").write_text(pair_config + "\ninstance_group [{ count: 2, kind: KIND_CPU }]\n")
    for loop, target in (("bls_loop", "add_sub"), ("bls_pair", "add_sub_pair")):
        (repo / loop / "1").mkdir(parents=True)
        (repo / loop / "config.pbtxt").write_text(textwrap.dedent(BLS_LOOP_CONFIG).replace("bls_loop", loop))
        (repo / loop / "1" / "model.py").write_text(textwrap.dedent(BLS_LOOP_PY).replace('"add_sub"', f'"{target}"'))
    return repo


def direct(server: stubhost.Server, iterations: int, warmup_s: float) -> np.ndarray:
    x = np.arange(4, dtype=np.float32)
    inputs = {"INPUT0": x, "INPUT1": x}
    return time_series(lambda i: server.infer("add_sub", inputs), iterations, warmup_s, 30.0, no_gc=True)


def bls(server: stubhost.Server, iterations: int, loop: str = "bls_loop") -> np.ndarray:
    server.infer(loop, {"CALLS": np.array([200], np.int32)})  # warm-up
    samples = server.infer(loop, {"CALLS": np.array([iterations], np.int32)}, timeout=120)["NS"]
    return np.asarray(samples, dtype=np.int64).copy()


def stream(server: stubhost.Server, streams: int) -> tuple[np.ndarray, np.ndarray]:
    """(time to first response, per-response cost after the first), ns, one sample per stream."""
    values = np.arange(STREAM_LENGTH, dtype=np.int32)
    first, per = [], []
    for k in range(streams + 3):
        t0 = time.perf_counter_ns()
        it = server.stream("repeat", {"IN": values})
        next(it)
        t1 = time.perf_counter_ns()
        count = 1 + sum(1 for _ in it)
        t2 = time.perf_counter_ns()
        if count != STREAM_LENGTH:
            raise RuntimeError(f"stream gave {count} responses, expected {STREAM_LENGTH}")
        if k >= 3:  # the first streams warm up
            first.append(t1 - t0)
            per.append((t2 - t1) / (STREAM_LENGTH - 1))
    return np.asarray(first, dtype=np.int64), np.asarray(per, dtype=np.int64)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--check", action="store_true", help="exit 1 when a bar is missed")
    args = parser.parse_args()
    runs = args.runs or (2 if args.quick else 3)
    iterations = 2000 if args.quick else 20000
    streams = 20 if args.quick else 100
    machine_facts()
    print(f"stubhost {stubhost.__version__}; {runs} run(s); {iterations} direct/BLS calls and {streams} "
          f"streams of {STREAM_LENGTH} per run\n")
    results: dict[str, list[tuple[np.ndarray, bool]]] = {"direct": [], "bls": [], "bls_pair": [], "first": [],
                                                         "per": []}
    with tempfile.TemporaryDirectory(prefix="bench_streams_") as tmp:
        repo = make_repository(Path(tmp))
        for _ in range(runs):
            with stubhost.Server(repo) as server:
                samples, load = measured(direct, server, iterations, 1.0)
                results["direct"].append((samples, load >= DISTURBED))
                samples, load = measured(bls, server, iterations)
                results["bls"].append((samples, load >= DISTURBED))
                samples, load = measured(bls, server, iterations, "bls_pair")
                results["bls_pair"].append((samples, load >= DISTURBED))
                (first, per), load = measured(stream, server, streams)
                results["first"].append((first, load >= DISTURBED))
                results["per"].append((per, load >= DISTURBED))
    rows = [("direct", "direct infer add_sub (in-process)"), ("bls", "BLS exec() add_sub, from a model"),
            ("bls_pair", "BLS exec() add_sub with 2 instances"),
            ("first", f"stream of {STREAM_LENGTH}: first response"), ("per", "stream: per response after the first")]
    medians = {}
    print(f"{'case':44} {'unit':>4} {'median':>9} {'p99':>9}   per run")
    for key, label in rows:
        _, median, p99, _, per_run = summarize_runs(results[key], 1e3)
        medians[key] = median
        print(f"{label:44} {'µs':>4} {fmt(median):>9} {fmt(p99):>9}   {per_run}")
    bls_ratio = medians["bls"] / medians["direct"]
    stream_ratio = medians["per"] / medians["direct"]
    print()
    print(f"BLS call / direct infer        = {bls_ratio:.2f} (bar <= {BAR_BLS}: {'PASS' if bls_ratio <= BAR_BLS else 'FAIL'})")
    print(f"per streamed response / direct = {stream_ratio:.2f} (bar <= {BAR_STREAM}: "
          f"{'PASS' if stream_ratio <= BAR_STREAM else 'FAIL'})")
    print("(* marks a run during which other processes used >= 5% of a core)")
    ok = bls_ratio <= BAR_BLS and stream_ratio <= BAR_STREAM
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
