"""Specs for yes/no switches read from the environment: one reading everywhere, a typo never a silent off."""

from __future__ import annotations

import logging

import pytest

from fasta_sm import env
from fasta_sm.env import env_switch, switch_or_off
from fasta_sm.errors import SettingError


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each value warns once per process: each test starts from none warned."""
    env._warn_off.cache_clear()
    yield
    env._warn_off.cache_clear()


@pytest.mark.parametrize("text", ["1", "true", "Yes", " on "])
def test_a_yes_reads_as_on(text, monkeypatch):
    monkeypatch.setenv("FASTA_TEST_SWITCH", text)
    assert env_switch("FASTA_TEST_SWITCH") is True


@pytest.mark.parametrize("text", ["0", "false", "NO", "off"])
def test_a_no_reads_as_off_whatever_the_default(text, monkeypatch):
    monkeypatch.setenv("FASTA_TEST_SWITCH", text)
    assert env_switch("FASTA_TEST_SWITCH", default=True) is False


@pytest.mark.parametrize("text", [None, "", "  "])
def test_an_unset_or_empty_switch_takes_the_default(text, monkeypatch):
    if text is None:
        monkeypatch.delenv("FASTA_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("FASTA_TEST_SWITCH", text)
    assert env_switch("FASTA_TEST_SWITCH", default=True) is True


def test_a_value_that_is_neither_yes_nor_no_is_an_error_naming_the_variable_and_value(monkeypatch):
    monkeypatch.setenv("FASTA_TEST_SWITCH", "ture")
    with pytest.raises(SettingError, match=r"\$FASTA_TEST_SWITCH='ture' is neither a yes"):
        env_switch("FASTA_TEST_SWITCH")


def test_where_no_error_may_escape_a_bad_value_reads_as_off_with_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("FASTA_TEST_SWITCH", "maybe")
    with caplog.at_level(logging.WARNING, logger="fasta_sm.env"):
        assert switch_or_off("FASTA_TEST_SWITCH") is False
    assert "$FASTA_TEST_SWITCH='maybe'" in caplog.text and "ignored, as if unset" in caplog.text


def test_inductors_entry_point_with_a_misspelt_switch_leaves_inductor_alone_and_says_why(monkeypatch, caplog):
    import fasta_sm.inductor as fi

    arranged = []
    monkeypatch.setattr(fi, "call_after_import", lambda *args: arranged.append(args))
    monkeypatch.setenv(fi.ENV_VAR, "ture")
    with caplog.at_level(logging.WARNING, logger="fasta_sm.env"):
        fi.autoload()
    assert arranged == [] and f"${fi.ENV_VAR}='ture'" in caplog.text


def test_the_npu_entry_point_with_a_misspelt_switch_leaves_torch_npu_alone_and_says_why(monkeypatch, caplog):
    import fasta_sm.npu as fn

    monkeypatch.setenv(fn.ENV_VAR, "enabled")
    monkeypatch.delenv(fn.NPU_SWITCH_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger="fasta_sm.env"):
        fn.autoload()
        assert fn.current_settings() is None
    assert f"${fn.ENV_VAR}='enabled'" in caplog.text
    assert fn.NPU_SWITCH_ENV not in __import__("os").environ
