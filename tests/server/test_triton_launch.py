"""A launch script written for tritonserver starts `stubhost serve` with one word changed.

The script below uses tritonserver's flags the way deployments do (``--flag=value``, repeated
repositories, poll mode, ``--backend-config``, flags that have no meaning here); the test swaps
the word ``tritonserver`` for ``stubhost serve`` and nothing else, then serves both
repositories over HTTP and gRPC through tritonclient, reloads an edited model by polling, and
refuses explicit loads with Triton's words.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.host.repo_factory import wait_until
from tests.host.test_model_control import constant_model
from tests.server.frontend_support import PROTOCOLS, Conn, error_of
from tests.server.serve_process import ServeProcess

LAUNCH_SCRIPT = """#!/bin/bash
set -e
exec tritonserver \\
    --model-repository=${REPO_A} \\
    --model-repository=${REPO_B} \\
    --http-address=127.0.0.1 --http-port=0 \\
    --grpc-address=127.0.0.1 --grpc-port=0 \\
    --metrics-port=0 --allow-metrics=true --allow-gpu-metrics=false --allow-cpu-metrics=true \\
    --model-control-mode=poll --repository-poll-secs=1 \\
    --strict-readiness=true --exit-on-error=true --strict-model-config=false \\
    --model-load-thread-count=2 \\
    --backend-config=python,shm-default-byte-size=1048576 \\
    --backend-config=python,shm-growth-byte-size=1048576 \\
    --backend-config=python,shm-message-queue-size=256 \\
    --backend-config=python,stub-timeout-seconds=30 \\
    --backend-config=default-max-batch-size=4 \\
    --pinned-memory-pool-byte-size=268435456 --cuda-memory-pool-byte-size=0:67108864 \\
    --id=production --http-thread-count=8 --exit-timeout-secs=10 \\
    --log-verbose=0 --log-info=true --log-warning=true --log-error=true --log-format=default
"""

def constant(conn: Conn, name: str) -> int:
    return int(conn.client.infer(name, [conn.input("INPUT0", np.zeros(1, np.int32))]).as_numpy("OUTPUT0")[0])


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("launch")
    repo_a, repo_b = root / "repo_a", root / "repo_b"
    constant_model(repo_a, "first", 1)
    constant_model(repo_b, "second", 2)
    script = root / "launch.sh"
    script.write_text(LAUNCH_SCRIPT.replace("tritonserver", f"{sys.executable} -m stubhost serve"))
    script.chmod(0o755)
    env = dict(os.environ, REPO_A=str(repo_a), REPO_B=str(repo_b))
    with ServeProcess(repo_a, command=["bash", str(script)], env=env) as srv:
        yield srv, repo_a, repo_b


@pytest.fixture(params=PROTOCOLS)
def conn(request: pytest.FixtureRequest, launched):
    c = Conn.open(request.param, launched[0])
    yield c
    c.close()


def test_the_script_changed_in_one_word_serves_both_repositories(conn: Conn, launched) -> None:
    assert conn.client.is_server_live() and conn.client.is_server_ready()
    assert (constant(conn, "first"), constant(conn, "second")) == (1, 2)


def test_the_id_is_the_servers_name_in_its_metadata(conn: Conn) -> None:
    metadata = conn.client.get_server_metadata()
    assert (metadata["name"] if conn.protocol == "http" else metadata.name) == "production"


def test_flags_without_meaning_here_are_reported_once(launched) -> None:
    srv = launched[0]
    log = srv.log
    for flag in ("--pinned-memory-pool-byte-size=268435456", "--http-thread-count=8", "--allow-gpu-metrics=false"):
        assert log.count(f"{flag} is accepted and has no effect") == 1, log
    assert "--backend-config python,shm-default-byte-size=1048576: applied" in log
    assert "--backend-config python,stub-timeout-seconds=30: accepted, no effect" in log
    assert "--backend-config default-max-batch-size=4: accepted, no effect" in log


def test_poll_mode_reloads_an_edited_model(conn: Conn, launched) -> None:
    _, repo_a, _ = launched
    value = 10 + PROTOCOLS.index(conn.protocol)
    constant_model(repo_a, "first", value)
    path = repo_a / "first" / "1" / "model.py"
    stamp = time.time_ns() + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))
    assert wait_until(lambda: constant(conn, "first") == value, 30.0, period=0.2)
    assert conn.client.is_server_ready()


def test_poll_mode_refuses_explicit_loads_with_tritons_words(conn: Conn) -> None:
    error = error_of(conn.client.load_model, "first")
    assert "explicit model load / unload is not allowed if polling is enabled" in error.message()


@pytest.mark.parametrize("flags, words", [
    (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert"),
    (["--grpc-use-ssl=maybe"], "expected a boolean, got 'maybe'"),
    (["--backend-config=python,shm-default-byte-size=lots"], "'lots' is not an integer"),
    (["--backend-config=python"], "expected <backend>,<setting>=<value>"),
    (["--model-control-mode=poll", "--repository-poll-secs=0"], "--repository-poll-secs must be positive"),
    (["--load-model=first"], "--load-model needs --model-control-mode=explicit"),
    (["--no-such-flag=1"], "unrecognized arguments: --no-such-flag=1"),
])
def test_bad_flags_stop_start_up_with_a_message(tmp_path: Path, flags: list[str], words: str) -> None:
    constant_model(tmp_path / "models", "first", 1)
    done = subprocess.run([sys.executable, "-m", "stubhost", "serve", f"--model-repository={tmp_path / 'models'}",
                           "--http-port=0", "--grpc-port=0", "--metrics-port=0", *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr, done.stderr
