"""tritonserver's ``--metrics-config`` option, read as tritonserver 2.51 (release 24.10) reads it.

    --metrics-config summary_latencies=true             (repeatable: <setting>=<value>)
    --metrics-config summary_quantiles=0.5:0.05,0.9:0.01
    --metrics-config counter_latencies=false

The server's parser (src/command_line_parser.cc, ParseMetricsConfigOption) only checks the form
``<setting>=<value>``: a missing ``=``, a ``,`` before it, or an empty setting or value is a bad
option. The core (src/metric_model_reporter.cc, MetricReporterConfig::ParseConfig) then goes
through the entries in order and acts on exactly three:

- ``counter_latencies=false`` (exactly ``false``) drops the ``*_duration_us`` counters, and with
  them the per-model cache counters;
- ``summary_latencies=true`` (exactly ``true``) adds the latency summaries;
- ``summary_quantiles=<q>:<err>,...`` replaces the default quantiles if at least one pair reads
  (each pair that does not is logged at ERROR and skipped; numbers read as ``std::stod`` reads
  them, so ``0.0.1`` is 0.0).

Any other setting or value is taken and ignored by tritonserver. Here it is taken too, and
logged at WARNING as having no effect; so is ``histogram_latencies``, which came in 24.11.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stubhost.server.quantiles import WindowedSummary

# Triton's default quantiles (MetricReporterConfig::quantiles_): (quantile, error)
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001),
                                                      (0.999, 0.001))

# std::stod: leading white space, then the longest number (decimal, hex, inf, nan) it can read.
_STOD = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:"
                   r"0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
                   r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                   r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?"
                   r"|[nN][aA][nN](?:\([0-9A-Za-z_]*\))?))")


class MetricsFlagError(ValueError):
    """A malformed ``--metrics-config`` entry (a usage error)."""


@dataclass(frozen=True)
class MetricsConfig:
    """The metric options of ``--metrics-config`` (Triton's defaults).

    ``Server(metrics_config=...)`` takes one, and the metrics endpoint reads it from the server:
    ``counter_latencies`` keeps the ``*_duration_us`` counters (and the per-model cache counters),
    ``summary_latencies`` adds the latency summaries, with ``summary_quantiles`` as
    ``(quantile, error)`` pairs. ``report`` holds the lines to log at start-up: (level, text).
    """

    counter_latencies: bool = True
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    report: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def new_summary(self) -> WindowedSummary:
        """An empty latency summary with these quantiles, its window starting now."""
        return WindowedSummary(self.summary_quantiles, start_ns=time.monotonic_ns())

    def summary_factory(self) -> Callable[[], WindowedSummary] | None:
        """What makes each model version's latency summaries (None: summaries are off)."""
        return self.new_summary if self.summary_latencies else None


def _stod(text: str) -> float | None:
    """``std::stod(text)``: the number at the start of `text`. None where std::stod throws:
    std::invalid_argument (no number), or std::out_of_range (beyond double's range), which
    tritonserver does not catch there and aborts on."""
    match = _STOD.match(text)
    if match is None:
        return None
    number = match.group(1)
    plain = number.lower().lstrip("+-")
    if plain.startswith(("inf", "nan")):
        return float(number.split("(")[0])
    value = float.fromhex(number) if plain.startswith("0x") else float(number)
    digits = plain[2:].split("p")[0] if plain.startswith("0x") else plain.split("e")[0]
    if math.isinf(value) or (value == 0.0 and digits.strip("0.")):
        return None  # overflow or underflow: ERANGE
    return value


def parse_quantiles(text: str) -> tuple[list[tuple[float, float]], list[str]]:
    """``summary_quantiles``'s value as Triton reads it: the pairs it reads, and the ERROR lines
    it logs for the others (``<quantile>:<error>``, comma separated)."""
    pairs: list[tuple[float, float]] = []
    errors: list[str] = []
    items = text.split(",")
    if items and items[-1] == "":  # std::getline yields no empty last item
        items.pop()
    for item in items:
        colon = item.find(":")
        if colon < 0:
            errors.append(f"Invalid option: [{item}]. No ':' delimiter found. Expected format is <quantile>:<error>")
            continue
        quantile, error = _stod(item[:colon]), _stod(item[colon + 1:])
        if quantile is None or error is None:
            errors.append(f"Invalid option: [{item}]. Error: stod")
            continue
        pairs.append((quantile, error))
    return pairs, errors


def split_metrics_config(value: str) -> tuple[str, str]:
    """One ``--metrics-config`` value as (setting, value); raises MetricsFlagError as
    tritonserver's ParseMetricsConfigOption refuses it."""
    equals = value.find("=")
    setting, text = (value[:equals], value[equals + 1:]) if equals >= 0 else ("", "")
    if equals < 0 or "," in setting or not setting or not text:
        raise MetricsFlagError(f'Bad option: "--metrics-config". --metrics-config option format is '
                               f"<setting>=<value>. Got {value}")
    return setting, text


def parse_metrics_config(values: Sequence[str]) -> MetricsConfig:
    """The ``--metrics-config`` values, in order; raises MetricsFlagError for a malformed one."""
    counters, summaries, quantiles = True, False, DEFAULT_QUANTILES
    report: list[tuple[str, str]] = []
    for value in values:
        setting, text = split_metrics_config(value)
        why = ""
        if setting == "counter_latencies":
            counters = counters and text != "false"  # once off, a later entry does not turn them on
            why = "" if text in ("true", "false") else "tritonserver turns the counters off with exactly 'false'"
        elif setting == "summary_latencies":
            summaries = summaries or text == "true"
            why = "" if text in ("true", "false") else "tritonserver turns the summaries on with exactly 'true'"
        elif setting == "summary_quantiles":
            pairs, errors = parse_quantiles(text)
            report += [("ERROR", line) for line in errors]
            if pairs:
                quantiles = tuple(pairs)
            else:
                why = "no <quantile>:<error> pair could be read; the quantiles stay as they were"
        elif setting == "histogram_latencies":
            why = "tritonserver 2.51 has no latency histograms (nv_inference_first_response_histogram_ms came in 24.11)"
        else:
            why = "tritonserver ignores unknown metrics settings"
        if why:
            report.append(("WARNING", f"--metrics-config {setting}={text} is accepted and has no effect: {why}"))
    return MetricsConfig(counters, summaries, quantiles, tuple(report))
