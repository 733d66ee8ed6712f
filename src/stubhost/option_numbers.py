"""Integers in options and settings, read as tritonserver's C++ reads them (``std::stoi``).

Triton reads flag values and trace settings with ``std::stoi``: leading white space, an optional
sign, then the longest run of digits; the rest of the text is ignored. It throws
``invalid_argument`` when no digit starts the text and ``out_of_range`` outside a 32-bit int, and
tritonserver's option parser words the two as below. Callers add their own prefix or wording.
"""

from __future__ import annotations

import re

_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


class StoiError(ValueError):
    """``std::stoi`` failed; ``out_of_range`` says which of its two exceptions it threw. The
    message is tritonserver's ParseOption<int> text for it."""

    def __init__(self, text: str, out_of_range: bool) -> None:
        self.text = text
        self.out_of_range = out_of_range
        what = "Provided option value is out of bound" if out_of_range else "Invalid option value"
        super().__init__(f"{what}. Got {text}")


def stoi(text: str) -> int:
    """``std::stoi(text)``: the int at the start of `text`; raises StoiError where it throws."""
    match = _STOI.match(text)
    if match is None:
        raise StoiError(text, False)
    value = int(match.group(1))
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise StoiError(text, True)
    return value
