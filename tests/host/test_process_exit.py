"""The process that holds a Server dies (SIGKILL) or is asked to stop (SIGTERM): its stubs go with it
and nothing is left in /dev/shm.

The holder is a child interpreter that prints its stubs' pids and pool names as one JSON line and
then sleeps; its segments carry its own pid, so this file checks (and cleans) them explicitly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.host.repo_factory import SLEEPY_PY, copy_examples, pid_alive, shm_entries, sleepy_config, wait_until, \
    write_model

HOLDER = textwrap.dedent("""
    import json
    import sys
    import time

    import stubhost

    server = stubhost.Server(sys.argv[1])
    stubs = [inst for m in server._models.values() for inst in m.instances()]
    print(json.dumps({"pid": __import__("os").getpid(),
                      "stubs": [i.process.pid for i in stubs],
                      "pools": [i.process.pool.name for i in stubs]}), flush=True)
    if sys.argv[2] == "busy":  # a request in flight (for 1 s) when the signal comes
        import threading
        import numpy as np
        threading.Thread(target=server.infer, args=("sleepy", {"INPUT0": np.zeros(2, np.float32)}),
                         kwargs={"parameters": {"sleep": 1.0}}, daemon=True).start()
    while True:
        time.sleep(0.05)
""")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = copy_examples(tmp_path / "models", "add_sub", "string_upper")
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy", extra="instance_group [ { count: 2 } ]"))
    return repo


class Holder:
    """The child process holding a Server, and what it reported."""

    def __init__(self, tmp_path: Path, repo: Path, mode: str) -> None:
        script = tmp_path / "holder.py"
        script.write_text(HOLDER)
        self.proc = subprocess.Popen([sys.executable, str(script), str(repo), mode], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the holder exited with {self.proc.wait(10)} before reporting"
        self.report: dict[str, Any] = json.loads(line)
        self.stubs: list[int] = self.report["stubs"]
        self.pools: list[str] = [p.lstrip("/") for p in self.report["pools"]]
        self.prefix = f"stubhost_{self.proc.pid}_"

    def leftovers(self) -> tuple[list[int], set[str]]:
        """Stubs still running and the holder's segments still in /dev/shm."""
        return [p for p in self.stubs if pid_alive(p)], shm_entries(self.prefix)

    def clean_up(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        for pid in self.stubs:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name in shm_entries(self.prefix):
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except FileNotFoundError:
                pass


@pytest.fixture
def holder_factory(tmp_path: Path, repo: Path) -> Iterator[Any]:
    holders: list[Holder] = []

    def start(mode: str = "idle") -> Holder:
        holder = Holder(tmp_path, repo, mode)
        holders.append(holder)
        return holder

    yield start
    for holder in holders:
        holder.clean_up()


def test_holder_reports_its_stubs_and_pools(holder_factory: Any) -> None:
    holder = holder_factory()
    assert len(holder.stubs) == 4 and all(pid_alive(p) for p in holder.stubs)
    assert set(holder.pools) <= shm_entries(holder.prefix)


@pytest.mark.parametrize("mode", ["idle", "busy"])
def test_sigkill_of_the_holder_takes_its_stubs_and_segments_along(holder_factory: Any, mode: str) -> None:
    holder = holder_factory(mode)
    if mode == "busy":
        time.sleep(0.3)  # the request reaches a stub
    holder.proc.kill()
    holder.proc.wait(10)
    start = time.monotonic()
    gone = wait_until(lambda: not any(pid_alive(p) for p in holder.stubs), 1.5)
    elapsed = time.monotonic() - start
    stubs_left, _ = holder.leftovers()
    assert gone, f"stubs {stubs_left} still run {elapsed:.2f} s after the holder was killed"
    assert wait_until(lambda: not holder.leftovers()[1], 0.5), f"segments left: {holder.leftovers()[1]}"
    for pool in holder.pools:
        assert not os.path.exists(os.path.join("/dev/shm", pool))


@pytest.mark.parametrize("mode", ["idle", "busy"])
def test_sigterm_closes_the_server_and_terminates_the_holder(holder_factory: Any, mode: str) -> None:
    holder = holder_factory(mode)
    if mode == "busy":
        time.sleep(0.3)
    holder.proc.send_signal(signal.SIGTERM)
    try:
        code = holder.proc.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail("the holder did not exit on SIGTERM")
    assert code == -signal.SIGTERM  # it still dies of SIGTERM, as a process without handlers would
    stubs_left, segments_left = holder.leftovers()
    assert stubs_left == [], "stubs outlived the holder"
    assert segments_left == set(), "segments outlived the holder"
