"""stubhost.logs: Triton's line format, the log settings and their rules, the serve flags, and the
stub's pipe lines. The expected lines come from Triton's common/src/logging.cc (UTC time, E/W/I,
JSON-escaped message) and its docs/protocol/extension_logging.md."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path

import pytest

from stubhost import logs
from stubhost.logs import LogControl, LogSettings, LogSettingsError, TritonFormatter

CREATED = 1700000000.123456  # 2023-11-14 22:13:20.123456 UTC


def make_record(message: str = "hello", level: int = logging.INFO, *, args: tuple = (), **extra: object
                ) -> logging.LogRecord:
    record = logging.LogRecord("stubhost", level, "/models/add_sub/1/model.py", 12, message, args, None)
    record.created = CREATED
    record.process = 4242
    record.__dict__.update(extra)
    return record


def formatter(log_format: str = "default", *, escape: bool = True) -> TritonFormatter:
    control = LogControl("stubhost.tests.formatter")
    control.apply(LogSettings(log_format=log_format))
    return TritonFormatter(control, escape=escape)


# ---- the line format ------------------------------------------------------------------------------
def test_default_format_is_level_mmdd_utc_time_with_microseconds_pid_file_and_line() -> None:
    assert formatter().format(make_record()) == 'I1114 22:13:20.123456 4242 model.py:12] "hello"'


def test_iso8601_format_puts_the_utc_time_first_and_has_no_fraction() -> None:
    assert formatter("ISO8601").format(make_record()) == '2023-11-14T22:13:20Z I 4242 model.py:12] "hello"'


@pytest.mark.parametrize(("level", "letter"), [(logging.DEBUG, "I"), (5, "I"), (logging.INFO, "I"),
                                               (logging.WARNING, "W"), (logging.ERROR, "E"), (logging.CRITICAL, "E")])
def test_level_letters_are_triton_s_three_and_verbose_lines_are_i(level: int, letter: str) -> None:
    assert formatter().format(make_record(level=level)).startswith(letter + "1114 ")


def test_a_message_is_one_json_string_so_a_record_is_one_line() -> None:
    line = formatter().format(make_record('two\nlines, "quoted", a \\ and \u00e9\t%s', args=("x",)))
    assert line.endswith(r'] "two\nlines, \"quoted\", a \\ and é\tx"')
    assert "\n" not in line


def test_escaping_can_be_turned_off_as_with_triton_s_environment_variable() -> None:
    line = formatter(escape=False).format(make_record("two\nlines"))
    assert line == "I1114 22:13:20.123456 4242 model.py:12] two\nlines"


def test_a_preformatted_block_is_written_as_is() -> None:
    table = "\n+---+\n| a |\n+---+"
    line = formatter().format(make_record(table, **logs.UNESCAPED))
    assert line == "I1114 22:13:20.123456 4242 model.py:12] " + table


def test_an_exception_s_traceback_is_part_of_the_one_line_message() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = make_record("it failed", level=logging.ERROR)
        record.exc_info = sys.exc_info()
    line = formatter().format(record)
    assert line.startswith('E1114 22:13:20.123456 4242 model.py:12] "it failed\\nTraceback (most recent call last):')
    assert line.endswith('ValueError: boom"') and "\n" not in line


def test_the_format_follows_the_settings_in_force() -> None:
    fmt = formatter()
    fmt.control.update({"log_format": "ISO8601"})
    assert fmt.format(make_record()).startswith("2023-11-14T22:13:20Z I ")


# ---- settings -------------------------------------------------------------------------------------
def test_defaults_are_tritonserver_s_in_the_extension_s_order() -> None:
    answer = LogSettings().as_dict()
    assert list(answer) == ["log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"]
    assert answer == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                      "log_verbose_level": 0, "log_format": "default"}


def test_changed_applies_only_what_is_named_and_skips_nulls() -> None:
    new = LogSettings().changed({"log_verbose_level": 3, "log_info": None, "log_format": "ISO8601"})
    assert new == LogSettings(log_verbose_level=3, log_format="ISO8601")


@pytest.mark.parametrize(("changes", "code", "message"), [
    ({"log_file": "/tmp/x.log"}, "UNSUPPORTED", "log file location can not be updated through network protocol"),
    ({"log_info": "true"}, "INVALID_ARG", "expect boolean for 'log_info'"),
    ({"log_warning": 1}, "INVALID_ARG", "expect boolean for 'log_warning'"),
    ({"log_error": None, "log_verbose_level": True}, "INVALID_ARG", "expect uint32 for 'log_verbose_level'"),
    ({"log_verbose_level": -1}, "INVALID_ARG", "expect uint32 for 'log_verbose_level'"),
    ({"log_verbose_level": 1 << 32}, "INVALID_ARG", "expect uint32 for 'log_verbose_level'"),
    ({"log_verbose_level": 1.0}, "INVALID_ARG", "expect uint32 for 'log_verbose_level'"),
    ({"log_format": 8601}, "INVALID_ARG", "expect string for 'log_format'"),
    ({"log_format": "iso8601"}, "INVALID_ARG", "invalid argument for log_format, got: iso8601"),
    ({"log_warnings": False}, "INVALID_ARG", "unknown log setting 'log_warnings'"),
    ({"bogus": None}, "INVALID_ARG", "unknown log setting 'bogus'"),
])
def test_bad_changes_are_refused_with_triton_s_words(changes: dict, code: str, message: str) -> None:
    with pytest.raises(LogSettingsError) as info:
        LogSettings().changed(changes)
    assert info.value.code == code
    assert info.value.message.startswith(message)


def test_a_refused_change_applies_nothing() -> None:
    control = LogControl("stubhost.tests.atomic")
    with pytest.raises(LogSettingsError):
        control.update({"log_verbose_level": 2, "log_info": False, "log_format": "json"})
    assert control.settings == LogSettings()


@pytest.mark.parametrize(("settings", "shown"), [
    (LogSettings(), {logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL}),
    (LogSettings(log_verbose_level=1), {logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL}),
    (LogSettings(log_verbose_level=2), {9, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR,
                                        logging.CRITICAL}),
    (LogSettings(log_info=False), {logging.WARNING, logging.ERROR, logging.CRITICAL}),
    # As in Triton, a verbose line is gated by the verbose level only, not by log_info.
    (LogSettings(log_info=False, log_verbose_level=1), {logging.DEBUG, logging.WARNING, logging.ERROR,
                                                         logging.CRITICAL}),
    (LogSettings(log_warning=False), {logging.INFO, logging.ERROR, logging.CRITICAL}),
    (LogSettings(log_error=False), {logging.INFO, logging.WARNING}),
    (LogSettings(log_info=False, log_warning=False, log_error=False), set()),
])
def test_which_levels_are_shown(settings: LogSettings, shown: set[int]) -> None:
    levels = {9, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL}
    assert {level for level in levels if settings.allows(level)} == shown
    # The logger's level lets through at least what is shown, and nothing below it.
    assert all(level >= settings.python_level() for level in shown)


def test_the_control_sets_the_logger_tree_s_level_at_run_time() -> None:
    control = LogControl("stubhost.tests.tree")
    child = logging.getLogger("stubhost.tests.tree.child")
    control.apply(LogSettings())
    assert not child.isEnabledFor(logging.DEBUG) and child.isEnabledFor(logging.INFO)
    control.update({"log_verbose_level": 1})
    assert child.isEnabledFor(logging.DEBUG)
    control.update({"log_verbose_level": 0, "log_info": False})
    assert not child.isEnabledFor(logging.INFO) and child.isEnabledFor(logging.WARNING)


def test_concurrent_updates_leave_one_consistent_state() -> None:
    control = LogControl("stubhost.tests.threads")

    def flip(i: int) -> None:
        for n in range(200):
            control.update({"log_verbose_level": (i + n) % 3, "log_info": bool(n % 2)})

    threads = [threading.Thread(target=flip, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert control.logger.level == control.settings.python_level()


# ---- the command line -----------------------------------------------------------------------------
def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    logs.add_log_arguments(parser)
    return parser.parse_args(argv)


def test_flags_default_to_tritonserver_s() -> None:
    assert logs.settings_from_args(parse()) == LogSettings()


def test_flags_set_every_setting() -> None:
    args = parse("--log-verbose", "2", "--log-info", "false", "--log-warning", "0", "--log-error", "off",
                 "--log-format", "ISO8601", "--log-file", "/tmp/server.log")
    assert logs.settings_from_args(args) == LogSettings("/tmp/server.log", False, False, False, 2, "ISO8601")


def test_a_negative_verbose_level_counts_as_zero() -> None:
    assert logs.settings_from_args(parse("--log-verbose=-3")).log_verbose_level == 0


@pytest.mark.parametrize("argv", [["--log-format", "json"], ["--log-info", "maybe"], ["--log-verbose", "x"]])
def test_bad_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_the_handler_appends_triton_lines_to_the_log_file(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("earlier run\n")
    control = LogControl("stubhost.tests.file")
    settings = logs.settings_from_args(parse("--log-file", str(path), "--log-format", "ISO8601"))
    handler = logs.log_handler(settings, control)
    control.apply(settings)
    log = control.logger
    log.addHandler(handler)
    log.propagate = False
    try:
        log.info("to the file")
        log.debug("not at verbose level 0")
        control.update({"log_verbose_level": 1})
        log.debug("at verbose level 1")
        control.update({"log_info": False})
        log.info("hidden by log_info")
    finally:
        log.removeHandler(handler)
        handler.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "earlier run"
    assert [line.split("] ", 1)[1] for line in lines[1:]] == ['"to the file"', '"at verbose level 1"']
    assert all(f"Z I {os.getpid()} test_logs.py:" in line for line in lines[1:])


def test_a_log_file_that_cannot_be_opened_ends_start_up(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        logs.log_handler(LogSettings(log_file=str(tmp_path / "missing" / "server.log")))
    assert "failed to open log file" in str(info.value.code)


# ---- stub -> parent lines ---------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["plain", "two\nlines", "tab\there", "back\\slash\\n", "cr\r\n", "", "\u00e9\u2603"])
def test_model_lines_round_trip(text: str) -> None:
    data = logs.encode_model_line(3, "/repo/m\t1/model.py", 42, text)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert logs.decode_model_line(data.decode().rstrip("\n")) == (logging.DEBUG, "/repo/m\t1/model.py", 42, text)


@pytest.mark.parametrize("line", ["ordinary output", logs.LOG_MARKER + "\t0\tno line number",
                                  logs.LOG_MARKER + "\tx\t1\tpath\ttext", logs.LOG_MARKER + "x\t0\t1\tp\tt"])
def test_other_lines_are_not_model_records(line: str) -> None:
    assert logs.decode_model_line(line) is None
