"""Specs for numbers read from the environment: plain ASCII only, anything Python alone would read is an error."""

from __future__ import annotations

import math
import re
import sys

import pytest

from fasta_sm.env_numbers import real_from_env, whole_from_env
from fasta_sm.errors import SettingError


def refusal(text: str, what: str) -> str:
    """The start of the error for $FASTA_TEST_NUMBER set to `text`, as a pattern."""
    return "^" + re.escape(f"$FASTA_TEST_NUMBER={text!r} is not {what} in ASCII digits")


@pytest.mark.parametrize("text, value", [("0", 0), ("7", 7), ("012", 12), ("1000000", 1_000_000)])
def test_a_whole_number_in_ascii_digits_reads_as_its_value(text, value):
    assert whole_from_env("FASTA_TEST_NUMBER", text) == value


@pytest.mark.parametrize("text", ["1_0", " 10", "10 ", "10\n", "١٠", "１０", "+10", "-1", "1.0", "1e1", "0x10", ""],
                         ids=["underscore", "leading space", "trailing space", "trailing newline", "arabic-indic",
                              "fullwidth", "plus sign", "minus sign", "point", "exponent", "hex", "empty"])
def test_a_whole_number_in_any_other_form_is_refused_naming_the_variable_and_value(text):
    with pytest.raises(SettingError, match=refusal(text, "a whole number ≥ 0")):
        whole_from_env("FASTA_TEST_NUMBER", text)


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="this Python's int() has no digit limit")
def test_a_whole_number_past_pythons_digit_limit_is_refused_as_a_setting_error():
    with pytest.raises(SettingError, match=r"^\$FASTA_TEST_NUMBER='9+' is not a whole number"):
        whole_from_env("FASTA_TEST_NUMBER", "9" * 5000)


def test_a_whole_number_below_the_least_is_refused_naming_the_least():
    with pytest.raises(SettingError, match=r"^\$FASTA_TEST_NUMBER='0' is not a whole number ≥ 1"):
        whole_from_env("FASTA_TEST_NUMBER", "0", 1)


@pytest.mark.parametrize("text, value", [("0.5", 0.5), (".5", 0.5), ("5.", 5.0), ("5", 5.0), ("1e-3", 1e-3),
                                         ("2.5E+2", 250.0), ("0", 0.0)])
def test_a_decimal_number_with_an_optional_point_and_exponent_reads_as_its_value(text, value):
    assert real_from_env("FASTA_TEST_NUMBER", text) == value


@pytest.mark.parametrize("text", ["0.1_0", " 0.5", "0.5 ", "٠.٥", "0.５", "nan", "inf", "infinity", "-0.5", "+0.5",
                                  ".", "e3", "1e", "1e_3", "0x1p-2", "5%", ""],
                         ids=["underscore", "leading space", "trailing space", "arabic-indic", "fullwidth", "nan",
                              "inf", "infinity", "minus sign", "plus sign", "point alone", "exponent alone",
                              "exponent without digits", "underscore in the exponent", "hex float", "percent",
                              "empty"])
def test_a_decimal_number_in_any_other_form_is_refused_naming_the_variable_and_value(text):
    with pytest.raises(SettingError, match=refusal(text, "a number ≥ 0")):
        real_from_env("FASTA_TEST_NUMBER", text)


def test_inf_reads_as_infinity_where_the_setting_takes_one():
    assert math.isinf(real_from_env("FASTA_TEST_NUMBER", "inf", infinite=True))


@pytest.mark.parametrize("text", ["infinity", "Inf", " inf", "nan"])
def test_only_inf_spells_infinity_where_the_setting_takes_one(text):
    with pytest.raises(SettingError, match=refusal(text, "a number ≥ 0") + ".*, or inf$"):
        real_from_env("FASTA_TEST_NUMBER", text, infinite=True)


@pytest.mark.parametrize("infinite", [False, True], ids=["finite setting", "setting that takes inf"])
def test_a_decimal_number_too_large_for_a_float_is_refused_not_read_as_infinity(infinite):
    with pytest.raises(SettingError, match=r"^\$FASTA_TEST_NUMBER='1e999' is too large"):
        real_from_env("FASTA_TEST_NUMBER", "1e999", infinite=infinite)
