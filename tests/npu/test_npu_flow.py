"""FastaNPUAutotuner through torch_npu's own flow, over a stand-in torch_npu (tests/npu/standin; no Ascend here).

The stand-in mirrors the seams test_contract.py checks against the published
wheels; each scenario runs in a fresh process, as torch_npu's switch and
slot are process state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fasta_sm.backends.replay import load_table
from fasta_sm.store import StateStore

HERE = Path(__file__).resolve().parent
SWITCHES = ("FASTAUTOTUNE", "FASTA_SM_NPU", "FASTA_SM_NPU_SETTINGS", "ENABLE_PRINT_UB_BITS", "STANDIN_BACKEND_ERROR",
            "TORCH_DEVICE_BACKEND_AUTOLOAD")


def scenario(name, table_file, state_dir, stderr=None, **env):
    clean = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    clean["PYTHONPATH"] = os.pathsep.join([str(HERE / "standin"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(HERE / "flow_child.py"), name, str(table_file), str(state_dir)],
                          capture_output=True, text=True, timeout=120, env={**clean, **env})
    assert done.returncode == 0, done.stderr
    if stderr is not None:
        stderr.append(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_kernel_is_tuned_once_its_winner_recorded_as_torch_npu_records_it(table_file, state_dir):
    seen = scenario("tune", table_file, state_dir)
    table = load_table(table_file)
    (state_file,) = StateStore(state_dir).state_files()
    state = StateStore.read(state_file)
    assert seen["class"] == "FastaNPUAutotuner" and state.done
    assert "/npu-ccAscend910B3-cores48/" in state.key, "the key names the NPU's cores"
    assert seen["worker_compiles"] < seen["n"] and seen["compiles"] < seen["n"], "not every config compiled"
    winner = state.configs[state.best]
    assert seen["best"] == {**winner.kwargs, "num_warps": winner.num_warps} and seen["ran"] == winner.kwargs
    assert state.best_us <= min(table.mean_us[i] for i in (0, 5)), "never slower than the expert configs"
    assert seen["saved"] == 1 and seen["benches"] == state.evaluations()
    assert seen["benches_after_second_run"] == seen["benches"], "a tuned kernel is not timed again"


def test_a_kernel_whose_configs_carry_torch_npus_split_tuples_is_tuned(table_file, state_dir):
    """torch_npu's `_triton_config_npu_index_legacy` sets `split_axis` and `split_blocks` as tuples on every
    config: such a kernel is tuned, not left untuned with a warning and narrowed to its expert configs."""
    seen = scenario("tune_split", table_file, state_dir)
    (state_file,) = StateStore(state_dir).state_files()
    state = StateStore.read(state_file)
    assert seen["class"] == "FastaNPUAutotuner" and state.done
    assert seen["compiles"] < seen["n"], "not every config compiled"
    winner = state.configs[state.best]
    assert winner.kwargs["split_axis"] == "(0,)" and winner.kwargs["split_blocks"] == f"({winner.kwargs['BLOCK_M']},)"
    assert seen["best"] == {"BLOCK_M": winner.kwargs["BLOCK_M"], "BLOCK_N": winner.kwargs["BLOCK_N"],
                            "num_warps": winner.num_warps}
    assert seen["ran"]["split_blocks"] == [winner.kwargs["BLOCK_M"]], "the winner launched is torch_npu's own config"


def test_a_kernel_reads_the_settings_once_when_it_is_built(table_file, state_dir):
    assert scenario("tune", table_file, state_dir)["settings_reads"] == 1


def test_kernels_fasta_sm_declines_are_built_as_torch_npus_own_autotuner(table_file, state_dir):
    seen = scenario("declined", table_file, state_dir)
    assert {k: v for k, v in seen.items() if not k.startswith("deterministic_reduction")} == {
        "runtime_blocks": "NPUFastAutotuner", "switched_off": "NPUFastAutotuner",
        "deterministic_pointwise": "FastaNPUAutotuner"}


def test_a_deterministic_reduction_gets_torch_npus_untimed_class_over_its_expert_configs_not_fastas_timed_one(
        table_file, state_dir):
    # torch_npu's NPUCachingAutotuner launches the first config that compiles for it; its NPUFastAutotuner
    # would time the configs, and the numerics would follow a timing
    seen = scenario("declined", table_file, state_dir)
    assert seen["deterministic_reduction"] == "NPUCachingAutotuner"
    assert seen["deterministic_reduction_configs"] == [True, True]  # configs 0 and 5, torch_npu's own


def test_a_lower_npu_device_limit_is_another_tune(table_file, state_dir):
    whole, limited = (scenario("device_limit", table_file, state_dir, STANDIN_CORES=cores)["key"]
                      for cores in ("48", "24"))
    assert "-cores48/" in whole and "-cores24/" in limited


def test_a_space_fasta_sm_cannot_key_is_narrowed_to_the_expert_configs(table_file, state_dir):
    seen = scenario("not_convertible", table_file, state_dir)
    table = load_table(table_file)
    assert seen["configs"] == [{**table.configs[i].kwargs, "num_warps": table.configs[i].num_warps} for i in (0, 5)]


def test_disable_puts_back_torch_npus_class_switch_and_environment(table_file, state_dir):
    seen = scenario("disable", table_file, state_dir)
    assert seen["slot"] == "NPUFastAutotuner" and seen["switch"] is False
    assert seen["env"] == {"FASTAUTOTUNE": None, "FASTA_SM_NPU": None, "ENABLE_PRINT_UB_BITS": None}


def test_disable_leaves_torch_npus_class_pickled_by_its_own_name(table_file, state_dir):
    assert scenario("disable", table_file, state_dir)["pickled_by_fasta_sm"] is False


def test_a_parent_that_called_disable_after_its_worker_built_the_kernel_times_the_expert_configs(
    table_file, state_dir
):
    seen = scenario("disable_after_the_worker", table_file, state_dir)
    assert seen == {"benches": 2, "plan": False}  # expert configs #0 and #5, not a tune


def test_a_kernel_a_worker_built_as_torch_npus_own_class_stays_torch_npus_in_the_parent(table_file, state_dir):
    """torch_npu starts Inductor's compile workers with TORCH_DEVICE_BACKEND_AUTOLOAD=0, so fasta-sm's entry point
    does not run there: the worker's NPUFastAutotuner, pickled by its slot's name, must not unpickle in the parent
    as fasta-sm's class with no tune (neither fasta-sm's search nor torch_npu's)."""
    logs: list[str] = []
    seen = scenario("worker_without_fasta_sm", table_file, state_dir, stderr=logs)
    assert seen["worker"] == "NPUFastAutotuner" and seen["parent"] == "NPUFastAutotuner" and seen["ran"]
    assert logs[0].count("fasta-sm was not installed") == 1


def test_a_compile_worker_without_fasta_sms_entry_point_builds_fasta_sms_class_from_the_kernels_hook(
    table_file, state_dir
):
    """torch_npu starts its compile workers with TORCH_DEVICE_BACKEND_AUTOLOAD=0: the import fasta-sm writes into
    the kernel's source installs the class there, so the worker plans and compiles R1 and the parent finishes it."""
    seen = scenario("hooked_worker", table_file, state_dir)
    (state_file,) = StateStore(state_dir).state_files()
    state = StateStore.read(state_file)
    assert seen["worker"]["kind"] == "FastaNPUAutotuner" and seen["worker"]["plan"]
    assert seen["parent"] == "FastaNPUAutotuner" and state.done and seen["ran"]
    assert 0 < seen["worker"]["compiles"] < len(state.configs), "the worker compiled R1, not every config"
    assert seen["benches"] == state.evaluations(), "the parent timed the tune, and nothing else"


def test_a_kernel_a_hooked_worker_leaves_to_torch_npu_pickles_back_to_the_parent_as_torch_npus_own(
    table_file, state_dir
):
    """A compile worker pickles each kernel back to its parent. One fasta-sm leaves to torch_npu (runtime block
    arguments: in torch_npu 2.13/2.14, every NPUIndexTritonKernel with a split axis) is torch_npu's
    NPUFastAutotuner, whose name finds fasta-sm's class in the slot there: pickle refused it, failing the compile."""
    seen = scenario("hooked_worker_runtime_blocks", table_file, state_dir)
    assert seen == {"worker": "NPUFastAutotuner", "parent": "NPUFastAutotuner"}


def test_a_kernel_fasta_sm_left_to_torch_npu_in_a_hooked_worker_is_not_blamed_on_a_missing_fasta_sm(
    table_file, state_dir
):
    """fasta-sm was installed in that worker and chose torch_npu's class: a warning that it was not would send its
    reader after the wrong cause."""
    logs: list[str] = []
    scenario("hooked_worker_runtime_blocks", table_file, state_dir, stderr=logs)
    assert "fasta-sm was not installed" not in logs[0]


def test_a_worker_with_unusable_settings_leaves_its_kernels_to_torch_npu_without_blaming_a_missing_fasta_sm(
    table_file, state_dir
):
    """Under FASTA_SM_NPU=1 the parent installs fasta-sm's class whatever its settings, and a kernel it cannot use
    them for is torch_npu's: a worker must do the same, or its kernels, pickled by the slot's name, read in the
    parent as built where fasta-sm was never installed, a second warning naming the wrong cause."""
    logs: list[str] = []
    seen = scenario("hooked_worker_unusable_settings", table_file, state_dir, stderr=logs, FASTA_SM_NPU="1",
                    FASTA_SM_NPU_SETTINGS="{not json")
    assert seen == {"worker": "NPUFastAutotuner", "parent": "NPUFastAutotuner"}
    assert "fasta-sm was not installed" not in logs[0]


def test_a_kernels_key_is_the_same_with_or_without_the_hook_in_its_source(table_file, state_dir):
    assert scenario("hooked_worker", table_file, state_dir)["key_ignores_the_hook"]


@pytest.mark.parametrize("env", [{}, {"STANDIN_NO_FASTA_SM": "1"}], ids=["fasta-sm off", "fasta-sm not installed"])
def test_a_kernel_source_with_the_hook_loads_as_torch_npus_where_fasta_sm_is_not_on(env, table_file, state_dir):
    seen = scenario("hooked_source_elsewhere", table_file, state_dir, **env)
    assert seen == {"class": "NPUFastAutotuner", "slot": "NPUFastAutotuner"}


@pytest.mark.parametrize("env", [{}, {"STANDIN_CODEGEN_FIRST": "1"}], ids=["codegen after", "codegen before"])
def test_enable_writes_the_hook_once_into_each_kernel_classs_imports_and_disable_takes_it_out(env, table_file,
                                                                                              state_dir):
    seen = scenario("codegen_patch", table_file, state_dir, **env)
    assert seen == {"enabled": [1, 1], "enabled_twice": [1, 1], "disabled": [0, 0]}


@pytest.mark.parametrize(("case", "missing"), [("old_bench", "runtime_blocks"), ("no_slot_class", "NPUFastAutotuner")])
def test_a_torch_npu_without_a_seam_fasta_sm_drives_is_refused_naming_it_with_its_switch_put_back(
    case, missing, table_file, state_dir
):
    seen = scenario(case, table_file, state_dir)
    assert missing in seen["error"] and seen["switch"] is False


def test_fasta_sm_npu_alone_lets_torch_npu_import_and_installs_the_class(table_file, state_dir):
    seen = scenario("autoload", table_file, state_dir, FASTA_SM_NPU="1")
    assert seen["slot"] == "FastaNPUAutotuner"


def test_fasta_sm_npu_with_the_users_print_ub_bits_at_0_lets_torch_npu_import_and_installs_the_class(
    table_file, state_dir
):
    """With FASTAUTOTUNE=1, which the entry point sets, torch_npu 2.13/2.14 fail at import where ENABLE_PRINT_UB_BITS
    reads 0 (their warning calls `log.warnings`; it would then set the variable to 1): keeping the user's 0 broke
    every torch.compile of a process that, without fasta-sm, compiled fine."""
    seen = scenario("autoload", table_file, state_dir, FASTA_SM_NPU="1", ENABLE_PRINT_UB_BITS="0")
    assert seen["slot"] == "FastaNPUAutotuner"


def test_disable_before_torch_npu_loads_its_slot_keeps_fasta_sm_npu_from_installing_the_class(table_file, state_dir):
    seen = scenario("autoload_then_disable", table_file, state_dir, FASTA_SM_NPU="1")
    assert seen["slot"] == "NPUFastAutotuner"


def test_fasta_sm_npu_alone_writes_the_hook_into_kernels_generated_before_torch_npu_loads_its_slot(
    table_file, state_dir
):
    """torch_npu imports its slot only to build a kernel, which a parent with a compile pool first does after
    generating its first graph's kernels: were the hook written only once the class is installed, their workers
    would build every one of them as torch_npu's own."""
    seen = scenario("autoload_codegen", table_file, state_dir, FASTA_SM_NPU="1")
    assert seen == {"slot_loaded": False, "hooked": [1, 1]}


def test_disable_before_torch_npu_loads_its_codegen_keeps_fasta_sm_npu_from_writing_the_hook(table_file, state_dir):
    seen = scenario("autoload_codegen", table_file, state_dir, FASTA_SM_NPU="1", STANDIN_DISABLE_FIRST="1")
    assert seen["hooked"] == [0, 0]


def test_fasta_sm_npu_alone_installs_the_class_when_its_own_import_loads_torch_npus_slot(table_file, state_dir):
    seen = scenario("autoload_then_import_the_class", table_file, state_dir, FASTA_SM_NPU="1")
    assert seen["is_ours"] is True


def test_an_install_that_fails_inside_torch_npus_import_warns_and_lets_the_import_finish(table_file, state_dir):
    logs: list[str] = []
    seen = scenario("install_fails", table_file, state_dir, stderr=logs, FASTA_SM_NPU="1")
    assert seen["slot"] == "NPUFastAutotuner" and logs[0].count("could not install its autotuner") == 1


def test_a_torch_npu_that_fails_to_load_its_backend_leaves_the_environment_as_it_was(table_file, state_dir):
    seen = scenario("enable_fails", table_file, state_dir, STANDIN_BACKEND_ERROR="1")
    assert "triton-ascend" in seen["error"]
    assert seen["env"] == {"FASTAUTOTUNE": None, "FASTA_SM_NPU": None, "ENABLE_PRINT_UB_BITS": None}


def test_a_tune_that_fails_warns_once_and_falls_back_to_torch_npus_own_configs(table_file, state_dir):
    logs: list[str] = []
    seen = scenario("tune_fails", table_file, state_dir, stderr=logs)
    assert seen["class"] == "FastaNPUAutotuner" and seen["ran"]
    assert logs[0].count("using torch_npu's own configs") == 1 and "Inductor" not in logs[0]


@pytest.mark.parametrize("env", [{"FASTA_SM_NPU_SETTINGS": "null"}, {"FASTA_SM_NPU_SETTINGS": "{not json"},
                                 {"FASTA_SM_LOCK_TIMEOUT": "abc"}, {"FASTA_SM_NPU_SETTINGS": '{"policy": "nope"}'},
                                 {"FASTA_SM_NPU_SETTINGS": '{"seed": "x"}'},
                                 {"FASTA_SM_NPU_SETTINGS": '{"state_dir": 5}'},
                                 {"FASTA_SM_NPU_SETTINGS": '{"state_dir": ""}'}])
def test_unusable_settings_leave_every_kernel_to_torch_npu_with_one_warning(env, table_file, state_dir):
    logs: list[str] = []
    seen = scenario("unusable_settings", table_file, state_dir, stderr=logs, FASTA_SM_NPU="1", **env)
    assert seen["classes"] == ["NPUFastAutotuner", "NPUFastAutotuner"]
    assert logs[0].count("settings are not usable") == 1


def test_fasta_sm_npu_with_the_users_fastautotune_off_leaves_compile_workers_to_torch_npus_own_autotuner(
    table_file, state_dir
):
    """FASTAUTOTUNE=0 keeps torch_npu's FastA off, so the parent never loads the slot fasta-sm's class goes in: the
    kernel's hook must not install it in a worker either, turning torch_npu's switch on there (its FastA tile
    generator, then fasta-sm's class), where the parent builds the same kernel as torch_npu's NPUCachingAutotuner."""
    seen = scenario("hooked_worker_switch_off", table_file, state_dir, FASTA_SM_NPU="1", FASTAUTOTUNE="0")
    assert seen["here"] == "NPUCachingAutotuner" and seen["worker"] == "NPUCachingAutotuner"


def test_fasta_sm_npu_with_the_users_fastautotune_off_stays_off_in_the_parent_after_a_workers_kernel(
    table_file, state_dir
):
    """A worker's kernel built as fasta-sm's would import fasta-sm's class in the parent when unpickled, and with it
    torch_npu's slot, which installs it there too: every kernel after it tuned by fasta-sm, the user's switch lost."""
    seen = scenario("hooked_worker_switch_off", table_file, state_dir, FASTA_SM_NPU="1", FASTAUTOTUNE="0")
    assert seen["parent"] == "NPUCachingAutotuner" and seen["here_after"] == "NPUCachingAutotuner"
