"""tritonserver's trace flags, read as tritonserver reads them (server src/command_line_parser.cc).

    --trace-config triton,file=/tmp/trace.json    (repeatable: [<mode>,]<setting>=<value>)
    --trace-config triton,log-frequency=50
    --trace-config rate=100 --trace-config level=TIMESTAMPS --trace-config count=100
    --trace-file F --trace-level L --trace-rate N --trace-count N --trace-log-frequency N
                                                  (deprecated: the same settings, with a warning)

Global settings: ``level`` (repeatable, the levels add up; OFF, or ``false``/``off``, turns
tracing off whatever else is given), ``rate``, ``count`` and ``mode``; settings of the
``triton`` mode: ``file`` and ``log-frequency``; settings of the ``opentelemetry`` mode: ``url``,
``resource`` (repeatable, ``<key>=<value>``), ``bsp_max_queue_size``, ``bsp_schedule_delay`` and
``bsp_max_export_batch_size`` (the last three also from ``OTEL_BSP_MAX_QUEUE_SIZE``,
``OTEL_BSP_SCHEDULE_DELAY`` and ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``; a flag wins). A
``--trace-config`` value overrides the deprecated flag of the same setting. The settings of the
mode not in force are accepted and do nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stubhost.host.trace import TENSORS, TIMESTAMPS
from stubhost.option_numbers import StoiError, stoi
from stubhost.server.trace_otel import MISSING_PACKAGES, OtelSettings, available

_MODES = ("triton", "opentelemetry")


class TraceFlagError(ValueError):
    """A malformed or refused trace flag (reported as a usage error)."""


@dataclass
class TraceConfig:
    """What the flags ask for (Triton's defaults), and lines to log at start-up."""

    level: int = 0
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    opentelemetry: OtelSettings | None = None  # the mode's settings, when it is in force
    report: list[str] = field(default_factory=list)


def _int(text: str) -> int:
    """tritonserver's ParseOption<int>: std::stoi and its two failures."""
    try:
        return stoi(text)
    except StoiError as e:
        raise TraceFlagError(str(e)) from None


def _level(text: str) -> int:
    """One trace level value (0: tracing off)."""
    value = text.lower()
    if value in ("false", "off"):
        return 0
    if value in ("true", "on", "min", "max", "timestamps"):
        return TIMESTAMPS
    if value == "tensors":
        return TENSORS
    raise TraceFlagError(f"invalid value for trace level option: {text}")


def _mode(text: str) -> str:
    mode = text.lower()
    if mode not in _MODES:
        raise TraceFlagError(f'invalid value for trace mode option: {text}. Available options are "triton" and '
                             f'"opentelemetry"')
    return mode


def split_trace_config(value: str) -> tuple[str, str, str]:
    """``[<mode>,]<setting>=<value>`` as (mode or "", setting, value); raises TraceFlagError."""
    comma = value.find(",")
    if comma == 0:
        raise TraceFlagError(f"No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> "
                             f"or <setting>=<value>. Got {value}")
    equals = value.find("=", comma + 1)
    mode = ""
    if comma > 0:
        try:
            mode = _mode(value[:comma])
        except TraceFlagError as e:
            raise TraceFlagError(f'Bad option: "--trace-config". {e}') from None
    setting, text = value[comma + 1:equals] if equals >= 0 else "", value[equals + 1:] if equals >= 0 else ""
    if equals < 0 or not setting or not text:
        raise TraceFlagError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {value}")
    return mode, setting, text


def _deprecated(flag: str, instead: str) -> str:
    return f"'{flag}' has been deprecated and will be removed in future releases. Please use '{instead}' instead."


_BSP_ENVIRONMENT = {"bsp_max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE", "bsp_schedule_delay": "OTEL_BSP_SCHEDULE_DELAY",
                    "bsp_max_export_batch_size": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"}


def parse_trace_config(trace_config: Sequence[str], *, trace_file: str | None = None,
                       trace_level: Sequence[str] = (), trace_rate: str | None = None, trace_count: str | None = None,
                       trace_log_frequency: str | None = None,
                       environment: Mapping[str, str] | None = None) -> TraceConfig:
    """Reads the ``--trace-config`` values and the deprecated flags (and, for the opentelemetry
    mode, `environment`: os.environ unless given); raises TraceFlagError."""
    config = TraceConfig()
    for value in trace_config:  # the mode first: the other settings are read in its light
        mode, setting, text = split_trace_config(value)
        if mode == "" and setting == "mode":
            try:
                config.mode = _mode(text)
            except TraceFlagError as e:
                raise TraceFlagError(f'Bad option: "--trace-config mode". {e}') from None
    otel = config.mode == "opentelemetry"
    if otel and not available():
        raise TraceFlagError(f'Bad option: "--trace-config mode". {MISSING_PACKAGES}')
    off = False
    for flag, value, instead in (("--trace-file", trace_file, "--trace-config triton,file=<filepath>"),
                                 ("--trace-rate", trace_rate, "--trace-config rate=<rate value>"),
                                 ("--trace-count", trace_count, "--trace-config count=<count value>"),
                                 ("--trace-log-frequency", trace_log_frequency,
                                  "--trace-config triton,log-frequency=<log frequency value>")):
        if value is not None and otel and flag in ("--trace-file", "--trace-log-frequency"):
            config.report.append(f"Warning: '{flag}' is deprecated and will be ignored with opentelemetry tracing "
                                 f"mode. ")
        elif value is not None:
            config.report.append(_deprecated(flag, instead))
            try:
                if flag == "--trace-file":
                    config.file = value
                elif flag == "--trace-rate":
                    config.rate = _int(value) & 0xFFFFFFFF
                elif flag == "--trace-count":
                    config.count = _int(value)
                else:
                    config.log_frequency = _int(value) & 0xFFFFFFFF
            except TraceFlagError as e:
                raise TraceFlagError(f'Bad option: "{flag}". {e}') from None
    if trace_level:
        config.report.append(_deprecated("--trace-level", "--trace-config level=<OFF|TIMESTAMPS|TENSORS>"))
    for value in trace_level:
        try:
            level = _level(value)
        except TraceFlagError as e:
            raise TraceFlagError(f'Bad option: "--trace-level". {e}') from None
        off = off or level == 0
        config.level |= level
    if otel:
        config.opentelemetry = _environment_settings(os.environ if environment is None else environment)
    for value in trace_config:
        mode, setting, text = split_trace_config(value)
        try:
            off = _apply(config, mode, setting, text, value) or off
        except TraceFlagError as e:
            prefix = f"{mode}," if mode else ""
            raise TraceFlagError(f'Bad option: "--trace-config {prefix}{setting}". {e}') from None
    if off:
        config.level = 0
    if otel and config.level & TENSORS:
        config.report.append("Tensor level tracing is not supported by the mode: opentelemetry")
    return config


def _environment_settings(environment: Mapping[str, str]) -> OtelSettings:
    """The opentelemetry settings with the OTEL_BSP_* variables applied."""
    settings = OtelSettings()
    for setting, variable in _BSP_ENVIRONMENT.items():
        if environment.get(variable):
            try:
                setattr(settings, setting, _uint32(environment[variable]))
            except TraceFlagError as e:
                raise TraceFlagError(f'Bad option: "{variable}". {e}') from None
    return settings


def _uint32(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise TraceFlagError(f"invalid value: {text}, expected a number from 0 to {0xFFFFFFFF}")
    return value


def _apply(config: TraceConfig, mode: str, setting: str, text: str, value: str) -> bool:
    """Applies one ``--trace-config`` entry; True when it turns tracing off."""
    if mode == "":
        if setting == "mode":
            pass  # read first
        elif setting == "rate":
            config.rate = _int(text) & 0xFFFFFFFF
        elif setting == "count":
            config.count = _int(text)
        elif setting == "level":
            level = _level(text)
            config.level |= level
            return level == 0
        else:
            config.report.append(f"--trace-config {value}: accepted, no effect (unknown trace setting)")
        return False
    otel = config.opentelemetry
    if mode != config.mode:
        config.report.append(f"--trace-config {value}: accepted, no effect (the trace mode is '{config.mode}')")
    elif mode == "triton" and setting == "file":
        config.file = text
    elif mode == "triton" and setting == "log-frequency":
        config.log_frequency = _int(text) & 0xFFFFFFFF
    elif otel is not None and setting == "url":
        otel.url = text
    elif otel is not None and setting == "resource":
        key, _, resource = text.partition("=")  # split at the first '=', as Triton does
        otel.resource[key] = resource
    elif otel is not None and setting in _BSP_ENVIRONMENT:
        setattr(otel, setting, _uint32(text))
    elif otel is not None:
        otel.other[setting] = text  # kept, and shown by the trace extension, as Triton keeps it
    else:
        config.report.append(f"--trace-config {value}: accepted, no effect (unknown trace setting)")
    return False
