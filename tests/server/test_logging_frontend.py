"""One log stream, as tritonserver writes it: `stubhost serve`'s lines in Triton's formats, a
model's Logger lines, prints and failures in them, and the logging extension (HTTP /v2/logging,
gRPC LogSettings) changing what is shown while the server runs. tritonclient is the client.

Expected lines follow Triton (common/src/logging.cc, python_backend pb_stub.cc, server
docs/protocol/extension_logging.md): ``I1123 16:39:47.123456 <pid> model.py:12] "message"``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model
from tests.server.frontend_support import Conn, error_of, expect_status, proto_json
from tests.server.serve_process import ServeProcess

CHATTY_PY = """
import json
import sys
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            token = json.loads(request.parameters() or "{}").get("token", "none")
            pb_utils.Logger.log_verbose(f"verbose-{token}")
            pb_utils.Logger.log_info(f"info-{token}")
            print(f"print-{token}", "two", sep="|")
            print(f"stderr-{token}\\nsecond line", file=sys.stderr)
            if token.startswith("fail"):
                raise ValueError(f"boom-{token}")
            if token.startswith("thread"):
                worker = threading.Thread(target=self.explode, args=(token,), name=f"worker-{token}")
                worker.start()
                worker.join()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses

    def explode(self, token):
        raise RuntimeError(f"thread-boom-{token}")
"""
CHATTY_CONFIG = config_pbtxt("chatty", [io("INPUT0", "TYPE_FP32", [-1])], [io("OUTPUT0", "TYPE_FP32", [-1])])

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
            "log_format": "default"}
# <level><month><day> <hour>:<min>:<sec>.<usec> <pid> <file>:<line>] <message>
DEFAULT_LINE = re.compile(r"^([IWE])(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) (\d+) ([^ :\]]+):(\d+)\] (.*)$")
# <year>-<month>-<day>T<hour>:<min>:<sec>Z <level> <pid> <file>:<line>] <message>
ISO8601_LINE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z ([IWE]) (\d+) ([^ :\]]+):(\d+)\] (.*)$")
TABLE_LINE = re.compile(r"^[+|]")


def model_line(text: str) -> int:
    """The line number in model.py of the first line that contains `text`."""
    return next(i for i, line in enumerate(CHATTY_PY.splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("logging") / "models"
    write_model(repo, "chatty", CHATTY_PY, CHATTY_CONFIG)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServeProcess]:
    with ServeProcess(repo) as srv:
        yield srv


@pytest.fixture(autouse=True)
def default_settings(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts and ends with tritonserver's default settings."""
    yield
    if "server" in request.fixturenames:
        srv = request.getfixturevalue("server")
        client = httpclient.InferenceServerClient(srv.http_url)
        try:
            assert client.update_log_settings({k: v for k, v in DEFAULTS.items() if k != "log_file"}) == DEFAULTS
        finally:
            client.close()


def infer(conn: Conn, token: str) -> None:
    x = conn.input("INPUT0", np.arange(3, dtype=np.float32))
    conn.client.infer("chatty", [x], parameters={"token": token})


def http_conn(server: ServeProcess) -> Conn:
    return Conn.open("http", server)


def wait_for_line(server: ServeProcess, pattern: str, timeout: float = 10.0) -> str:
    """The first log line that matches `pattern` (a regex), waiting for it to be written."""
    regex = re.compile(pattern)

    def found() -> str | None:
        return next((line for line in server.log.splitlines() if regex.search(line)), None)

    assert wait_until(found, timeout), f"no line matches {pattern!r} in:\n{server.log[-4000:]}"
    line = found()
    assert line is not None
    return line


def lines_with(server: ServeProcess, text: str) -> list[str]:
    return [line for line in server.log.splitlines() if text in line]


def settings_of(conn: Conn, answer: Any) -> dict[str, Any]:
    """A settings answer as plain values (gRPC's comes as LogSettingsResponse)."""
    if conn.protocol == "http":
        return answer
    return {name: next(iter(value.values())) for name, value in proto_json(answer)["settings"].items()}


def token() -> str:
    return f"t{time.monotonic_ns()}"


# ---- the format --------------------------------------------------------------------------------
def test_every_line_is_in_triton_s_default_format(server: ServeProcess) -> None:
    conn = http_conn(server)
    mark = token()
    infer(conn, mark)
    conn.close()
    wait_for_line(server, f'"stderr-{mark}')
    wait_for_line(server, "Started Metrics Service")  # start-up waits for HTTP and gRPC only
    lines = server.log.splitlines()
    start_up = lines[:next(i for i, line in enumerate(lines) if "Started Metrics Service" in line) + 1]
    # (Other tests may have switched the format meanwhile: only start-up and this test's lines count.)
    for line in start_up + [line for line in lines if mark in line]:
        m = DEFAULT_LINE.match(line)
        assert m or TABLE_LINE.match(line), f"not a Triton line: {line!r}"
        if m:
            assert int(m.group(8)) == server.proc.pid  # type: ignore[union-attr]
            assert 1 <= int(m.group(2)) <= 12 and 1 <= int(m.group(3)) <= 31
    # The model table is written as is after its preamble, as Triton writes it.
    table_at = next(i for i, line in enumerate(lines) if line.startswith("+---"))
    assert DEFAULT_LINE.match(lines[table_at - 1]).group(11) == ""  # type: ignore[union-attr]
    assert "| chatty | 1       | READY  |" in lines


def test_server_lines_quote_their_message(server: ServeProcess) -> None:
    line = wait_for_line(server, r"Started HTTPService at ")
    assert re.search(r' cli\.py:\d+\] "Started HTTPService at 127\.0\.0\.1:\d+"$', line), line


def test_model_lines_carry_the_model_file_and_line_one_record_per_call(server: ServeProcess) -> None:
    conn = http_conn(server)
    mark = token()
    infer(conn, mark)
    conn.close()
    info = wait_for_line(server, f'"info-{mark}"')
    assert re.match(rf'^I\d{{4}} [\d:.]+ {server.proc.pid} model\.py:{model_line("log_info(")}\] "info-{mark}"$',
                    info), info
    printed = wait_for_line(server, f'"print-{mark}')
    assert printed.endswith(f' model.py:{model_line("sep=")}] "print-{mark}|two"'), printed  # one print, one line
    assert printed.startswith("I")
    stderr = wait_for_line(server, f'"stderr-{mark}')
    assert stderr.startswith("W"), stderr  # stderr: warnings, tracebacks
    assert stderr.endswith(f' model.py:{model_line("file=sys.stderr")}] "stderr-{mark}\\nsecond line"'), stderr
    assert len(lines_with(server, f"stderr-{mark}")) == 1  # two lines printed, one record, one line


# ---- verbose level and the levels ---------------------------------------------------------------
def test_verbose_lines_appear_only_while_the_verbose_level_is_at_least_one(server: ServeProcess, conn: Conn) -> None:
    before = token()
    infer(conn, before)
    wait_for_line(server, f'"info-{before}"')  # the stub sent the verbose line before it
    assert not lines_with(server, f"verbose-{before}")

    answer = settings_of(conn, conn.client.update_log_settings({"log_verbose_level": 1}))
    assert answer == {**DEFAULTS, "log_verbose_level": 1}
    during = token()
    infer(conn, during)
    line = wait_for_line(server, f'"verbose-{during}"')
    assert line.startswith("I") and f' model.py:{model_line("log_verbose(")}] ' in line  # Triton: verbose is "I"

    assert settings_of(conn, conn.client.update_log_settings({"log_verbose_level": 0}))["log_verbose_level"] == 0
    after = token()
    infer(conn, after)
    wait_for_line(server, f'"info-{after}"')
    assert not lines_with(server, f"verbose-{after}")


def test_log_info_false_hides_info_lines_but_not_warnings_or_verbose(server: ServeProcess, conn: Conn) -> None:
    conn.client.update_log_settings({"log_info": False, "log_verbose_level": 1})
    assert settings_of(conn, conn.client.get_log_settings())["log_info"] is False
    mark = token()
    infer(conn, mark)
    wait_for_line(server, f'"stderr-{mark}')
    assert lines_with(server, f'"verbose-{mark}"')  # as in Triton, only the verbose level gates verbose lines
    assert not lines_with(server, f"info-{mark}") and not lines_with(server, f"print-{mark}")


def test_the_format_can_change_while_the_server_runs(server: ServeProcess, conn: Conn) -> None:
    conn.client.update_log_settings({"log_format": "ISO8601"})
    mark = token()
    infer(conn, mark)
    line = wait_for_line(server, f'"info-{mark}"')
    m = ISO8601_LINE.match(line)
    assert m and m.group(7) == "I" and m.group(9) == "model.py", line


# ---- failures ----------------------------------------------------------------------------------
def test_an_exception_in_execute_is_one_error_record_with_its_traceback(server: ServeProcess) -> None:
    conn = http_conn(server)
    mark = "fail" + token()
    error = error_of(infer, conn, mark)
    conn.close()
    assert f"ValueError: boom-{mark}" in error.message()
    line = wait_for_line(server, f"boom-{mark}")
    # Triton's stub logs every failed execute at ERROR (pb_stub.cc), traceback ("At:" frames) included.
    assert re.match(rf"^E\d{{4}} [\d:.]+ {server.proc.pid} runtime\.py:\d+\] \"Failed to process the request\(s\) "
                    rf"for model 'chatty_[\d_]+', message: ValueError: boom-{mark}\\n\\nAt:\\n  \S*model\.py"
                    rf"\({model_line('raise ValueError')}\): execute\\n", line), line
    assert len(lines_with(server, f"boom-{mark}")) == 1  # one record, one line


def test_an_exception_that_ends_a_model_thread_is_one_warning_record(server: ServeProcess) -> None:
    conn = http_conn(server)
    mark = "thread" + token()
    infer(conn, mark)
    conn.close()
    line = wait_for_line(server, f"thread-boom-{mark}")
    assert line.startswith("W"), line
    assert f'] "Exception in thread worker-{mark}:\\nTraceback (most recent call last):\\n' in line, line
    assert line.endswith(f'RuntimeError: thread-boom-{mark}"'), line
    assert len(lines_with(server, f"thread-boom-{mark}")) == 1


# ---- the extension ------------------------------------------------------------------------------
def test_settings_answer_every_setting(conn: Conn) -> None:
    assert settings_of(conn, conn.client.get_log_settings()) == DEFAULTS


def test_logging_is_listed_in_the_server_metadata(conn: Conn) -> None:
    meta = conn.client.get_server_metadata()
    extensions = meta["extensions"] if conn.protocol == "http" else list(meta.extensions)
    assert "logging" in extensions


@pytest.mark.parametrize(("settings", "http", "grpc_code", "message"), [
    ({"log_warnings": True}, 400, "INVALID_ARGUMENT", "unknown log setting 'log_warnings'"),
    ({"log_format": "json"}, 400, "INVALID_ARGUMENT", "invalid argument for log_format, got: json"),
    ({"log_verbose_level": 1, "log_format": "json"}, 400, "INVALID_ARGUMENT", "invalid argument for log_format"),
    ({"log_file": "/tmp/elsewhere.log"}, 501, "UNIMPLEMENTED",
     "log file location can not be updated through network protocol"),
], ids=["unknown-name", "bad-format", "all-or-nothing", "log-file"])
def test_bad_settings_are_refused_and_change_nothing(conn: Conn, settings: dict[str, Any], http: int, grpc_code: str,
                                                     message: str) -> None:
    error = error_of(conn.client.update_log_settings, settings)
    expect_status(conn, error, http, grpc_code)
    assert message in error.message()
    assert settings_of(conn, conn.client.get_log_settings()) == DEFAULTS


@pytest.mark.parametrize(("body", "message"), [
    ({"log_info": "yes"}, "expect boolean for 'log_info'"),
    ({"log_verbose_level": -1}, "expect uint32 for 'log_verbose_level'"),
    ({"log_verbose_level": 1.5}, "expect uint32 for 'log_verbose_level'"),
    ({"log_format": 8601}, "expect string for 'log_format'"),
    (["log_info", False], "the request body must be a JSON object"),
])
def test_http_values_of_the_wrong_type_are_400(server: ServeProcess, body: Any, message: str) -> None:
    request = urllib.request.Request(f"http://{server.http_url}/v2/logging", data=json.dumps(body).encode(),
                                     method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400
    assert json.loads(info.value.read()) == {"error": message}
    info.value.close()


def test_http_null_values_change_nothing_and_other_methods_are_405(server: ServeProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.update_log_settings({"log_info": None, "log_file": None}) == DEFAULTS
    client.close()
    request = urllib.request.Request(f"http://{server.http_url}/v2/logging", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 405
    info.value.close()


def test_grpc_values_must_use_the_member_of_their_type(server: ServeProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.LogSettingsRequest()
        request.settings["log_info"].string_param = "true"
        with pytest.raises(grpc.RpcError) as info:
            stub.LogSettings(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "expect boolean for 'log_info'"
        request = service_pb2.LogSettingsRequest()
        request.settings["log_verbose_level"].uint32_param = 2
        answer = stub.LogSettings(request, timeout=10)
        assert answer.settings["log_verbose_level"].uint32_param == 2
        assert answer.settings["log_format"].string_param == "default"


# ---- a log file, ISO8601 at start-up, restricted endpoints -------------------------------------
@pytest.fixture(scope="module")
def file_server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, Path]]:
    path = tmp_path_factory.mktemp("logfile") / "server.log"
    srv = ServeProcess(repo, "--log-file", str(path), "--log-format", "ISO8601",
                       "--http-restricted-api", "logging:admin-key=s3cret",
                       "--grpc-restricted-protocol", "logging:admin-key=s3cret", expect_start=False)
    with srv:
        started = re.compile(r"Started (HTTPService|GRPCInferenceService) at \S+:(\d+)")

        def ports() -> bool:
            text = path.read_text() if path.exists() else ""
            srv.ports.update({m.group(1): int(m.group(2)) for m in started.finditer(text)})
            return len(srv.ports) == 2 or srv.proc.poll() is not None  # type: ignore[union-attr]

        assert wait_until(ports, 60.0) and len(srv.ports) == 2, srv.log + (path.read_text() if path.exists() else "")
        yield srv, path


def test_the_log_file_gets_every_line_in_iso8601(file_server: tuple[ServeProcess, Path]) -> None:
    srv, path = file_server
    conn = http_conn(srv)
    mark = token()
    infer(conn, mark)
    conn.close()
    assert wait_until(lambda: f'"stderr-{mark}' in path.read_text(), 10.0), path.read_text()
    for line in path.read_text().splitlines():
        m = ISO8601_LINE.match(line)
        assert m or TABLE_LINE.match(line), f"not a Triton ISO8601 line: {line!r}"
    assert "Started HTTPService" not in srv.log  # nothing goes to stderr


def test_the_logging_endpoints_are_guarded_by_the_logging_group(file_server: tuple[ServeProcess, Path]) -> None:
    srv, _ = file_server
    http = httpclient.InferenceServerClient(srv.http_url)
    error = error_of(http.get_log_settings)
    assert error.status() == "403" and "expecting header 'admin-key'" in error.message()
    error = error_of(http.update_log_settings, {"log_verbose_level": 1})
    assert error.status() == "403"
    answer = http.get_log_settings(headers={"admin-key": "s3cret"})
    assert answer == {**DEFAULTS, "log_file": str(file_server[1]), "log_format": "ISO8601"}
    http.close()
    rpc = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        rpc.update_log_settings({"log_verbose_level": 1})
    assert "UNAVAILABLE" in str(info.value.status()) and "restricted" in info.value.message()
    ok = {"triton-grpc-protocol-admin-key": "s3cret"}
    assert rpc.get_log_settings(headers=ok).settings["log_file"].string_param == str(file_server[1])
    rpc.close()
