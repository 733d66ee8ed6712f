"""The main job for now: ``python -m stubhost.demo [--model-repository examples/models]``.

Loads the example model repository through the in-process API (every model instance in its own
stub process), sends each model a request, times add_sub round trips, closes the server and
checks that no shared-memory segment is left. Issue 4 adds ``stubhost serve``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from stubhost import InferenceError, Server

SAMPLES: dict[str, dict[str, Any]] = {
    "add_sub": {"INPUT0": np.array([1, 2, 3, 4], np.float32), "INPUT1": np.array([10, 20, 30, 40], np.float32)},
    "identity": {"INPUT0": np.linspace(0, 1, 5, dtype=np.float32)},
    "string_upper": {"INPUT0": np.array([b"hello", "wörld".encode()], dtype=object)},
    "optional_inputs": {"INPUT0": np.array([1, 2], np.float32)},
    "auto_complete": {"INPUT0": np.array([1, 2, 3], np.int32)},
}


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"stubhost_{os.getpid()}_")}


def _brief(array: np.ndarray) -> str:
    return np.array2string(array, threshold=8, max_line_width=60).replace("\n", " ")


def run(repository: str, iterations: int) -> int:
    """Runs the demo and prints one line per step; returns the process exit code."""
    rows: list[tuple[str, str]] = []
    ok = True
    start = time.perf_counter()
    with Server(model_repository=repository) as server:
        rows.append(("load -> READY", f"{len(server.models())} models in {time.perf_counter() - start:.2f} s "
                                      f"({', '.join(server.models())}); ready={server.ready()}"))
        for name in server.models():
            sample = SAMPLES.get(name)
            if sample is None:
                rows.append((f"infer {name}", "no sample input; skipped"))
                continue
            try:
                out = server.infer(name, sample)
                rows.append((f"infer {name}", "; ".join(f"{k}={_brief(v)}" for k, v in sorted(out.items()))))
            except InferenceError as e:
                ok = False
                rows.append((f"infer {name}", f"FAILED {e.code}: {e.message}"))
        if "add_sub" in server.models():
            a = SAMPLES["add_sub"]
            for _ in range(min(500, iterations)):
                server.infer("add_sub", a)
            times = []
            for _ in range(iterations):
                t0 = time.perf_counter_ns()
                server.infer("add_sub", a)
                times.append(time.perf_counter_ns() - t0)
            median, p99 = np.percentile(np.array(times) / 1e3, [50, 99])
            rows.append((f"add_sub round trip (n={iterations})", f"median {median:.1f} us, p99 {p99:.1f} us"))
    left = _segments()
    rows.append(("close", "stubs finalized; /dev/shm " + ("clean" if not left else f"LEAKED {sorted(left)}")))
    width = max(len(step) for step, _ in rows)
    print(f"{'step'.ljust(width)}  result")
    for step, result in rows:
        print(f"{step.ljust(width)}  {result}")
    return 0 if ok and not left else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m stubhost.demo``."""
    parser = argparse.ArgumentParser(prog="python -m stubhost.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model-repository", default="examples/models", help="Triton model repository")
    parser.add_argument("--iterations", type=int, default=2000, help="add_sub round trips to time")
    args = parser.parse_args(argv)
    return run(args.model_repository, args.iterations)


if __name__ == "__main__":
    sys.exit(main())
