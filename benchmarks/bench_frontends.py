#!/usr/bin/env python3
"""`stubhost serve` through its KServe v2 front ends, from tritonclient (ARCHITECTURE §6), optionally
side by side with the real Triton 2.51 Python backend on the same model files.

The script builds a model repository in a temp dir (add_sub copied from examples/models, and an
`identity` FP32 dims [-1] model whose execute returns its input tensor as OUTPUT0), starts
`python -m stubhost serve` on 127.0.0.1 (ports picked by the OS, read from its log), waits until
it and both models are ready, measures, then stops it with SIGTERM and checks that it exited
with 0 and left no /dev/shm/stubhost_<pid>_* segment. Measured, in one run, on the same machine,
always from the Python tritonclient (HTTP and gRPC) in this process:

  1. Latency at concurrency 1 (median, p99 of sequential calls): the server-ready round trip on
     each protocol (the protocol floor: no model), and add_sub (INPUT0, INPUT1: 4 x FP32; binary
     tensor data over HTTP, raw contents over gRPC). Only the infer call is timed; outputs are
     checked outside the timed region.
  2. Throughput: add_sub with 1, 4 and 16 worker threads per protocol, each with its own client
     (tritonclient.http clients cannot be shared across OS threads), for --duration s per point:
     requests/s over the whole point, median and p99 of the per-request latencies.
  3. Large tensors: identity on 1, 16 and 64 MiB FP32 (--sizes) with INPUT0 and OUTPUT0 in client
     system shared-memory regions (tritonclient.utils.shared_memory, registered with the server),
     timing the infer call; and, for context, the same sizes without shm (binary data over HTTP,
     raw contents over gRPC). Beside them, one numpy copy of the same size (np.copyto between two
     preallocated, pre-touched arrays), timed right after each shm infer in the same loop, so both
     series see the same machine. Bar (ARCHITECTURE §6 "Large tensors"): identity 64 MiB in shm
     <= 1.5 x one 64 MiB memcpy, medians, on each protocol.
  4. The statistics extension: after the runs, the server's per-request averages for add_sub
     (queue, compute_input, compute_infer, compute_output, in us over every add_sub request of the
     run), and the same breakdown for each case of the last run (deltas read before and after it):
     where the server's time goes, beside what the client saw.

--with-triton: if ../shared/peers/triton/setup.sh exists (next to the repository; --triton-peer
DIR elsewhere), runs it (idempotent: it installs tritonserver 2.51 from the nvidia-pytriton wheel
into $PEER_DIR, default /tmp/peer, the first time), starts tritonserver with the Python backend on
the same temp repository (as the peer's run_peer.sh does: its env.sh, venv first on PATH, the
venv's libpython on LD_LIBRARY_PATH), and runs every measurement against both servers, interleaved
case by case (the order alternates between runs), printing Triton's columns and the ratios
stubhost / Triton. Without the option, or without the peer scripts, the Triton columns are skipped
and the reason is printed.

Each case runs --runs times (fresh clients, regions and arrays each time); figures are medians
over runs of each run's median (p99: median of the runs' p99). A run during which processes other
than this client and the server under test used >= 10% of a core is marked with *: on a busy
machine the ratios measured in the same run hold up better than the absolute figures.

--url HOST:PORT --grpc-url HOST:PORT [--peer-label NAME]: instead of Triton, compare with any
KServe v2 server already running that serves the same add_sub and identity models; it is measured
the same way (interleaved) but never started or stopped, and its CPU use is not known.

Usage: python3 benchmarks/bench_frontends.py [--quick] [--with-triton | --url H:P --grpc-url H:P]
       [--runs N] [--duration S] [--requests N] [--sizes 1M,16M,64M] [--triton-peer DIR] [--check]
--quick: one run, 1 s per point, at most 300 requests per latency case (about 30 s for stubhost
alone, 65-80 s with --with-triton on 2 cores); the defaults (3 runs, 5 s per point, 2000 requests)
take roughly 2-3 minutes per run and server.
Exit status: 0; 1 with --check when the 64 MiB bar fails; 2 when a case or the server failed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common.py, when run as a script
from _common import cpu_seconds, fmt, gc_off, machine_facts, summarize_runs, time_series  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"
DEFAULT_PEER = ROOT.parent / "shared" / "peers" / "triton"
PEER = "triton"  # label of the server compared with stubhost (set from --peer-label with --url)
SHM_DIR = "/dev/shm"
REGION_PREFIX = f"bench_frontend_{os.getpid()}"   # our client regions: /dev/shm/bench_frontend_<pid>_*
BAR = 1.5                     # identity 64 MiB in shm / one 64 MiB memcpy, medians
BAR_SIZE = 64 << 20
DISTURBED = 0.10              # cores used by other processes during a case that mark it *
PROTOCOLS = ("http", "grpc")
CONCURRENCY = (1, 4, 16)
START_TIMEOUT = 120.0         # s for a server to become ready
STOP_TIMEOUT = 30.0           # s for a server to exit after SIGTERM
NET_TIMEOUT = 120.0           # s, per request (64 MiB without shm is slow on a busy box)

IDENTITY_CONFIG = """\
# OUTPUT0 = INPUT0, FP32 of any length (bench_frontends.py).
name: "identity"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
IDENTITY_MODEL = '''\
"""identity: returns its input tensor as OUTPUT0 (bench_frontends.py)."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", in0.as_numpy())]))
        return responses
'''

ADD_A = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
ADD_B = np.array([0.5, -1.5, 2.25, 8.0], dtype=np.float32)


class BenchError(RuntimeError):
    """A server could not be started or stopped, or answered wrongly."""


# ---- configuration ----------------------------------------------------------------------------
@dataclass
class Config:
    """What every case needs: bounds, the tensors (built once), the sizes."""

    runs: int
    duration: float           # s per point (latency cases stop earlier after `requests`)
    requests: int             # timed requests per latency case
    warmup_s: float
    sizes: list[int]
    data: dict[int, np.ndarray] = field(default_factory=dict)  # identity payload per size


def parse_size(text: str) -> int:
    """'4K' -> 4096, '1M' -> 1 MiB, '64M' -> 64 MiB, '16' -> 16 (bytes; a multiple of 4)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    n = int(float(t[:-1] if mult > 1 else t) * mult)
    if n <= 0 or n % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} must be a positive multiple of 4 bytes")
    return n


def size_text(n: int) -> str:
    """64 MiB, 4 KiB, 16 B."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


# ---- the model repository ---------------------------------------------------------------------
def build_repository(root: Path) -> Path:
    """add_sub (copied from examples/models) and identity (written here), in root/models."""
    repo = root / "models"
    src = EXAMPLES / "add_sub"
    if not (src / "config.pbtxt").is_file():
        raise BenchError(f"{src} is missing: run from a stubhost checkout")
    shutil.copytree(src, repo / "add_sub", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "identity" / "1").mkdir(parents=True)
    (repo / "identity" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    (repo / "identity" / "1" / "model.py").write_text(IDENTITY_MODEL)
    return repo


# ---- servers ----------------------------------------------------------------------------------
def process_tree(pid: int) -> list[int]:
    """pid and its live descendants."""
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
    return out


def tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds used by (pid itself, its live descendants with their reaped children)."""
    own, kids, tick = 0, 0, os.sysconf("SC_CLK_TCK")
    for p in process_tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            if p == pid:
                own += int(fields[11]) + int(fields[12])                       # utime stime
            else:
                kids += sum(int(x) for x in fields[11:15])                     # + cutime cstime
    return own / tick, kids / tick


class ServerUnderTest:
    """A KServe v2 server child: its URLs, its log, and how to stop it."""

    label = "?"

    def __init__(self, extra_args: list[str] | None = None) -> None:
        self.proc: subprocess.Popen | None = None
        self.http_url = ""
        self.grpc_url = ""
        self.problems: list[str] = []   # shutdown hygiene findings
        self.extra_args = list(extra_args or [])   # appended to the server's command line

    def is_stub_of(self, argv: list[str], model: str) -> bool:
        """Whether a child's command line is a stub serving `model` (subclasses that start stubs)."""
        return False

    def stub_pids(self, model: str) -> list[int]:
        """Live (not zombie) stub processes of `model` among the server's descendants."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        out = []
        for p in process_tree(self.proc.pid)[1:]:
            with contextlib.suppress(OSError), open(f"/proc/{p}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                if _is_zombie(p) is False and self.is_stub_of(argv, model):
                    out.append(p)
        return out

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds of (the server process, its stubs) so far."""
        return tree_cpu_seconds(self.proc.pid) if self.proc is not None and self.proc.poll() is None else (0.0, 0.0)

    def log_text(self) -> str:
        raise NotImplementedError

    def _terminate(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited after STOP_TIMEOUT s (noted in problems)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.problems.append(f"did not exit within {STOP_TIMEOUT:.0f} s of SIGTERM; killed")
                self.proc.kill()
                self.proc.wait()

    def wait_ready(self, models: list[str], deadline: float) -> float:
        """Polls server and model readiness over HTTP; returns when all are ready (s waited)."""
        import tritonclient.http as httpclient
        t0 = time.monotonic()
        last = "no answer"
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(f"{self.label} exited with {self.proc.returncode} while starting:\n"
                                 f"{tail(self.log_text())}")
            try:
                client = httpclient.InferenceServerClient(self.http_url, connection_timeout=2, network_timeout=5)
                try:
                    if client.is_server_ready() and all(client.is_model_ready(m) for m in models):
                        return time.monotonic() - t0
                    last = "not ready"
                finally:
                    client.close()
            except Exception as exc:  # noqa: BLE001 - not listening yet
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise BenchError(f"{self.label} not ready after {START_TIMEOUT:.0f} s ({last}):\n"
                                 f"{tail(self.log_text())}")
            time.sleep(0.05)


def tail(text: str, lines: int = 30) -> str:
    """The last lines of a log, indented."""
    return textwrap.indent("\n".join(text.splitlines()[-lines:]), "    | ")


class StubhostServer(ServerUnderTest):
    """`python -m stubhost serve` with ports 0; the ports are read from its log."""

    label = "stubhost"
    _STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService) at (\S+):(\d+)")

    def __init__(self, repo: Path, extra_args: list[str] | None = None) -> None:
        super().__init__(extra_args)
        self.repo = repo
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line)
                if m := self._STARTED.search(line):
                    self.ports[m.group(1)] = int(m.group(3))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def log_text(self) -> str:
        with self._cond:
            return "".join(self.lines)

    def start(self) -> float:
        """Starts the server; returns seconds from launch to ready (server and both models)."""
        cmd = [sys.executable, "-m", "stubhost", "serve", "--model-repository", str(self.repo),
               "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
               # metrics on any free port too: another benchmark's server may hold the default 8002
               "--metrics-address", "127.0.0.1", "--metrics-port", "0", *self.extra_args]
        t0 = time.monotonic()
        deadline = t0 + START_TIMEOUT
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        with self._cond:
            while len(self.ports) < 2:
                if self.proc.poll() is not None:
                    raise BenchError(f"stubhost serve exited with {self.proc.returncode} while starting:\n"
                                     f"{tail(''.join(self.lines))}")
                if time.monotonic() > deadline:
                    raise BenchError(f"stubhost serve did not log its ports in {START_TIMEOUT:.0f} s:\n"
                                     f"{tail(''.join(self.lines))}")
                self._cond.wait(0.1)
        self.http_url = f"127.0.0.1:{self.ports['HTTPService']}"
        self.grpc_url = f"127.0.0.1:{self.ports['GRPCInferenceService']}"
        self.wait_ready(["add_sub", "identity"], deadline)
        return time.monotonic() - t0

    def is_stub_of(self, argv: list[str], model: str) -> bool:
        """`python -m stubhost.stub SPEC` whose SPEC (JSON) names an instance <model>_<group>_<n>
        (default group names, as host/model.py gives them)."""
        if len(argv) < 4 or argv[-3:-1] != ["-m", "stubhost.stub"]:
            return False
        with contextlib.suppress(ValueError, AttributeError):
            return re.fullmatch(rf"{re.escape(model)}_\d+_\d+", json.loads(argv[-1]).get("instance", "")) is not None
        return False

    def segments(self) -> list[str]:
        """This server's pool segments in /dev/shm."""
        assert self.proc is not None
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(f"stubhost_{self.proc.pid}_"))

    def stop(self) -> int | None:
        """SIGTERM, wait, check exit code 0 and no segment left (findings go to self.problems)."""
        if self.proc is None:
            return None
        stubs = process_tree(self.proc.pid)[1:]
        self._terminate()
        code = self.proc.returncode
        if self._reader is not None:
            self._reader.join(10)
        if code != 0:
            self.problems.append(f"exit code {code} after SIGTERM (expected 0)")
        time.sleep(0.2)
        alive = [p for p in stubs if os.path.exists(f"/proc/{p}") and _is_zombie(p) is False]
        if alive:
            self.problems.append(f"stub processes still running after exit: {alive}")
        leaked = self.segments()
        if leaked:
            self.problems.append(f"left /dev/shm segments: {leaked}")
        return code

    def suspicious_log_lines(self) -> list[str]:
        """Warnings, errors and tracebacks the server logged."""
        pat = re.compile(r"\b(WARNING|ERROR|CRITICAL|Traceback|Exception)\b")
        return [ln.rstrip() for ln in self.log_text().splitlines() if pat.search(ln)]


def _is_zombie(pid: int) -> bool | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return None


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now (for a server that cannot take port 0)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class TritonServer(ServerUnderTest):
    """tritonserver 2.51 with its Python backend, from the peer scripts in ../shared/peers/triton."""

    label = "triton"

    def __init__(self, peer: Path, repo: Path, workdir: Path, extra_args: list[str] | None = None) -> None:
        super().__init__(extra_args)
        self.peer, self.repo, self.workdir = peer, repo, workdir
        self.log_path = workdir / "tritonserver.log"
        self.version = "?"
        self._stub_regions: list[str] = []

    @staticmethod
    def unavailable(peer: Path) -> str | None:
        """Why the peer cannot be used here, or None."""
        if not (peer / "setup.sh").is_file():
            return f"{peer / 'setup.sh'} not found (the Triton peer scripts live outside the repository)"
        return None

    def setup(self, timeout: float) -> str:
        """Runs the peer's setup.sh (idempotent); returns its last line."""
        t0 = time.monotonic()
        try:
            done = subprocess.run(["bash", str(self.peer / "setup.sh")], capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise BenchError(f"setup.sh did not finish within {timeout:.0f} s") from None
        out = (done.stdout + done.stderr).strip()
        if done.returncode != 0:
            raise BenchError(f"setup.sh failed with {done.returncode}:\n{tail(out)}")
        last = out.splitlines()[-1] if out else "(no output)"
        return f"{last} [{time.monotonic() - t0:.1f} s]"

    def _env(self) -> dict[str, str]:
        peer_dir = os.environ.get("PEER_DIR", "/tmp/peer")
        env_sh = Path(peer_dir) / "env.sh"
        if not env_sh.is_file():
            raise BenchError(f"{env_sh} missing after setup.sh (is PEER_DIR the same?)")
        done = subprocess.run(["bash", "-c", 'source "$1" && env -0', "_", str(env_sh)],
                              capture_output=True, check=True)
        return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def start(self) -> float:
        """Starts tritonserver the way run_peer.sh does; returns seconds from launch to ready."""
        peer_env = self._env()
        env = dict(os.environ)
        libs = [peer_env["PEER_LIBS"]]
        pylib = peer_env.get("PEER_PYLIBDIR", "")
        if pylib and any(Path(pylib).glob("libpython3.*.so.1.0")):
            libs.insert(0, pylib)   # the stub embeds the venv interpreter's own libpython
        env["LD_LIBRARY_PATH"] = ":".join(libs)
        env["PATH"] = f"{peer_env['PEER_VENV']}/bin:{env.get('PATH', '')}"  # the stub finds numpy through PATH
        hp, gp, mp = free_ports(3)
        cmd = [peer_env["PEER_SERVER"], f"--model-repository={self.repo}",
               f"--backend-directory={peer_env['PEER_BACKENDS']}", f"--cache-directory={peer_env['PEER_CACHES']}",
               "--http-address=127.0.0.1", f"--http-port={hp}", "--grpc-address=127.0.0.1", f"--grpc-port={gp}",
               "--metrics-address=127.0.0.1", f"--metrics-port={mp}", "--allow-gpu-metrics=false",
               "--pinned-memory-pool-byte-size=0", "--exit-timeout-secs=10", *self.extra_args]
        self.http_url, self.grpc_url = f"127.0.0.1:{hp}", f"127.0.0.1:{gp}"
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, cwd=self.workdir)
        took = None
        try:
            took = self.wait_ready(["add_sub", "identity"], t0 + START_TIMEOUT)
        finally:
            if took is None:
                self.stop()
        import tritonclient.http as httpclient
        client = httpclient.InferenceServerClient(self.http_url)
        try:
            self.version = client.get_server_metadata().get("version", "?")
        finally:
            client.close()
        for p in process_tree(self.proc.pid)[1:]:
            with contextlib.suppress(OSError), open(f"/proc/{p}/cmdline", "rb") as f:
                self._stub_regions += [a.decode() for a in f.read().split(b"\0")
                                       if a.startswith(b"triton_python_backend_shm_region")]
        return took

    def is_stub_of(self, argv: list[str], model: str) -> bool:
        """triton_python_backend_stub whose model path is in <repo>/<model>/; remembers its shm
        region, so stop() checks that a restarted stub's region is gone too."""
        if not argv or not argv[0].endswith("triton_python_backend_stub"):
            return False
        regions = [a for a in argv if a.startswith("triton_python_backend_shm_region")]
        self._stub_regions += [r for r in regions if r not in self._stub_regions]
        return any(a.startswith(f"{self.repo / model}{os.sep}") for a in argv[1:2])

    def segments(self) -> list[str]:
        """Its Python stubs' shm regions in /dev/shm now (one per stub, named on its command line)."""
        if self.proc is not None and self.proc.poll() is None:
            for p in process_tree(self.proc.pid)[1:]:
                with contextlib.suppress(OSError), open(f"/proc/{p}/cmdline", "rb") as f:
                    self._stub_regions += [r for r in (a.decode(errors="replace") for a in f.read().split(b"\0"))
                                           if r.startswith("triton_python_backend_shm_region")
                                           and r not in self._stub_regions]
        return sorted(r for r in self._stub_regions if os.path.exists(os.path.join(SHM_DIR, r)))

    def stop(self) -> int | None:
        """SIGTERM (KILL after STOP_TIMEOUT s), then checks its Python stubs and their shm are gone."""
        if self.proc is None:
            return None
        stubs = process_tree(self.proc.pid)[1:]
        self._terminate()
        deadline = time.monotonic() + 5
        while (alive := [p for p in stubs if _is_zombie(p) is False]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in alive:
            self.problems.append(f"python stub {p} still running after exit; killed")
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        leaked = [r for r in self._stub_regions if os.path.exists(os.path.join(SHM_DIR, r))]
        if leaked:
            self.problems.append(f"left /dev/shm entries: {leaked}")
        return self.proc.returncode


# ---- clients ----------------------------------------------------------------------------------
class ExternalServer(ServerUnderTest):
    """Any KServe v2 server already running (--url/--grpc-url): measured, never started or stopped.

    It must serve the same two models (add_sub, and identity: FP32 dims [-1], OUTPUT0 = INPUT0).
    """

    def __init__(self, label: str, http_url: str, grpc_url: str) -> None:
        super().__init__()
        self.label = label
        self.http_url = http_url
        self.grpc_url = grpc_url

    def log_text(self) -> str:
        return "(an external server: no log here)"

    def start(self) -> float:
        """Waits until it answers and both models are ready; returns the seconds waited."""
        return self.wait_ready(["add_sub", "identity"], time.monotonic() + START_TIMEOUT)

    def stop(self) -> int | None:
        """Nothing to stop: it is not ours."""
        return None


def client_module(proto: str) -> Any:
    """tritonclient.http or tritonclient.grpc."""
    if proto == "http":
        import tritonclient.http as mod
    else:
        import tritonclient.grpc as mod
    return mod


def make_client(server: ServerUnderTest, proto: str) -> Any:
    """A new client of `server` on `proto` (use it in the thread that made it)."""
    if proto == "http":
        return client_module(proto).InferenceServerClient(server.http_url, connection_timeout=NET_TIMEOUT,
                                                          network_timeout=NET_TIMEOUT)
    return client_module(proto).InferenceServerClient(server.grpc_url)


def make_input(proto: str, name: str, array: np.ndarray) -> Any:
    """An input carrying its data: binary tensor data over HTTP, raw contents over gRPC."""
    tensor = client_module(proto).InferInput(name, list(array.shape), "FP32")
    if proto == "http":
        tensor.set_data_from_numpy(array, binary_data=True)
    else:
        tensor.set_data_from_numpy(array)
    return tensor


def make_output(proto: str, name: str) -> Any:
    """A requested output (binary over HTTP)."""
    mod = client_module(proto)
    return mod.InferRequestedOutput(name, binary_data=True) if proto == "http" else mod.InferRequestedOutput(name)


@contextlib.contextmanager
def open_client(server: ServerUnderTest, proto: str) -> Iterator[Any]:
    """make_client, closed on exit."""
    client = make_client(server, proto)
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.close()


def add_sub_call(proto: str) -> tuple[list[Any], list[Any]]:
    """(inputs, outputs) of one add_sub request."""
    return ([make_input(proto, "INPUT0", ADD_A), make_input(proto, "INPUT1", ADD_B)],
            [make_output(proto, "OUTPUT0"), make_output(proto, "OUTPUT1")])


def check_add_sub(result: Any, what: str) -> None:
    """Raises BenchError unless result holds add_sub's answer to ADD_A, ADD_B."""
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    if out0 is None or out1 is None or not (np.array_equal(out0, ADD_A + ADD_B) and np.array_equal(out1, ADD_A - ADD_B)):
        raise BenchError(f"{what}: wrong add_sub outputs {out0} {out1}")


def server_stats(server: ServerUnderTest, model: str) -> dict[str, tuple[int, int]] | None:
    """The statistics extension over HTTP: {success, queue, compute_*: (count, ns)} summed over the
    model's versions; None if the server does not answer it."""
    with open_client(server, "http") as client:
        try:
            doc = client.get_inference_statistics(model_name=model)
        except Exception:  # noqa: BLE001 - the extension is optional
            return None
    out: dict[str, tuple[int, int]] = {}
    for entry in doc.get("model_stats", []):
        for key, value in entry.get("inference_stats", {}).items():
            c, ns = out.get(key, (0, 0))
            out[key] = (c + int(value.get("count", 0)), ns + int(value.get("ns", 0)))
    return out


STAT_KEYS = ("queue", "compute_input", "compute_infer", "compute_output", "success")


def stats_breakdown(before: dict | None, after: dict | None) -> dict[str, float] | None:
    """Average us per successful request between two server_stats snapshots (+ 'requests')."""
    if not after:
        return None
    before = before or {}
    n = after.get("success", (0, 0))[0] - before.get("success", (0, 0))[0]
    if n <= 0:
        return None
    out = {"requests": float(n)}
    for key in STAT_KEYS:
        out[key] = (after.get(key, (0, 0))[1] - before.get(key, (0, 0))[1]) / n / 1e3
    return out


# ---- cases ------------------------------------------------------------------------------------
@dataclass
class Throughput:
    """One throughput point: requests done in `wall_s` seconds, their latencies (ns), and the CPU
    seconds the server (with its stubs) and this client process used meanwhile."""

    count: int
    wall_s: float
    samples: np.ndarray
    server_cpu_s: float = 0.0     # the server process and its stubs
    stub_cpu_s: float = 0.0       # its stubs alone
    client_cpu_s: float = 0.0

    def cpu_us(self, which: str) -> float:
        """CPU us per request of 'server' (with its stubs), 'stub' or 'client'."""
        cpu = {"server": self.server_cpu_s, "stub": self.stub_cpu_s, "client": self.client_cpu_s}[which]
        return cpu / self.count * 1e6 if self.count else 0.0

    @property
    def rps(self) -> float:
        """Requests per second over the point."""
        return self.count / self.wall_s if self.wall_s > 0 else 0.0


def own_cpu_seconds() -> float:
    """CPU seconds of this process (all its threads) so far."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def measure_ready(server: ServerUnderTest, proto: str, cfg: Config) -> np.ndarray:
    """Sequential server-ready round trips: protocol and client cost, no model."""
    with open_client(server, proto) as client:
        def check(i: int, ready: bool) -> None:
            if ready is not True:
                raise BenchError(f"server ready over {proto} answered {ready!r}")

        return time_series(lambda i: client.is_server_ready(), cfg.requests, cfg.warmup_s, cfg.duration,
                           warmup_n=10, check=check, no_gc=True)


def measure_add_sub(server: ServerUnderTest, proto: str, cfg: Config) -> np.ndarray:
    """Sequential add_sub infers (4 x FP32 in, 2 x 4 x FP32 out); only the call is timed."""
    with open_client(server, proto) as client:
        inputs, outputs = add_sub_call(proto)

        def check(i: int, result: Any) -> None:
            if i % 32 == 0:
                check_add_sub(result, f"add_sub over {proto}, request {i}")

        return time_series(lambda i: client.infer("add_sub", inputs, outputs=outputs), cfg.requests, cfg.warmup_s,
                           cfg.duration, warmup_n=10, check=check, no_gc=True)


def measure_throughput(server: ServerUnderTest, proto: str, conc: int, cfg: Config) -> Throughput:
    """`conc` threads, each with its own client, issue add_sub back to back for cfg.duration s."""
    lats: list[list[int]] = [[] for _ in range(conc)]
    errors: list[str] = []
    ready = threading.Barrier(conc + 1, timeout=START_TIMEOUT)
    go = threading.Event()
    clock: dict[str, int] = {}

    def worker(k: int) -> None:
        try:
            with open_client(server, proto) as client:
                inputs, outputs = add_sub_call(proto)
                check_add_sub(client.infer("add_sub", inputs, outputs=outputs), f"worker {k}")
                end = time.perf_counter() + cfg.warmup_s
                while time.perf_counter() < end:
                    client.infer("add_sub", inputs, outputs=outputs)
                ready.wait()
                go.wait()
                pc, out, deadline = time.perf_counter_ns, lats[k], clock["deadline"]
                result = None
                while True:
                    t0 = pc()
                    result = client.infer("add_sub", inputs, outputs=outputs)
                    t1 = pc()
                    out.append(t1 - t0)
                    if t1 >= deadline:
                        break
                check_add_sub(result, f"worker {k}")
        except threading.BrokenBarrierError:
            errors.append(f"worker {k}: start barrier broken")
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(f"worker {k}: {type(exc).__name__}: {exc}")
            ready.abort()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(conc)]
    for t in threads:
        t.start()
    wall, srv0, srv1, cli0, cli1 = 0.0, (0.0, 0.0), (0.0, 0.0), 0.0, 0.0
    try:
        ready.wait()
        with gc_off():
            srv0, cli0 = server.cpu_seconds(), own_cpu_seconds()
            start = time.perf_counter_ns()
            clock["deadline"] = start + int(cfg.duration * 1e9)
            go.set()
            for t in threads:
                t.join(cfg.duration + NET_TIMEOUT)
            wall = (time.perf_counter_ns() - start) / 1e9
            srv1, cli1 = server.cpu_seconds(), own_cpu_seconds()
    except threading.BrokenBarrierError:
        pass
    finally:
        go.set()
        for t in threads:
            t.join(NET_TIMEOUT)
    if errors:
        raise BenchError(f"throughput {proto} c={conc}: " + "; ".join(errors[:3]))
    samples = np.asarray([x for lat in lats for x in lat], dtype=np.int64)
    return Throughput(len(samples), wall, samples, sum(srv1) - sum(srv0), srv1[1] - srv0[1], cli1 - cli0)


@contextlib.contextmanager
def client_region(client: Any, tag: str, nbytes: int) -> Iterator[tuple[str, Any]]:
    """A client system shared-memory region of nbytes, registered with the server:
    (region name, tritonclient handle); unregistered and destroyed on exit."""
    from tritonclient.utils import shared_memory as shm
    name = f"{REGION_PREFIX}_{tag}_{secrets.token_hex(4)}"
    handle = shm.create_shared_memory_region(name, "/" + name, nbytes, create_only=True)
    try:
        client.register_system_shared_memory(name, "/" + name, nbytes)
        try:
            yield name, handle
        finally:
            with contextlib.suppress(Exception):
                client.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


def region_array(handle: Any, n: int) -> np.ndarray:
    """A writable float32 view of a client region (drop it before the region is destroyed)."""
    from tritonclient.utils import shared_memory as shm
    return shm.get_contents_as_numpy(handle, np.float32, [n])


def output_has_data(result: Any, proto: str, name: str) -> bool:
    """Whether the response carries bytes for output `name` (it must not when the output went to shm)."""
    if proto == "http":
        out = result.get_output(name) or {}
        return "data" in out or bool(out.get("parameters", {}).get("binary_data_size"))
    response = result.get_response()
    for i, out in enumerate(response.outputs):
        if out.name == name:
            return i < len(response.raw_output_contents) and len(response.raw_output_contents[i]) > 0
    return False


def paired_series(step: Callable[[], Any], other: Callable[[], Any], iterations: int, warmup_s: float,
                  max_s: float, warmup_n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Times step() and other() alternately (after warming both up for warmup_s and >= warmup_n
    times), up to `iterations` pairs or max_s seconds; returns both series in ns. Each pair sees the
    same machine, which matters more than the sample count on a busy host."""
    i, end = 0, time.perf_counter() + warmup_s
    while i < warmup_n or time.perf_counter() < end:
        step()
        other()
        i += 1
    clock, a, b = time.perf_counter_ns, [], []
    deadline = clock() + int(max_s * 1e9)
    with gc_off():
        for _ in range(iterations):
            t0 = clock()
            step()
            t1 = clock()
            other()
            t2 = clock()
            a.append(t1 - t0)
            b.append(t2 - t1)
            if t2 > deadline:
                break
    return np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)


def measure_identity(server: ServerUnderTest, proto: str, nbytes: int, in_shm: bool,
                     cfg: Config) -> np.ndarray | dict[str, np.ndarray]:
    """Sequential identity infers on nbytes of FP32, timing the infer call only; with in_shm the
    input and output live in client system shm regions (pre-touched) and each infer is followed by
    one np.copyto of nbytes between two preallocated, pre-touched arrays, timed apart ({"samples",
    "memcpy"}); otherwise the data travels in the messages. Outputs are checked before and after
    the timed loop (the output region is zeroed first, so a stale answer cannot pass)."""
    data, n = cfg.data[nbytes], nbytes // 4
    with open_client(server, proto) as client, contextlib.ExitStack() as stack:
        mod = client_module(proto)
        out = make_output(proto, "OUTPUT0")
        if in_shm:
            in_name, in_handle = stack.enter_context(client_region(client, f"in{nbytes >> 10}k", nbytes))
            out_name, out_handle = stack.enter_context(client_region(client, f"out{nbytes >> 10}k", nbytes))
            inp = mod.InferInput("INPUT0", [n], "FP32")
            view = region_array(in_handle, n)
            view[:] = data
            del view
            inp.set_shared_memory(in_name, nbytes)
            out.set_shared_memory(out_name, nbytes)

            def verify(stage: str) -> None:
                view = region_array(out_handle, n)
                try:
                    view.fill(0)  # also touches every page of the output region
                    result = client.infer("identity", [inp], outputs=[out])
                    if output_has_data(result, proto, "OUTPUT0"):
                        raise BenchError(f"identity {proto} shm {size_text(nbytes)} ({stage}): an output placed in "
                                         "shared memory came back with data in the response")
                    if not np.array_equal(view, data):
                        raise BenchError(f"identity {proto} shm {size_text(nbytes)} ({stage}): wrong output "
                                         "in the region")
                finally:
                    del view
        else:
            inp = make_input(proto, "INPUT0", data)

            def verify(stage: str) -> None:
                got = client.infer("identity", [inp], outputs=[out]).as_numpy("OUTPUT0")
                if got is None or not np.array_equal(got, data):
                    raise BenchError(f"identity {proto} {size_text(nbytes)} ({stage}): wrong output")

        verify("before")
        if in_shm:
            dst = np.empty_like(data)
            dst.fill(0)
            samples, memcpy = paired_series(lambda: client.infer("identity", [inp], outputs=[out]),
                                            lambda: np.copyto(dst, data), cfg.requests, cfg.warmup_s, cfg.duration)
            if not np.array_equal(dst, data):
                raise BenchError("memcpy: the copy differs")
        else:
            samples = time_series(lambda i: client.infer("identity", [inp], outputs=[out]), cfg.requests,
                                  cfg.warmup_s, cfg.duration, warmup_n=2, no_gc=True)
        verify("after")
    return {"samples": samples, "memcpy": memcpy} if in_shm else samples


# ---- orchestration ----------------------------------------------------------------------------
@dataclass
class Case:
    """One measurement: `key` in the results, and how to run it against a server."""

    key: tuple
    run: Callable[[ServerUnderTest], Any]
    model: str | None = None   # whose server statistics to read before and after


def build_cases(cfg: Config) -> list[Case]:
    """Every case, in the order they run within one run."""
    cases: list[Case] = []
    for proto in PROTOCOLS:
        cases.append(Case(("ready", proto), lambda s, p=proto: measure_ready(s, p, cfg)))
        cases.append(Case(("add_sub", proto), lambda s, p=proto: measure_add_sub(s, p, cfg), model="add_sub"))
    for proto in PROTOCOLS:
        for conc in CONCURRENCY:
            cases.append(Case(("tput", proto, conc), lambda s, p=proto, c=conc: measure_throughput(s, p, c, cfg),
                              model="add_sub"))
    for nbytes in cfg.sizes:
        for in_shm in (True, False):
            for proto in PROTOCOLS:
                cases.append(Case(("identity", proto, nbytes, in_shm),
                                  lambda s, p=proto, b=nbytes, m=in_shm: measure_identity(s, p, b, m, cfg),
                                  model="identity"))
    return cases


def run_measured(case: Case, server: ServerUnderTest) -> tuple[Any, bool]:
    """Runs a case; returns (result, disturbed): other processes than this one and the server
    under test used >= DISTURBED of a core meanwhile (one clock tick per CPU of slack)."""
    t0 = time.monotonic()
    busy0, own0 = cpu_seconds()
    srv0 = sum(server.cpu_seconds())
    result = case.run(server)
    busy1, own1 = cpu_seconds()
    srv1 = sum(server.cpu_seconds())
    slack = os.cpu_count() / os.sysconf("SC_CLK_TCK")
    others = max(0.0, (busy1 - busy0) - (own1 - own0) - (srv1 - srv0) - slack) / max(1e-9, time.monotonic() - t0)
    return result, others >= DISTURBED


def run_all(cfg: Config, servers: list[ServerUnderTest]) -> tuple[dict, dict, dict]:
    """Runs every case cfg.runs times against each server, interleaved case by case (the server
    order alternates between runs). Returns (results, errors, server statistics per case in the last
    run, which include the case's warm-up and checks):
    results[(label, *key)] = [(result, disturbed), ...]."""
    results: dict[tuple, list] = {}
    errors: dict[tuple, str] = {}
    stats: dict[tuple, dict] = {}
    cases = build_cases(cfg)
    for run in range(cfg.runs):
        order = servers if run % 2 == 0 else servers[::-1]
        print(f"run {run + 1}/{cfg.runs}: {len(cases)} cases x {len(servers)} server(s), order "
              f"{' -> '.join(s.label for s in order)}", flush=True)
        for case in cases:
            for server in order:
                label = server.label
                key = (label, *case.key)
                if key in errors:
                    continue   # failed in an earlier run: do not spend the time again
                try:
                    before = server_stats(server, case.model) if case.model else None
                    result, disturbed = run_measured(case, server)
                    if before is not None:
                        stats[key] = stats_breakdown(before, server_stats(server, case.model))
                    if isinstance(result, dict):   # identity in shm: its interleaved memcpy too
                        _, proto, nbytes, _ = case.key
                        results.setdefault((label, "memcpy", proto, nbytes), []).append((result["memcpy"], disturbed))
                        result = result["samples"]
                except Exception as exc:  # noqa: BLE001 - one failed case is reported, the rest still run
                    msg = f"{type(exc).__name__}: {exc}"
                    print(f"ERROR run {run + 1}, {label} {case.key}: {msg}", flush=True)
                    if not isinstance(exc, (BenchError, OSError)):
                        traceback.print_exc()
                    errors[key] = msg.splitlines()[0][:120]
                    if server.proc is not None and server.proc.poll() is not None:
                        print(f"ERROR: {label} exited with {server.proc.returncode}:\n{tail(server.log_text())}")
                    continue
                results.setdefault(key, []).append((result, disturbed))
    return results, errors, stats


# ---- reporting --------------------------------------------------------------------------------
def latency_cell(runs: list | None, scale: float) -> tuple[str, str, str, float | None]:
    """(median, p99, n, median value) of one case's runs in units of `scale` ns."""
    if not runs:
        return "-", "-", "-", None
    _, median, p99, n, _ = summarize_runs(runs, scale)
    star = "*" if any(bad for _, bad in runs) else ""
    return fmt(median) + star, fmt(p99), str(n), median


def print_latency_table(title: str, rows: list[tuple[str, tuple]], unit: str, scale: float, results: dict,
                        errors: dict, labels: list[str]) -> dict:
    """A table of latency rows with a median/p99/n column group per server (and stubhost/Triton,
    except on memcpy rows); returns {(label, *key): median}."""
    width = max(len(r[0]) for r in rows) + 2
    head = f"{title:<{width}}|"
    for label in labels:
        head += f" {label + ' median':>17} | {'p99':>9} | {'n':>5} |"
    if PEER in labels:
        head += " s/T"
    print(f"\n{head}\n" + "-" * len(head))
    medians = {}
    for row_label, key in rows:
        line = f"{row_label:<{width}}|"
        for label in labels:
            full = (label, *key)
            med, p99, n, value = latency_cell(results.get(full), scale)
            if value is None and full in errors:
                med = "ERR"
            medians[(label, *key)] = value
            line += f" {med:>17} | {p99:>9} | {n:>5} |"
        if PEER in labels:
            a, b = medians.get(("stubhost", *key)), medians.get((PEER, *key))
            line += f" {a / b:.2f}" if a and b and key[0] != "memcpy" else " -"
        print(line)
    print(f"(unit {unit}; * = some run disturbed by other processes"
          + (f"; s/T = stubhost / {PEER} medians)" if PEER in labels else ")"))
    return medians


def print_throughput_table(results: dict, errors: dict, labels: list[str], runs: int) -> dict:
    """proto, concurrency | per server: req/s, median ms, p99 ms, CPU per request | stubhost/Triton req/s."""
    w = 15 if runs == 1 else 16 + 6 * runs   # room for the per-run figures
    head = f"{'add_sub throughput':<22}|"
    for label in labels:
        head += f" {label + ' req/s':>{w}} | {'median ms':>9} | {'p99 ms':>8} | {'CPU/stub':>9} |"
    if PEER in labels:
        head += " s/T req/s"
    print(f"\n{head}\n" + "-" * len(head))
    rps: dict[tuple, float] = {}
    for proto in PROTOCOLS:
        for conc in CONCURRENCY:
            line = f"{proto + ' c=' + str(conc):<22}|"
            for label in labels:
                key = (label, "tput", proto, conc)
                done = results.get(key)
                if not done:
                    cell = "ERR" if key in errors else "-"
                    line += f" {cell:>{w}} | {'-':>9} | {'-':>8} | {'-':>9} |"
                    continue
                value = float(np.median([t.rps for t, _ in done]))
                rps[key] = value
                lat_runs = [(t.samples, bad) for t, bad in done if len(t.samples)]
                _, med, p99, _, _ = summarize_runs(lat_runs, 1e6)
                star = "*" if any(bad for _, bad in done) else ""
                per_run = "/".join(f"{t.rps:.0f}" for t, _ in done)
                cell = f"{value:.0f}{star}" if len(done) == 1 else f"{value:.0f}{star} ({per_run})"
                cpu = f"{tput_cpu(results, key, 'server'):.0f}/{tput_cpu(results, key, 'stub'):.0f}"
                line += f" {cell:>{w}} | {med:>9.3f} | {p99:>8.3f} | {cpu:>9} |"
            if PEER in labels:
                a, b = rps.get(("stubhost", "tput", proto, conc)), rps.get((PEER, "tput", proto, conc))
                line += f" {a / b:.2f}" if a and b else " -"
            print(line)
    print("(req/s: median over runs" + (", per-run figures in brackets" if runs > 1 else "") +
          "; latencies: median over runs; * = some run disturbed by other processes;\n"
          " CPU/stub: us of CPU per request used by the server with its stubs / by its stubs alone)")
    return rps


def case_name(key: tuple) -> str:
    """A short name for a case key (without the server label)."""
    if key[0] == "tput":
        return f"add_sub {key[1]} c={key[2]} throughput"
    if key[0] == "identity":
        _, proto, nbytes, in_shm = key
        return f"identity {size_text(nbytes)} {proto} {'shm' if in_shm else 'no shm'}"
    return " ".join(str(k) for k in key) + (" latency" if key[0] == "add_sub" else "")


def print_statistics(servers: list[ServerUnderTest], case_stats: dict) -> None:
    """The statistics extension: add_sub over the whole run, then each case of the last run."""
    head = (f"{'server statistics, avg us/request':<40}| {'requests':>8} | {'queue':>8} | {'c_input':>8} | "
            f"{'c_infer':>8} | {'c_output':>8} | {'total':>8}")
    print(f"\n{head}\n" + "-" * len(head))

    def row(label: str, st: dict | None) -> None:
        if not st:
            print(f"{label:<40}| {'n/a':>8} |")
            return
        print(f"{label:<40}| {st['requests']:>8.0f} | {st['queue']:>8.1f} | {st['compute_input']:>8.1f} | "
              f"{st['compute_infer']:>8.1f} | {st['compute_output']:>8.1f} | {st['success']:>8.1f}")

    for server in servers:
        try:
            row(f"{server.label} add_sub, whole run", stats_breakdown(None, server_stats(server, "add_sub")))
        except Exception as exc:  # noqa: BLE001
            print(f"{server.label} add_sub: statistics failed: {type(exc).__name__}: {exc}")
    for (label, *key), st in case_stats.items():
        row(f"{label} {case_name(tuple(key))}", st)
    print("per case: the deltas around that case in the last run (warm-up and output checks included); "
          "total = the server's own end-to-end time (its 'success' duration)")


def tput_cpu(results: dict, key: tuple, which: str) -> float:
    """Median over runs of a throughput point's CPU us per request ('server', 'stub' or 'client')."""
    return float(np.median([t.cpu_us(which) for t, _ in results[key]]))


def ratio_line(label: str, num: float | None, den: float | None, bar: float | None = None,
               lower_better: bool = True) -> bool | None:
    """Prints one ratio (with PASS/FAIL when it has a bar); returns the verdict (None: no bar or n/a)."""
    if not num or not den:
        print(f"ratio {label} = n/a" + (f"  (bar <= {bar})  NOT EVALUATED" if bar else ""))
        return None if bar is None else False
    r = num / den
    if bar is None:
        hint = "lower is better for stubhost" if lower_better else "higher is better for stubhost"
        print(f"ratio {label} = {r:.2f}  (info, {hint})")
        return None
    ok = r <= bar
    print(f"ratio {label} = {r:.2f}  (bar <= {bar})  {'PASS' if ok else 'FAIL'}")
    return ok


def report(cfg: Config, results: dict, errors: dict, servers: list[ServerUnderTest], case_stats: dict) -> bool:
    """Prints the tables, the statistics and the ratios; returns whether the 64 MiB bar holds."""
    labels = [s.label for s in servers]
    lat = print_latency_table("latency, c=1", [
        ("server ready http", ("ready", "http")), ("server ready grpc", ("ready", "grpc")),
        ("add_sub http (4xFP32)", ("add_sub", "http")), ("add_sub grpc (4xFP32)", ("add_sub", "grpc"))],
        "us", 1e3, results, errors, labels)
    rps = print_throughput_table(results, errors, labels, cfg.runs)
    rows = []
    for nbytes in cfg.sizes:
        for proto in PROTOCOLS:
            rows.append((f"identity {size_text(nbytes)} {proto} system shm", ("identity", proto, nbytes, True)))
            rows.append((f"  np.copyto {size_text(nbytes)}, between those", ("memcpy", proto, nbytes)))
        for proto in PROTOCOLS:
            how = "binary" if proto == "http" else "raw"
            rows.append((f"identity {size_text(nbytes)} {proto} {how}", ("identity", proto, nbytes, False)))
    big = print_latency_table("large tensors, c=1", rows, "ms", 1e6, results, errors, labels)
    print("(np.copyto: one copy of the same size in this client, timed right after each infer of the row above)")
    print_statistics(servers, case_stats)

    print()
    verdict = BAR_SIZE in cfg.sizes
    if not verdict:
        print("ratio (a) identity 64 MiB shm / memcpy: not measured (--sizes has no 64M)  NOT EVALUATED")
    for proto in PROTOCOLS:
        for label in labels:
            for nbytes in cfg.sizes:
                name = f"{label} identity {size_text(nbytes)} {proto} shm / {size_text(nbytes)} memcpy"
                num, den = big.get((label, "identity", proto, nbytes, True)), big.get((label, "memcpy", proto, nbytes))
                if label == "stubhost" and nbytes == BAR_SIZE:
                    verdict = bool(ratio_line(f"(a) {name}", num, den, BAR)) and verdict
                else:
                    ratio_line(f"    {name}", num, den)
    for label in labels:
        for proto in PROTOCOLS:
            base = rps.get((label, "tput", proto, 1))
            line = ", ".join(f"c={c} {rps[(label, 'tput', proto, c)]:.0f}" for c in CONCURRENCY
                             if (label, "tput", proto, c) in rps)
            scale = ", ".join(f"c={c}/c=1 {rps[(label, 'tput', proto, c)] / base:.2f}" for c in CONCURRENCY[1:]
                              if base and (label, "tput", proto, c) in rps)
            print(f"ratio (b) {label} throughput {proto} req/s: {line or 'n/a'}  [{scale or '-'}]")
            cpu = ", ".join(f"c={c} {tput_cpu(results, (label, 'tput', proto, c), 'server'):.0f}/"
                            f"{tput_cpu(results, (label, 'tput', proto, c), 'client'):.0f}" for c in CONCURRENCY
                            if (label, "tput", proto, c) in results)
            if cpu:
                print(f"          {label} {proto} CPU us per request, server/client: {cpu}")
    if PEER in labels:
        for proto in PROTOCOLS:
            for what in ("ready", "add_sub"):
                ratio_line(f"(c) {what} {proto} latency stubhost / {PEER}", lat.get(("stubhost", what, proto)),
                           lat.get((PEER, what, proto)))
        for proto in PROTOCOLS:
            for conc in CONCURRENCY:
                ratio_line(f"(c) throughput {proto} c={conc} stubhost / {PEER}",
                           rps.get(("stubhost", "tput", proto, conc)), rps.get((PEER, "tput", proto, conc)),
                           lower_better=False)
        for nbytes in cfg.sizes:
            for proto in PROTOCOLS:
                ratio_line(f"(c) identity {size_text(nbytes)} {proto} shm latency stubhost / {PEER}",
                           big.get(("stubhost", "identity", proto, nbytes, True)),
                           big.get((PEER, "identity", proto, nbytes, True)))
    return verdict


def own_leftovers() -> list[str]:
    """Our client regions left in /dev/shm (removed)."""
    left = sorted(n for n in os.listdir(SHM_DIR) if n.startswith(REGION_PREFIX))
    for n in left:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, n))
    return left


def parse_args() -> argparse.Namespace:
    """The command line, with the --quick defaults filled in."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one run, 1 s per point, <= 300 requests per latency case")
    ap.add_argument("--duration", type=float, help="seconds per point (default 5, quick 1)")
    ap.add_argument("--requests", type=int, help="timed requests per latency case, at most (default 2000, quick 300)")
    ap.add_argument("--runs", type=int, help="runs of every case (default 3, quick 1)")
    ap.add_argument("--sizes", default="1M,16M,64M", help="identity sizes (default 1M,16M,64M; 64M carries the bar)")
    ap.add_argument("--with-triton", action="store_true", help="also measure the real Triton 2.51 Python backend "
                    "from the peer scripts, interleaved")
    ap.add_argument("--triton-peer", type=Path, default=DEFAULT_PEER, help=f"peer scripts (default {DEFAULT_PEER})")
    ap.add_argument("--triton-setup-timeout", type=float, default=300.0, help="s allowed for setup.sh (default 300)")
    ap.add_argument("--url", metavar="HOST:PORT", help="also measure this running KServe v2 server (HTTP); it must "
                    "serve add_sub and identity (FP32 [-1]) as in examples/models")
    ap.add_argument("--grpc-url", metavar="HOST:PORT", help="its gRPC endpoint (with --url)")
    ap.add_argument("--peer-label", default="peer", help="column label of the --url server (default peer)")
    ap.add_argument("--check", action="store_true", help=f"exit 1 if identity 64 MiB shm / memcpy > {BAR}")
    args = ap.parse_args()
    if bool(args.url) != bool(args.grpc_url):
        ap.error("--url and --grpc-url go together")
    args.duration = args.duration or (1.0 if args.quick else 5.0)
    args.requests = args.requests or (300 if args.quick else 2000)
    args.runs = args.runs or (1 if args.quick else 3)
    args.sizes = sorted({parse_size(s) for s in args.sizes.split(",") if s.strip()})
    return args


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C, so the servers are stopped and the client regions removed."""
    raise SystemExit(128 + signum)


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    cfg = Config(runs=args.runs, duration=args.duration, requests=args.requests,
                 warmup_s=0.1 if args.quick else 0.3, sizes=args.sizes)
    rng = np.random.default_rng(1234)
    cfg.data = {n: rng.standard_normal(n // 4, dtype=np.float32) for n in cfg.sizes}
    machine_facts()
    spec = importlib.util.find_spec("stubhost")
    from importlib.metadata import version

    import tritonclient.grpc  # noqa: F401 - fail early if the client is missing
    print(f"stubhost from {Path(spec.origin).parent if spec and spec.origin else 'NOT FOUND'}, "
          f"tritonclient {version('tritonclient')}")
    print(f"runs {cfg.runs}; per point <= {cfg.duration:g} s, latency cases <= {cfg.requests} requests; "
          f"identity sizes {', '.join(size_text(n) for n in cfg.sizes)}; concurrency {CONCURRENCY}")
    resource_tracker.ensure_running()  # tritonclient's shm regions use it; start it outside the timed cases

    started = time.perf_counter()
    failed, ok = False, False
    servers: list[ServerUnderTest] = []
    with tempfile.TemporaryDirectory(prefix="bench_frontends_") as tmp:
        repo = build_repository(Path(tmp))
        try:
            stubhost = StubhostServer(repo)
            servers.append(stubhost)
            took = stubhost.start()
            print(f"stubhost serve pid {stubhost.proc.pid}: http {stubhost.http_url}, grpc {stubhost.grpc_url}, "
                  f"ready after {took:.2f} s")
            if args.url:
                global PEER
                PEER = args.peer_label
                other = ExternalServer(PEER, args.url, args.grpc_url or "")
                print(f"{PEER} at http {args.url}, grpc {args.grpc_url}: ready after {other.start():.2f} s")
                servers.append(other)
            elif args.with_triton:
                why = TritonServer.unavailable(args.triton_peer)
                if why is None:
                    triton = TritonServer(args.triton_peer, repo, Path(tmp))
                    try:
                        print(f"triton peer: {triton.setup(args.triton_setup_timeout)}")
                        servers.append(triton)
                        took = triton.start()
                        print(f"tritonserver {triton.version} pid {triton.proc.pid}: http {triton.http_url}, "
                              f"grpc {triton.grpc_url}, ready after {took:.2f} s")
                    except BenchError as exc:
                        if triton in servers:
                            servers.remove(triton)
                        print(f"Triton columns skipped: the peer could not be started: {exc}")
                else:
                    print(f"Triton columns skipped: {why}")
            else:
                print("Triton columns skipped: run with --with-triton to measure the real Triton 2.51 "
                      "Python backend side by side")
            results, errors, case_stats = run_all(cfg, servers)
            ok = report(cfg, results, errors, servers, case_stats)
            failed = bool(errors)
        except BenchError as exc:
            print(f"ERROR: {exc}")
            failed = True
        finally:
            for server in servers:
                code = server.stop()
                extra = ""
                if isinstance(server, StubhostServer):
                    lines = server.suspicious_log_lines()
                    extra = f"; {len(lines)} warning/error lines in its log"
                    for ln in lines[:10]:
                        print(f"    | {ln}")
                print(f"{server.label} stopped with SIGTERM: exit code {code}{extra}")
                for problem in server.problems:
                    print(f"ERROR: {server.label}: {problem}")
                    failed = failed or isinstance(server, StubhostServer)
    left = own_leftovers()
    if left:
        print(f"WARNING: this run left client regions in /dev/shm (removed): {left}")
    print(f"\ntotal {time.perf_counter() - started:.1f} s")
    if failed:
        return 2
    if args.check and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
