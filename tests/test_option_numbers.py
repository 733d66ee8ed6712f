"""stubhost.option_numbers: integers read as tritonserver's std::stoi reads them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stubhost.option_numbers import StoiError, stoi

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
SPACE = st.text(" \t\n\v\f\r", max_size=3)
TAIL = st.text(st.characters(blacklist_categories=("Nd",)), max_size=4)  # std::stoi stops at a non-digit


@given(INT32, SPACE, TAIL, st.booleans())
def test_reads_the_int_at_the_start_and_ignores_the_rest(value: int, space: str, tail: str, plus: bool) -> None:
    text = space + ("+" if plus and value >= 0 else "") + str(value) + tail
    assert stoi(text) == value


@given(st.one_of(st.integers(max_value=-(1 << 31) - 1), st.integers(min_value=1 << 31)))
def test_outside_int32_is_out_of_range_in_tritonservers_words(value: int) -> None:
    with pytest.raises(StoiError) as err:
        stoi(str(value))
    assert err.value.out_of_range
    assert str(err.value) == f"Provided option value is out of bound. Got {value}"


@pytest.mark.parametrize("text", ["", "x1", "+", "- 1", " ", "one"])
def test_no_leading_digit_is_invalid_in_tritonservers_words(text: str) -> None:
    with pytest.raises(StoiError) as err:
        stoi(text)
    assert not err.value.out_of_range
    assert str(err.value) == f"Invalid option value. Got {text}"
