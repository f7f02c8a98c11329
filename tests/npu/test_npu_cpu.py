"""What runs without torch_npu: the import boundary and the error that says what is missing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from fasta_sm.driver import DriverSettings
from fasta_sm.policies.fasta.params import LIVE_DEFAULTS


def test_import_fasta_sm_npu_needs_neither_torch_nor_torch_npu():
    code = "import sys, fasta_sm, fasta_sm.npu; print('torch' in sys.modules, 'torch_npu' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here")
def test_enable_without_torch_npu_raises_a_clear_error(monkeypatch):
    import fasta_sm.npu

    monkeypatch.delenv(fasta_sm.npu.ENV_VAR, raising=False)
    with pytest.raises(fasta_sm.npu.NPUUnavailable) as caught:
        fasta_sm.npu.enable()
    message = str(caught.value)
    assert "torch_npu" in message and "torch-npu" in message and "CANN" in message
    assert isinstance(caught.value, ImportError)
    assert fasta_sm.npu.current_settings() is None, "a failed enable() changes nothing"


@pytest.mark.parametrize("value", ["false", 2])
def test_optimize_configs_must_be_a_flag(value):
    import fasta_sm.npu

    with pytest.raises(ValueError, match=f"optimize_configs={value!r} must be True, False or None"):
        fasta_sm.npu.enable(optimize_configs=value)
    assert fasta_sm.npu.current_settings() is None


@pytest.mark.parametrize("params", [[("rounds", 1)], "abc"], ids=["pairs", "a string"])
def test_enable_refuses_policy_params_that_are_no_mapping_naming_them(params):
    import fasta_sm.npu

    with pytest.raises(ValueError, match=r"policy_params=.* must be a mapping of parameter names to values"):
        fasta_sm.npu.enable(policy_params=params)


def test_optimize_configs_false_switches_the_optimizer_off_whatever_the_environment_says(monkeypatch, tmp_path):
    import fasta_sm.npu

    monkeypatch.setenv("FASTA_CONFIG_OPTIMIZER", "1")
    handed: list[dict] = []

    def no_torch_npu():  # what enable() hands torch_npu's workers, read where it imports torch_npu
        handed.append(json.loads(os.environ[fasta_sm.npu.SETTINGS_ENV]))
        raise fasta_sm.npu.NPUUnavailable("no torch_npu here")

    monkeypatch.setattr(fasta_sm.npu, "_import_torch_npu", no_torch_npu)
    with pytest.raises(fasta_sm.npu.NPUUnavailable):
        fasta_sm.npu.enable(optimize_configs=False, state_dir=str(tmp_path))
    assert handed[0]["policy_params"]["optimize_configs"] is False


def test_hand_written_settings_that_leave_out_the_prior_take_the_prior_switch(monkeypatch):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.setenv(fasta_sm.npu.SETTINGS_ENV, json.dumps({"policy": "fasta"}))
    monkeypatch.setenv("FASTA_SM_PRIOR", "0")
    assert fasta_sm.npu.current_settings()["prior"] is False


def test_settings_reach_a_worker_through_the_environment(monkeypatch, tmp_path):
    import fasta_sm.npu

    settings = DriverSettings(policy="fasta", state_dir=str(tmp_path), policy_params={"optimize_configs": True})
    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.setenv(fasta_sm.npu.SETTINGS_ENV, json.dumps(settings.to_dict()))
    assert fasta_sm.npu.current_settings() == settings.to_dict()


def test_fasta_sm_npu_alone_takes_enables_defaults(monkeypatch):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.delenv(fasta_sm.npu.SETTINGS_ENV, raising=False)
    settings = fasta_sm.npu.current_settings()
    assert settings["compile_threads"] == DriverSettings.compile_threads and settings["state_dir"]
    assert settings["policy"] == "fasta" and settings["policy_params"] == LIVE_DEFAULTS


def test_settings_variable_set_to_blanks_is_unset(monkeypatch):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.setenv(fasta_sm.npu.SETTINGS_ENV, "  ")
    settings = fasta_sm.npu.current_settings()
    assert settings is not None, "blanks are no bad JSON: the variable is unset, as every other variable reads it"
    assert settings["policy"] == "fasta" and settings["policy_params"] == LIVE_DEFAULTS


def test_unreadable_settings_in_the_environment_leave_kernels_to_torch_npu(monkeypatch, caplog):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.setenv(fasta_sm.npu.SETTINGS_ENV, "{not json")
    assert fasta_sm.npu.current_settings() is None
    assert fasta_sm.npu.SETTINGS_ENV in caplog.text


def test_settings_in_the_environment_with_an_unknown_field_leave_kernels_to_torch_npu(monkeypatch, caplog):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.setenv(fasta_sm.npu.SETTINGS_ENV, json.dumps({"polcy": "random"}))
    assert fasta_sm.npu.current_settings() is None, "a misspelt setting is not dropped for its default"
    assert "'polcy'" in caplog.text


def test_settings_in_the_environment_whose_state_dir_is_a_file_leave_kernels_to_torch_npu(
    monkeypatch, caplog, tmp_path
):
    import fasta_sm.npu

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.setenv(fasta_sm.npu.SETTINGS_ENV, json.dumps({"state_dir": str(blocker)}))
    assert fasta_sm.npu.current_settings() is None
    assert f"state dir {blocker} exists and is not a directory" in caplog.text


def test_an_enable_without_torch_npu_makes_no_state_dir(tmp_path):
    import fasta_sm.npu

    with pytest.raises(fasta_sm.npu.NPUUnavailable):
        fasta_sm.npu.enable(state_dir=tmp_path / "tunes")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "setting",
    [{"chunk_size": 0}, {"policy": "no-such-policy"}, {"policy_params": {"no_such_knob": 1}}],
    ids=["an empty chunk", "an unknown policy", "an unknown knob"],
)
def test_a_refused_enable_makes_no_state_dir(tmp_path, setting):
    import fasta_sm.npu
    from fasta_sm.errors import FastaError

    with pytest.raises((ValueError, FastaError)):
        fasta_sm.npu.enable(state_dir=tmp_path / "tunes", **setting)
    assert not list(tmp_path.iterdir())


def test_settings_in_the_environment_that_give_their_lock_wait_need_no_usable_lock_timeout_variable(
    monkeypatch, tmp_path
):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.setenv("FASTA_SM_LOCK_TIMEOUT", "abc")
    monkeypatch.setenv(fasta_sm.npu.SETTINGS_ENV, json.dumps({"state_dir": str(tmp_path / "s"), "lock_timeout_s": 5}))
    assert fasta_sm.npu.current_settings() is not None


def test_fasta_sm_npu_alone_switches_torch_npus_fasta_path_on_before_torch_npu_reads_it(monkeypatch):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.delenv(fasta_sm.npu.NPU_SWITCH_ENV, raising=False)
    monkeypatch.setattr(fasta_sm.npu, "call_after_import", lambda module, hook: None)
    fasta_sm.npu.autoload()
    assert os.environ[fasta_sm.npu.NPU_SWITCH_ENV] == "1"


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here")
def test_a_failed_enable_leaves_the_environment_as_it_was(monkeypatch):
    import fasta_sm.npu

    names = (fasta_sm.npu.ENV_VAR, fasta_sm.npu.SETTINGS_ENV, fasta_sm.npu.NPU_SWITCH_ENV, fasta_sm.npu.UB_BITS_ENV)
    for name in names:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(fasta_sm.npu.NPUUnavailable):
        fasta_sm.npu.enable()
    assert not any(name in os.environ for name in names)


@pytest.mark.parametrize(("value", "prior"), [("0", False), ("1", True)])
def test_the_prior_switch_is_read_into_the_settings_workers_inherit(monkeypatch, value, prior):
    import fasta_sm.npu

    monkeypatch.setenv(fasta_sm.npu.ENV_VAR, "1")
    monkeypatch.delenv(fasta_sm.npu.SETTINGS_ENV, raising=False)
    monkeypatch.setenv("FASTA_SM_PRIOR", value)
    assert fasta_sm.npu.current_settings()["prior"] is prior
