"""The stub's stdout/stderr (ModelOutput): one record per print() or complete write, located at the
code that printed; and Logger outside a stub (Python logging with the caller's file and line)."""

from __future__ import annotations

import inspect
import io
import logging
import threading
from collections.abc import Iterator

import pytest

from stubhost.backend_utils import logger as logger_module
from stubhost.backend_utils.logger import Logger, LogLevel, ModelOutput, set_log_sink

Sent = tuple[str, LogLevel, str, int]


@pytest.fixture
def sent() -> Iterator[list[Sent]]:
    records: list[Sent] = []
    set_log_sink(lambda message, level, path, line: records.append((message, level, path, line)))
    yield records
    set_log_sink(logger_module._log_to_python)


@pytest.fixture
def out() -> ModelOutput:
    return ModelOutput(io.StringIO(), LogLevel.WARNING, limit=64)


def here() -> int:
    """The line number of the caller."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def test_one_print_is_one_record_whatever_it_prints(sent: list[Sent], out: ModelOutput) -> None:
    print("a", 2, "b\nc", sep="|", file=out)
    line = here() - 1
    assert sent == [("a|2|b\nc", LogLevel.WARNING, __file__, line)]


def test_text_without_a_newline_waits_for_the_rest_of_its_line(sent: list[Sent], out: ModelOutput) -> None:
    print("progress", end="", file=out)
    line = here() - 1
    assert sent == []
    print(" done", file=out)
    assert sent == [("progress done", LogLevel.WARNING, __file__, line)]


def test_flush_sends_unfinished_text(sent: list[Sent], out: ModelOutput) -> None:
    print("partial", end="", file=out, flush=True)
    assert [s[0] for s in sent] == ["partial"]
    out.flush()
    assert len(sent) == 1


def test_an_empty_print_is_an_empty_record(sent: list[Sent], out: ModelOutput) -> None:
    print(file=out)
    assert [s[0] for s in sent] == [""]


def test_text_that_reaches_the_limit_is_sent_as_it_is(sent: list[Sent], out: ModelOutput) -> None:
    out.write("x" * 40)
    out.write("y" * 40)
    assert [s[0] for s in sent] == ["x" * 40 + "y" * 40]


def test_each_thread_s_text_stays_together(sent: list[Sent], out: ModelOutput) -> None:
    gate = threading.Barrier(2)

    def write(name: str) -> None:
        out.write(name + "-start ")
        gate.wait()
        out.write(name + "-end\n")

    threads = [threading.Thread(target=write, args=(n,)) for n in ("t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(s[0] for s in sent) == ["t1-start t1-end", "t2-start t2-end"]


def test_drain_sends_every_thread_s_unfinished_text(sent: list[Sent], out: ModelOutput) -> None:
    thread = threading.Thread(target=out.write, args=("left behind",))
    thread.start()
    thread.join()
    out.write("mine")
    out.drain()
    assert sorted(s[0] for s in sent) == ["left behind", "mine"]


def test_it_behaves_as_a_text_stream(out: ModelOutput) -> None:
    original = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    stream = ModelOutput(original, LogLevel.INFO)
    assert stream.writable() and not stream.isatty()
    assert stream.encoding == "utf-8" and stream.buffer is original.buffer
    with pytest.raises(TypeError):
        stream.write(b"bytes")  # type: ignore[arg-type]


def test_logger_outside_a_stub_logs_to_python_with_the_caller_s_file_and_line(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="stubhost.model")
    Logger.log_warn("careful")
    line = here() - 1
    [record] = [r for r in caplog.records if r.name == "stubhost.model"]
    assert (record.getMessage(), record.levelno, record.pathname, record.lineno) == \
        ("careful", logging.WARNING, __file__, line)
