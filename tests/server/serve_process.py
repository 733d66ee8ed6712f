"""Runs ``stubhost serve`` as a real process for front-end tests, on ports it picks itself.

    with ServeProcess(repo) as srv:
        client = tritonclient.http.InferenceServerClient(srv.http_url)

The server logs the ports it bound ("Started HTTPService at ADDR:PORT"); the helper reads them
from the log, waits for readiness, and on exit stops the server with SIGTERM and checks that it
exited cleanly and left no shared-memory segment behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

SHM_DIR = "/dev/shm"
_STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService) at (\S+):(\d+)")


class ServeProcess:
    """A ``python -m stubhost serve`` child on 127.0.0.1 with ports chosen by the OS."""

    def __init__(self, repository: str | os.PathLike[str], *extra: str, env: dict[str, str] | None = None,
                 start_timeout: float = 60.0, expect_start: bool = True,
                 command: Sequence[str] | None = None) -> None:
        self.repository = Path(repository)
        self.command = command  # run instead of `python -m stubhost serve ...` (a launch script)
        self.extra: Sequence[str] = extra
        self.env = env
        self.start_timeout = start_timeout
        self.expect_start = expect_start
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._seen = threading.Condition()
        self._reader: threading.Thread | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['HTTPService']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['GRPCInferenceService']}"

    @property
    def log(self) -> str:
        with self._seen:
            return "".join(self.lines)

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._seen:
                self.lines.append(line)
                m = _STARTED.search(line)
                if m:
                    self.ports[m.group(1)] = int(m.group(3))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def start(self) -> ServeProcess:
        """Starts the server and waits until both endpoints are up (or it exits)."""
        cmd = [sys.executable, "-m", "stubhost", "serve", "--model-repository", str(self.repository),
               "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--http-port", "0",
               "--grpc-port", "0", "--metrics-port", "0", *self.extra]
        if self.command is not None:
            cmd = list(self.command)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=self.env)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self.expect_start:
            return self
        wanted = {"HTTPService", "GRPCInferenceService"}
        for flag, service in (("--allow-http", "HTTPService"), ("--allow-grpc", "GRPCInferenceService")):
            if flag in self.extra and not self._flag(flag):
                wanted.discard(service)
        deadline = time.monotonic() + self.start_timeout
        with self._seen:
            while not wanted <= set(self.ports):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"stubhost serve exited with {self.proc.returncode}:\n{''.join(self.lines)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"stubhost serve did not start:\n{''.join(self.lines)}")
                self._seen.wait(min(left, 0.2))
        return self

    def _flag(self, name: str) -> bool:
        i = list(self.extra).index(name)
        return str(self.extra[i + 1]).lower() in ("1", "true", "yes", "on")

    def segments(self) -> set[str]:
        """This server's pool segments in /dev/shm."""
        assert self.proc is not None
        return {n for n in os.listdir(SHM_DIR) if n.startswith(f"stubhost_{self.proc.pid}_")}

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait, and return the exit code (kills it if it does not stop in time)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"stubhost serve did not stop within {timeout} s:\n{self.log}") from None
        return self.proc.returncode

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Waits for a server that should end by itself (a failed start-up)."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def __enter__(self) -> ServeProcess:
        try:
            return self.start()
        except BaseException:
            self._kill()
            self._close_log()
            raise

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _close_log(self) -> None:
        if self._reader is not None:
            self._reader.join(10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            code = self.stop()
        finally:
            self._kill()
            self._close_log()
        leaked = self.segments()
        for name in leaked:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except FileNotFoundError:
                pass
        if exc_type is None:
            assert code == 0, f"stubhost serve exited with {code}:\n{self.log}"
            assert not leaked, f"stubhost serve left segments: {sorted(leaked)}"
