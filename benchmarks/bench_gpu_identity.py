"""64 MiB GPU identity through stubhost with input and output in a client's CUDA shared-memory
regions, against one 64 MiB device-to-device copy in the same run (ARCHITECTURE §6, issue 7).

The model gets its input as a GPU tensor (FORCE_CPU_ONLY_INPUT_TENSORS "no") in the client's
region and returns it as is; the stub copies it into the output region device to device. The
tracked ratio is identity / copy (bar: <= 1.5). Without a usable GPU it prints why and exits 0.

    python benchmarks/bench_gpu_identity.py [--iterations 50] [--mib 64]
"""

from __future__ import annotations

import argparse
import base64
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor.from_dlpack(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").to_dlpack())]) for r in requests]
"""

CONFIG = """
name: "gpu_identity"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_UINT8 dims: [ {n} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ {n} ] }} ]
parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: {{ string_value: "no" }} }}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()

    from stubhost.gpu import cuda

    reason = cuda.unavailable_reason()
    if reason is not None:
        print(f"SKIPPED: needs a CUDA GPU: {reason}")
        return 0
    import tritonclient.grpc as grpcclient

    rt = cuda.runtime()
    nbytes = args.mib << 20
    src, dst, scratch = rt.malloc(nbytes, 0), rt.malloc(nbytes, 0), rt.malloc(nbytes, 0)
    repo = Path(tempfile.mkdtemp(prefix="stubhost-bench-gpu-"))
    (repo / "gpu_identity" / "1").mkdir(parents=True)
    (repo / "gpu_identity" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    (repo / "gpu_identity" / "config.pbtxt").write_text(CONFIG.format(n=nbytes))
    grpc_port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "stubhost", "serve", "--model-repository", str(repo),
                               "--grpc-port", str(grpc_port), "--http-port", str(free_port()),
                               "--metrics-port", str(free_port())],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        deadline = time.monotonic() + 120
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("ERROR: stubhost serve did not become ready")
                return 2
            time.sleep(0.2)
        pattern = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)
        rt.copy(src, pattern.ctypes.data, nbytes, 0)
        client.register_cuda_shared_memory("in", base64.b64encode(rt.ipc_handle(src, 0)), 0, nbytes)
        client.register_cuda_shared_memory("out", base64.b64encode(rt.ipc_handle(dst, 0)), 0, nbytes)
        x = grpcclient.InferInput("INPUT0", [nbytes], "UINT8")
        x.set_shared_memory("in", nbytes)
        y = grpcclient.InferRequestedOutput("OUTPUT0")
        y.set_shared_memory("out", nbytes)

        def identity() -> None:
            client.infer("gpu_identity", [x], outputs=[y])

        def copy() -> None:
            rt.copy(scratch, src, nbytes, 0)

        timings: dict[str, list[float]] = {"identity": [], "d2d copy": []}
        for _ in range(3):
            identity()
            copy()
        for _ in range(args.iterations):
            for name, fn in (("identity", identity), ("d2d copy", copy)):
                t0 = time.perf_counter()
                fn()
                timings[name].append(time.perf_counter() - t0)
        check = np.empty(nbytes, dtype=np.uint8)
        rt.copy(check.ctypes.data, dst, nbytes, 0)
        if not np.array_equal(check, pattern):
            print("ERROR: the output region does not hold the input")
            return 2
        client.unregister_cuda_shared_memory()
        client.close()
    finally:
        server.terminate()
        server.wait(30)
        for ptr in (src, dst, scratch):
            rt.free(ptr, 0)
        shutil.rmtree(repo, ignore_errors=True)

    print(f"{args.mib} MiB, {args.iterations} iterations each, device 0")
    print(f"{'case':<12}{'median us':>12}{'p90 us':>12}")
    for name, samples in timings.items():
        p90 = sorted(samples)[int(0.9 * (len(samples) - 1))] * 1e6
        print(f"{name:<12}{median_us(samples):>12.0f}{p90:>12.0f}")
    ratio = median_us(timings["identity"]) / median_us(timings["d2d copy"])
    print(f"\nratio identity / d2d copy: {ratio:.2f} (bar <= 1.5): {'MET' if ratio <= 1.5 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
