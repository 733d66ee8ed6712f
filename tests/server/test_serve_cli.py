"""`stubhost serve` as a command: endpoint switches, start-up failures, signals and exit codes.

Each test runs its own server process; every one of them must end with nothing left behind (no
server or stub process, no /dev/shm segment of its pid).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.host.repo_factory import child_stub_pids, pid_alive, wait_until
from tests.host.test_load_errors import attempts, flaky_repo
from tests.server.frontend_support import Conn, build_repository, proto_json
from tests.server.serve_process import ServeProcess


@pytest.fixture(scope="module")
def good_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("cli") / "models", "add_sub", "slow")


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("cli_broken") / "models", "add_sub", "broken")


def assert_clean_exit(srv: ServeProcess, children: set[int]) -> None:
    """The server's stubs are gone and no segment of its pid is left in /dev/shm."""
    assert wait_until(lambda: not any(pid_alive(p) for p in children), 10), \
        f"stub processes outlived the server: {[p for p in children if pid_alive(p)]}"
    assert not srv.segments(), f"segments left: {sorted(srv.segments())}"


def run_serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stubhost", "serve", *args], capture_output=True, text=True,
                          timeout=timeout)


def add_sub_works(client_module, url: str) -> None:
    client = client_module.InferenceServerClient(url)
    try:
        a = np.arange(4, dtype=np.float32)
        inputs = [client_module.InferInput("INPUT0", [4], "FP32").set_data_from_numpy(a),
                  client_module.InferInput("INPUT1", [4], "FP32").set_data_from_numpy(a)]
        np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
    finally:
        client.close()


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else is listening on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


# ---- endpoint switches ---------------------------------------------------------------------------
def test_allow_http_false_starts_only_grpc(good_repo: Path):
    with ServeProcess(good_repo, "--allow-http", "false") as srv:
        assert set(srv.ports) == {"GRPCInferenceService"}
        assert "HTTPService" not in srv.log
        add_sub_works(grpcclient, srv.grpc_url)


def test_allow_grpc_false_starts_only_http(good_repo: Path):
    with ServeProcess(good_repo, "--allow-grpc", "false") as srv:
        assert set(srv.ports) == {"HTTPService"}
        assert "GRPCInferenceService" not in srv.log
        add_sub_works(httpclient, srv.http_url)


# ---- start-up failures -----------------------------------------------------------------------------
def test_broken_model_fails_start_up(broken_repo: Path):
    srv = ServeProcess(broken_repo, expect_start=False)
    srv.start()
    try:
        code = srv.wait_exit(60)
    finally:
        srv._kill()
        srv._close_log()
    assert code == 1, srv.log
    # Triton's lines: the failure with its version, the table of every model, then the end.
    assert re.search(r"failed to load 'broken' version 1: Internal: RuntimeError: broken on purpose", srv.log)
    assert re.search(r"\| broken +\| 1 +\| UNAVAILABLE: Internal: RuntimeError: broken on purpose", srv.log)
    assert re.search(r"\| add_sub +\| 1 +\| READY", srv.log)
    assert "error: creating server: Internal - failed to load all models" in srv.log
    assert "stubhost" not in srv.log.split("broken on purpose", 1)[1].split("|", 1)[0], "only the model's frames"
    assert not srv.ports, "no endpoint may start when a model fails to load"
    assert not srv.segments(), sorted(srv.segments())


def test_exit_on_error_false_serves_the_rest(broken_repo: Path):
    with ServeProcess(broken_repo, "--exit-on-error", "false") as srv:
        for protocol in ("http", "grpc"):
            conn = Conn.open(protocol, srv)
            try:
                assert conn.client.is_server_live()
                assert not conn.client.is_server_ready()
                assert conn.client.is_model_ready("add_sub")
                assert not conn.client.is_model_ready("broken")
                answer = conn.client.get_model_repository_index()
                entries = answer if protocol == "http" else proto_json(answer).get("models", [])
                states = {e["name"]: e for e in entries}
                assert states["add_sub"]["state"] == "READY"
                assert states["broken"].get("state", "") != "READY"
                assert "broken on purpose" in states["broken"].get("reason", ""), states["broken"]
            finally:
                conn.close()
            add_sub_works(httpclient if protocol == "http" else grpcclient,
                          srv.http_url if protocol == "http" else srv.grpc_url)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_load_retry_count_retries_loads_at_start_up_and_through_the_repository_api(tmp_path: Path,
                                                                                          protocol: str):
    repo = flaky_repo(tmp_path, 2)  # initialize fails on its first two attempts
    srv = ServeProcess(repo, "--model-control-mode", "explicit", "--load-model", "flaky",
                       "--model-load-retry-count", "2")
    with srv:
        children = child_stub_pids(srv.proc.pid)
        conn = Conn.open(protocol, srv)
        try:
            assert conn.client.is_server_ready() and attempts(repo) == 3
            for attempt in (1, 2):  # each failed attempt is in the log, with its error
                assert f"(attempt {attempt} of 3), trying again:" in srv.log
                assert f"failed on attempt {attempt} (flaky-41)" in srv.log
            (repo / "flaky" / "attempts").write_text("1")
            conn.client.load_model("flaky")  # attempt 2 fails, attempt 3 loads
            assert attempts(repo) == 3 and conn.client.is_model_ready("flaky")
            (repo / "flaky" / "attempts").write_text("-5")
            with pytest.raises(conn.mod.InferenceServerException, match=r"failed on attempt -2 \(flaky-41\)"):
                conn.client.load_model("flaky")  # attempts -4, -3 and -2 fail: the last one's error
            assert attempts(repo) == -2
        finally:
            conn.close()
        assert "has no effect" not in srv.log
    assert_clean_exit(srv, children)


def test_a_negative_model_load_retry_count_is_refused(good_repo: Path):
    done = run_serve("--model-repository", str(good_repo), "--model-load-retry-count", "-1")
    assert done.returncode == 2
    assert "error: --model-load-retry-count must be at least 0" in done.stderr


# ---- the rate limiter ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def limited_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """add_sub, whose instance needs one copy of resource R per execution."""
    repo = build_repository(tmp_path_factory.mktemp("cli_limited") / "models", "add_sub")
    config = repo / "add_sub" / "config.pbtxt"
    text = config.read_text()
    assert text.count("kind: KIND_CPU") == 1
    config.write_text(text.replace("kind: KIND_CPU", 'kind: KIND_CPU rate_limiter { resources [ { name: "R" '
                                                     "count: 1 } ] priority: 2 }"))
    return repo


def test_rate_limit_flags_start_a_limited_server(limited_repo: Path):
    srv = ServeProcess(limited_repo, "--rate-limit", "execution_count", "--rate-limit-resource", "R:1",
                       "--rate-limit-resource=R:3:1")
    with srv:
        children = child_stub_pids(srv.proc.pid)
        add_sub_works(httpclient, srv.http_url)
        add_sub_works(grpcclient, srv.grpc_url)
        assert "Rate limit mode: EXEC_COUNT; resources given: R:1, R:3:1" in srv.log
        assert "has no effect" not in srv.log
    assert_clean_exit(srv, children)


def test_a_model_that_needs_more_than_the_rate_limit_resource_gives_fails_start_up(limited_repo: Path):
    done = run_serve("--model-repository", str(limited_repo), "--http-port", "0", "--grpc-port", "0",
                     "--metrics-port", "0", "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                     "--rate-limit=execution_count", "--rate-limit-resource=R:0")
    assert done.returncode == 1, done.stderr
    assert ("failed to load 'add_sub': Resource count for \"R\" is limited to 0 which "
            "will prevent scheduling of one or more model instances, the minimum required count is 1") in done.stderr
    assert "error: creating server: Internal - failed to load all models" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flags, words", [
    (["--rate-limit", "sometimes"], 'error: Bad option: "--rate-limit". invalid argument for --rate-limit'),
    (["--rate-limit-resource", "R"], 'error: Bad option: "--rate-limit-resource". --rate-limit-resource option '
                                     "format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. "
                                     "Got R"),
    (["--rate-limit-resource=R:x"], 'error: Bad option: "--rate-limit-resource". Invalid option value. Got x'),
    (["--rate-limit", "off", "--rate-limit-resource=R:1:2:3"], "Got R:1:2:3"),  # checked even when off
])
def test_bad_rate_limit_values_are_refused(limited_repo: Path, flags: list[str], words: str):
    done = run_serve("--model-repository", str(limited_repo), *flags)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_repository_fails(tmp_path: Path):
    done = run_serve("--model-repository", str(tmp_path / "nowhere"), "--http-port", "0", "--grpc-port", "0",
                     "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1")
    assert done.returncode == 1, done.stderr
    assert "nowhere" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_flag_fails_clearly(good_repo: Path):
    done = run_serve("--model-repository", str(good_repo), "--no-such-flag", "3")
    assert done.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_flag_value_fails_clearly(good_repo: Path):
    done = run_serve("--model-repository", str(good_repo), "--allow-http", "perhaps")
    assert done.returncode == 2
    assert "--allow-http" in done.stderr and "perhaps" in done.stderr


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port"])
def test_port_in_use_fails_clearly(good_repo: Path, busy_port: int, flag: str):
    srv = ServeProcess(good_repo, flag, str(busy_port), expect_start=False)
    srv.start()
    try:
        code = srv.wait_exit(60)
    finally:
        srv._kill()
        srv._close_log()
    assert code != 0, srv.log
    assert str(busy_port) in srv.log and "already in use" in srv.log, srv.log
    assert "Traceback" not in srv.log, srv.log
    assert not srv.segments(), sorted(srv.segments())


# ---- signals ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_cleanly(good_repo: Path, signum: int):
    srv = ServeProcess(good_repo)
    with srv:
        add_sub_works(httpclient, srv.http_url)
        add_sub_works(grpcclient, srv.grpc_url)
        children = child_stub_pids(srv.proc.pid)
        assert children and srv.segments()
        srv.proc.send_signal(signum)
        assert srv.proc.wait(30) == 0, srv.log
    assert_clean_exit(srv, children)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sigterm_lets_in_flight_requests_finish(good_repo: Path, tmp_path: Path, protocol: str):
    started = tmp_path / "started"
    srv = ServeProcess(good_repo)
    outcome: dict = {}
    with srv:
        children = child_stub_pids(srv.proc.pid)
        conn = Conn.open(protocol, srv)

        def run() -> None:
            x = conn.input("INPUT0", np.ones(2, np.float32))
            try:
                outcome["result"] = conn.client.infer("slow", [x], parameters={"sleep": 0.5, "touch": str(started)})
            except BaseException as e:  # noqa: BLE001
                outcome["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        assert wait_until(started.exists, 30)
        srv.proc.send_signal(signal.SIGTERM)
        thread.join(30)
        conn.close()
        assert srv.proc.wait(30) == 0, srv.log
    error = outcome.get("error")
    assert error is None, f"{type(error).__name__}: {error}\n{srv.log[-4000:]}"
    np.testing.assert_array_equal(outcome["result"].as_numpy("OUTPUT0"), np.ones(2, np.float32))
    assert_clean_exit(srv, children)


def test_second_signal_while_stopping(good_repo: Path):
    """SIGTERM then SIGINT at once: still one clean stop with exit code 0."""
    srv = ServeProcess(good_repo)
    with srv:
        children = child_stub_pids(srv.proc.pid)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        if srv.proc.poll() is None:
            srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(30) == 0, srv.log
    assert_clean_exit(srv, children)


def test_two_servers_side_by_side(good_repo: Path):
    """Nothing global stops two replicas on one host (ARCHITECTURE §7)."""
    with ServeProcess(good_repo) as one, ServeProcess(good_repo) as two:
        add_sub_works(httpclient, one.http_url)
        add_sub_works(httpclient, two.http_url)
        assert one.segments() and two.segments() and not (one.segments() & two.segments())


def test_idle_grpc_stream_does_not_hold_up_shutdown(good_repo: Path):
    """--exit-timeout-secs is what requests *in flight* get; a client's open stream with nothing in
    flight (clients keep streams open between requests) must not delay the stop by that much."""
    srv = ServeProcess(good_repo, "--exit-timeout-secs", "6")
    with srv:
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        collector: list = []
        client.start_stream(callback=lambda result, error: collector.append((result, error)))
        try:
            x = grpcclient.InferInput("INPUT0", [2], "FP32").set_data_from_numpy(np.ones(2, np.float32))
            client.async_stream_infer("slow", [x])
            assert wait_until(lambda: len(collector) == 1, 30) and collector[0][1] is None
            began = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            code = srv.proc.wait(30)
            took = time.monotonic() - began
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()
        assert code == 0, srv.log
        assert took < 3.0, f"stopping took {took:.1f} s with an idle stream open (exit timeout 6 s)"
