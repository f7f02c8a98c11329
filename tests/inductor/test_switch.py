"""enable()/disable(), the codegen rewrite and the dispatcher, against torch's real Inductor modules (CPU)."""

from __future__ import annotations

import ast
import os
import pickle
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl
from torch._inductor.codegen import triton as codegen_triton
from torch._inductor.runtime import triton_heuristics
from torch._inductor.runtime.hints import DeviceProperties
from triton.runtime.jit import JITFunction

import fasta_sm.inductor as fi
from fasta_sm.driver import DriverSettings
from fasta_sm.errors import PolicyError
from fasta_sm.inductor.autotuner import FastaCachingAutotuner
from fasta_sm.inductor.codegen import HOOK, rewrite_source, without_settings


def add_kernel_source(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = xindex < xnumel
    tl.store(out_ptr0 + xindex, tl.load(in_ptr0 + xindex, mask) + 1, mask)


# A JITFunction as a compile worker has it, even where the test session runs Triton's interpreter.
add_kernel = JITFunction(add_kernel_source)


H200 = DeviceProperties(type="cuda", index=0, multi_processor_count=132, cc=90, major=9,
                        regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                        max_threads_per_block=1024, warp_size=32)


def make_pointwise(tmp_path, settings=None, name="cabc123"):
    meta = {"kernel_name": "triton_poi_add_0", "autotune_local_cache": False, "autotune_remote_cache": False}
    if settings is not None:
        meta["fasta_sm"] = settings
    triton_meta = {"signature": {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32"},
                   "device": H200, "constants": {}, "configs": []}
    return triton_heuristics.pointwise(size_hints={"x": 1 << 20}, triton_meta=triton_meta,
                                       inductor_meta=meta, filename=str(tmp_path / f"{name}.py"))(add_kernel)


def snapshot():
    return (dict(vars(codegen_triton.TritonKernel)), dict(vars(triton_heuristics)), list(sys.meta_path))


def same(a, b):
    return a.keys() == b.keys() and all(a[k] is b[k] for k in a)


@pytest.fixture(autouse=True)
def switched_off():
    fi.disable()
    yield
    fi.disable()


def test_enable_disable_leaves_inductor_exactly_as_it_was(tmp_path):
    before = snapshot()
    fi.enable(state_dir=tmp_path)
    assert fi.is_enabled() and triton_heuristics.cached_autotune is not before[1]["cached_autotune"]
    fi.enable(state_dir=tmp_path, max_configs=8)  # again: new settings, patches not stacked
    fi.disable()
    after = snapshot()
    assert same(before[0], after[0]) and same(before[1], after[1]) and before[2] == after[2]
    assert not fi.is_enabled()
    fi.disable()  # a second disable is a no-op


def test_context_manager_restores_the_previous_switch(tmp_path):
    before = snapshot()
    with fi.enabled(state_dir=tmp_path, max_configs=8) as settings:
        assert fi.current_settings()["max_configs"] == 8 == settings.max_configs
    assert same(before[1], snapshot()[1]) and not fi.is_enabled()
    fi.enable(state_dir=tmp_path, max_configs=16)
    with fi.enabled(state_dir=tmp_path, max_configs=4):
        pass
    assert fi.current_settings()["max_configs"] == 16


def test_context_manager_switches_back_on_even_if_the_block_switched_off(tmp_path):
    fi.enable(state_dir=tmp_path, max_configs=16)
    patched = snapshot()
    with fi.enabled(state_dir=tmp_path, seed=5):
        fi.disable()
    assert fi.current_settings()["max_configs"] == 16 and same(patched[1], snapshot()[1])


@pytest.mark.parametrize("raw", ["0", "x", "1_0", "١٠", " 8"])
def test_a_bad_max_configs_from_the_environment_is_refused_naming_the_variable(raw, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTA_SM_INDUCTOR_MAX_CONFIGS", raw)
    with pytest.raises(ValueError, match=re.escape(f"$FASTA_SM_INDUCTOR_MAX_CONFIGS={raw!r}")):
        fi.enable(state_dir=tmp_path)
    assert not fi.is_enabled()


def test_policy_params_that_are_no_mapping_are_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"policy_params=\['rounds', 1\] must be a mapping"):
        fi.enable(state_dir=tmp_path, policy_params=["rounds", 1])
    assert not fi.is_enabled()


def test_an_empty_policy_name_is_refused_not_taken_for_the_default(tmp_path):
    with pytest.raises(PolicyError, match="unknown policy ''"):
        fi.enable(state_dir=tmp_path, policy="")


SOURCE_WITH_HEURISTIC = (
    "import triton\nfrom torch._inductor.runtime import triton_helpers, triton_heuristics\n"
    "@triton_heuristics.pointwise(\n    size_hints={'x': 1024},\n    filename=__file__,\n"
    "    triton_meta={'signature': {}},\n    inductor_meta={'kernel_name': 'k'},\n)\n"
    "@triton.jit\ndef k(XBLOCK: tl.constexpr):\n    pass\n"
)


def test_a_rewritten_kernel_still_loads_where_fasta_sm_is_no_longer_installed(monkeypatch):
    """Inductor's caches keep kernels written while fasta-sm was installed: their hook must not fail the load."""
    monkeypatch.setitem(sys.modules, "fasta_sm.inductor.hook", None)  # importing it now fails, as if uninstalled
    exec(compile(HOOK, "kernel.py", "exec"), {})


def test_rewrite_adds_the_hook_and_settings_only_to_tuned_heuristics():
    source = SOURCE_WITH_HEURISTIC
    out = rewrite_source(source, {"policy": "fasta", "max_configs": 8})
    assert HOOK in out and "inductor_meta={'fasta_sm': {'policy': 'fasta', 'max_configs': 8}, 'kernel_name'" in out
    ast.parse(out)
    assert rewrite_source(out, {"policy": "x"}) == out, "idempotent"
    foreach = source.replace("pointwise", "foreach")
    assert rewrite_source(foreach, {}) == foreach


def test_removing_the_settings_gives_back_the_source_inductor_wrote():
    settings = {"policy": "fasta", "state_dir": "/tmp/tunés", "policy_params": {"rounds": 1}}
    assert without_settings(rewrite_source(SOURCE_WITH_HEURISTIC, settings), settings) == SOURCE_WITH_HEURISTIC


def test_a_kernels_tune_key_holds_its_source_not_the_settings_written_into_it(tmp_path):
    first = fi.enable(state_dir=tmp_path / "one").to_dict()
    second = fi.enable(state_dir=tmp_path / "two", seed=1, chunk_size=4).to_dict()
    keys = []
    for settings, name in ((first, "cone111"), (second, "ctwo222")):  # Inductor names a file by its source's hash
        (tmp_path / f"{name}.py").write_text(rewrite_source(SOURCE_WITH_HEURISTIC, settings))
        keys.append(make_pointwise(tmp_path, settings, name=name)._fasta_plan.key)
    (tmp_path / "cthree3.py").write_text(rewrite_source(SOURCE_WITH_HEURISTIC.replace("pass", "return"), first))
    other_kernel = make_pointwise(tmp_path, first, name="cthree3")._fasta_plan.key
    assert keys[0] == keys[1] != other_kernel


def test_a_kernel_cached_with_the_bare_hook_import_fasta_sm_wrote_before_keeps_its_tune_key(tmp_path):
    """Inductor's FX graph cache hands back kernel source fasta-sm wrote before its hook's import was put in a
    `try`: that kernel's tune was keyed without the import, and must be found again, not tuned afresh."""
    settings = fi.enable(state_dir=tmp_path / "states").to_dict()
    (tmp_path / "cnew000.py").write_text(rewrite_source(SOURCE_WITH_HEURISTIC, settings))
    bare = "import fasta_sm.inductor.hook  # noqa: F401  fasta-sm autotuner, also in compile workers"  # as at 2d447af
    earlier = rewrite_source(SOURCE_WITH_HEURISTIC, settings).replace(HOOK, bare)
    (tmp_path / "cold111.py").write_text(earlier)
    keys = [make_pointwise(tmp_path, settings, name=name)._fasta_plan.key for name in ("cnew000", "cold111")]
    assert keys[0] == keys[1]


def test_force_disable_caches_written_into_the_source_keeps_the_kernels_tune_key(tmp_path):
    """docs/inductor.md: TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 does not re-tune a kernel whose tune is DONE. Inductor
    writes the switch into every kernel's inductor_meta, so the key must not hold it."""
    settings = fi.enable(state_dir=tmp_path / "states").to_dict()
    keys = []
    for flag, name in ((False, "cfdc000"), (True, "cfdc111")):
        meta = f"{{'kernel_name': 'k', 'force_disable_caches': {flag}}}"
        source = SOURCE_WITH_HEURISTIC.replace("{'kernel_name': 'k'}", meta)
        (tmp_path / f"{name}.py").write_text(rewrite_source(source, settings))
        keys.append(make_pointwise(tmp_path, settings, name=name)._fasta_plan.key)
    (tmp_path / "cfdc222.py").write_text(rewrite_source(SOURCE_WITH_HEURISTIC.replace("pass", "return"), settings))
    assert keys[0] == keys[1] != make_pointwise(tmp_path, settings, name="cfdc222")._fasta_plan.key


@pytest.mark.parametrize(
    ("unset", "switch"),
    [("'autotune_local_cache': True", "'autotune_local_cache': False"),
     ("'autotune_remote_cache': None", "'autotune_remote_cache': True"),
     ("'autotune_remote_cache': None", "'autotune_remote_cache': False")],
    ids=["local autotune cache off", "remote autotune cache on", "remote autotune cache off"],
)
def test_autotune_cache_switches_written_into_the_source_keep_the_kernels_tune_key(tmp_path, unset, switch):
    """Inductor writes its autotune-cache switches (autotune_local_cache=False in code,
    TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=0/1) into every kernel's inductor_meta: they choose which cache Inductor
    reads, not the kernel, so a DONE tune must be found under them as under the defaults."""
    settings = fi.enable(state_dir=tmp_path / "states").to_dict()
    default = "'autotune_local_cache': True, 'autotune_remote_cache': None"
    keys = []
    for switches, name in ((default, "cacd000"), (default.replace(unset, switch), "cacd111")):
        source = SOURCE_WITH_HEURISTIC.replace("{'kernel_name': 'k'}", f"{{'kernel_name': 'k', {switches}}}")
        (tmp_path / f"{name}.py").write_text(rewrite_source(source, settings))
        keys.append(make_pointwise(tmp_path, settings, name=name)._fasta_plan.key)
    assert keys[0] == keys[1]


def test_a_setting_kernel_source_would_read_twice_is_refused_by_enable(tmp_path):
    with pytest.raises(ValueError, match=r"state_dir='.*tunes\\\\new' cannot travel in kernel source"):
        fi.enable(state_dir=tmp_path / "tunes\\new")
    assert not fi.is_enabled()


@pytest.mark.parametrize(
    ("setting", "state_dir"),
    [({}, "tunes\\new"), ({"max_configs": 0}, "tunes"), ({"chunk_size": 0}, "tunes")],
    ids=["a state dir with a backslash", "no configs", "an empty chunk"],
)
def test_a_refused_enable_makes_no_state_dir(tmp_path, setting, state_dir):
    with pytest.raises(ValueError):
        fi.enable(state_dir=tmp_path / state_dir, **setting)
    assert not list(tmp_path.iterdir())


def test_disable_puts_back_the_dispatcher_a_cached_kernels_hook_installed_without_enable():
    from fasta_sm.inductor import autotuner

    autotuner.install()  # what a cached kernel's source does through the hook, in a process that never enabled
    fi.disable()
    assert triton_heuristics.cached_autotune is autotuner.ORIGINAL_CACHED_AUTOTUNE and fi.turned_off()


def under_the_env_switch(code: str, state_dir) -> subprocess.CompletedProcess:
    """`code` in a fresh process with FASTA_SM_INDUCTOR=1 and `state_dir` as the default state dir."""
    env = {**os.environ, "FASTA_SM_INDUCTOR": "1", "FASTA_SM_STATE_DIR": str(state_dir)}
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          env=env)


def test_an_enabled_block_gives_the_environment_switch_back(tmp_path):
    code = (
        "import torch, fasta_sm.inductor as fi\n"
        "fi.autoload()\n"
        f"with fi.enabled(state_dir={str(tmp_path / 'block')!r}):\n"
        "    pass\n"
        "print(fi.is_enabled(), fi.current_settings()['state_dir'])\n"
    )
    out = under_the_env_switch(code, tmp_path / "env")
    assert out.stdout.split() == ["True", str(tmp_path / "env")], out.stderr[-2000:]


def test_enable_while_the_environment_switch_waits_does_not_first_enable_with_the_environments_settings(tmp_path):
    code = (
        "import torch, fasta_sm.inductor as fi\n"
        "fi.autoload()\n"  # FASTA_SM_INDUCTOR=1, waiting for Inductor's codegen, which enable() imports
        f"fi.enable(state_dir={str(tmp_path / 'mine')!r})\n"
        "print(fi.current_settings()['state_dir'])\n"
    )
    out = under_the_env_switch(code, tmp_path / "env")
    assert out.stdout.split() == [str(tmp_path / "mine")], out.stderr[-2000:]
    assert not (tmp_path / "env").exists(), "an enable() with the environment's settings ran first, inside the import"


def test_dispatcher_builds_fasta_only_for_kernels_that_ask(tmp_path):
    fi.enable(state_dir=tmp_path)
    plain = make_pointwise(tmp_path)
    assert type(plain) is triton_heuristics.CachingAutotuner
    tuned = make_pointwise(tmp_path, fi.current_settings())
    assert type(tuned) is FastaCachingAutotuner
    plan = tuned._fasta_plan
    assert len(plan.configs) > len(plain.configs) >= 1
    assert [plan.configs[i] for i in plan.must] == [c for c in plan.configs[: len(plan.must)]]
    assert {c.identity for c in plan.configs[: len(plain.configs)]} == {
        c.identity for c in map(__import__("fasta_sm.driver").driver.to_fasta_config, plain.configs)}
    assert "cabc123" in plan.key and "cc90" in plan.key


def reduce_kernel_source(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    pass


def make_reduction(tmp_path, settings, **meta):
    inductor_meta = {"kernel_name": "triton_red_sum_0", "autotune_local_cache": False,
                     "autotune_remote_cache": False, "fasta_sm": settings, **meta}
    triton_meta = {"signature": {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "r0_numel": "i32"},
                   "device": H200, "constants": {}, "configs": []}
    return triton_heuristics.reduction(size_hints={"x": 4096, "r0_": 4096}, reduction_hint=0, triton_meta=triton_meta,
                                       inductor_meta=inductor_meta, filename=str(tmp_path / "cabc123.py"))(
        JITFunction(reduce_kernel_source))


@pytest.mark.parametrize("flag", ["are_deterministic_algorithms_enabled", "force_filter_reduction_configs"])
def test_a_reduction_inductor_keeps_deterministic_is_left_to_inductor(tmp_path, flag):
    fi.enable(state_dir=tmp_path)
    assert type(make_reduction(tmp_path, fi.current_settings())) is FastaCachingAutotuner
    kept = make_reduction(tmp_path, fi.current_settings(), **{flag: True})
    assert type(kept) is triton_heuristics.CachingAutotuner and len(kept.configs) == 1


def test_a_strict_sum_whose_r0_block_inductor_pinned_is_left_to_inductor(tmp_path):
    fi.enable(state_dir=tmp_path)
    kept = make_reduction(tmp_path, fi.current_settings(), strict_sum_rblock=64)  # torch 2.14, numerics="strict"
    assert type(kept) is triton_heuristics.CachingAutotuner


def test_a_kernel_inductor_compiles_only_to_time_a_fusion_choice_is_left_to_inductor(tmp_path):
    fi.enable(state_dir=tmp_path)
    kept = make_reduction(tmp_path, fi.current_settings(), kernel_name="Placeholder.DESCRIPTIVE_NAME")
    assert type(kept) is triton_heuristics.CachingAutotuner


def test_autotuner_pickle_round_trip(tmp_path):
    fi.enable(state_dir=tmp_path, max_configs=12)
    kernel = make_pointwise(tmp_path, fi.current_settings())
    kernel.prepare_for_pickle()  # what the compile worker does before pickling it back
    blob = pickle.dumps(kernel)
    back = pickle.loads(blob)
    back.restore_after_unpickle(old_values=None)
    assert type(back) is FastaCachingAutotuner
    assert back._fasta_plan == kernel._fasta_plan and len(back._fasta_space) == 12
    assert back.launchers == [] and back.lock is not None and back.lock is not kernel.lock
    assert b"_thread.lock" not in blob and b"FileLock" not in blob


def test_import_fasta_sm_never_imports_torch():
    code = "import sys, fasta_sm, fasta_sm.inductor, fasta_sm.driver; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_enable_without_torch_names_the_extra_to_install(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as in an environment without torch\n"
        "import fasta_sm.inductor as fi\n"
        "from fasta_sm.errors import MissingDependency\n"
        "try:\n"
        f"    fi.enable(state_dir={str(tmp_path)!r})\n"
        "except MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert "pip install 'fasta-sm[inductor]'" in out.stdout, out.stderr


def test_env_var_switches_it_on_when_inductor_codegen_loads(tmp_path):
    code = (
        "import torch, fasta_sm.inductor as fi\n"
        "fi.autoload()\n"
        "print(fi.is_enabled())\n"
        "import torch._inductor.codegen.triton\n"
        "print(fi.is_enabled())\n"
    )
    out = under_the_env_switch(code, tmp_path)
    lines = out.stdout.split()
    if lines and lines[0] == "True":
        pytest.skip("torch's `torch.backends` entry point already enabled it (installed entry point)")
    assert lines == ["False", "True"], out.stderr


def test_import_torch_with_the_switches_off_loads_no_more_of_fasta_sm_than_its_switch_reader():
    from importlib.metadata import entry_points

    if not any(ep.value.startswith("fasta_sm.") for ep in entry_points(group="torch.backends")):
        pytest.skip("fasta-sm's `torch.backends` entry points are not installed (pip install -e .)")
    code = "import sys, torch\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('fasta_sm'))))\n"
    env = {k: v for k, v in os.environ.items() if k not in ("FASTA_SM_INDUCTOR", "FASTA_SM_NPU")}
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                         env=env)
    assert set(out.stdout.split()) == {"fasta_sm", "fasta_sm.autoload", "fasta_sm.config", "fasta_sm.env",
                                       "fasta_sm.errors"}, out.stderr


def test_fasta_under_inductor_starts_from_one_guided_round_and_live_retiming_and_the_user_overrides_it(tmp_path):
    from fasta_sm.policies.fasta.params import LIVE_DEFAULTS

    try:
        assert fi.enable(state_dir=tmp_path).policy_params == {"rounds": 1, **LIVE_DEFAULTS}
        overridden = fi.enable(state_dir=tmp_path, policy_params={"rounds": 3, "retime_z": 2.5}).policy_params
        assert overridden == {**LIVE_DEFAULTS, "rounds": 3, "retime_z": 2.5}
        assert fi.enable(state_dir=tmp_path, policy="random").policy_params == {}
    finally:
        fi.disable()


def test_a_fasta_variable_of_the_enabling_process_travels_in_the_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTA_R1_PCT", "0.1")  # compile workers started before enable() would not see it
    try:
        assert fi.enable(state_dir=tmp_path).policy_params["r1_frac"] == 0.1
        assert fi.enable(state_dir=tmp_path, policy_params={"r1_frac": 0.2}).policy_params["r1_frac"] == 0.2
    finally:
        fi.disable()


@pytest.mark.parametrize(("value", "prior"), [(None, True), ("0", False), ("1", True)])
def test_the_prior_switch_of_the_enabling_process_travels_in_the_settings(tmp_path, monkeypatch, value, prior):
    if value is not None:
        monkeypatch.setenv("FASTA_SM_PRIOR", value)  # compile workers started before enable() would not see it
    try:
        assert fi.enable(state_dir=tmp_path).prior is prior
        assert fi.current_settings()["prior"] is prior
    finally:
        fi.disable()


def test_numpy_numbers_in_policy_params_are_written_as_plain_python_numbers(tmp_path):
    import numpy as np

    try:
        params = fi.enable(state_dir=tmp_path, policy_params={"retime_cost": np.float64(0.05)}).policy_params
        assert type(params["retime_cost"]) is float
        source = rewrite_source(SOURCE_WITH_HEURISTIC, fi.current_settings())
        ast.parse(source)
        assert "np." not in source
    finally:
        fi.disable()


def test_a_seed_no_state_file_can_hold_is_refused_by_enable(tmp_path):
    with pytest.raises(ValueError, match=f"seed={2**64} must be a whole number ≤ {2**64 - 1}"):
        fi.enable(state_dir=tmp_path, seed=2**64)
    assert not fi.is_enabled()


@pytest.mark.parametrize("value", [float("inf"), float("nan"), object()])
def test_a_policy_param_that_kernel_source_cannot_hold_is_refused_naming_it(value, tmp_path):
    with pytest.raises(ValueError, match=r"policy_params\['retime_cost'\]"):
        fi.enable(state_dir=tmp_path, policy_params={"retime_cost": value})
    assert not fi.is_enabled()


@pytest.mark.parametrize("text", ["", "  "])
def test_max_configs_set_to_nothing_in_the_environment_is_the_default(text, monkeypatch, tmp_path):
    monkeypatch.setenv(fi.MAX_CONFIGS_ENV, text)
    with fi.enabled(state_dir=tmp_path) as settings:
        assert settings.max_configs == DriverSettings.max_configs


def test_a_bad_max_configs_in_the_environment_leaves_fasta_sm_off_not_inductor_broken(monkeypatch, caplog):
    monkeypatch.setenv(fi.MAX_CONFIGS_ENV, "abc")
    fi._enable_from_environment()
    assert not fi.is_enabled()
    assert "FASTA_SM_INDUCTOR_MAX_CONFIGS='abc'" in caplog.text


def test_an_unusable_state_dir_in_the_environment_leaves_fasta_sm_off_not_inductor_broken(tmp_path, monkeypatch,
                                                                                          caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("FASTA_SM_STATE_DIR", str(blocker / "states"))
    fi._enable_from_environment()
    assert not fi.is_enabled() and str(blocker) in caplog.text


def test_numpy_whole_numbers_in_the_settings_are_written_as_plain_ints(tmp_path):
    import numpy as np

    settings = fi.enable(state_dir=tmp_path, seed=np.int64(3), max_configs=np.int64(8))
    assert type(settings.seed) is int and settings.seed == 3 and type(settings.max_configs) is int
    assert "np." not in rewrite_source(SOURCE_WITH_HEURISTIC, fi.current_settings())


@pytest.mark.parametrize(("setting", "match"), [({"policy": "fsta"}, "unknown policy 'fsta'"),
                                                ({"policy_params": {"roundz": 2}}, "unknown parameter 'roundz'"),
                                                ({"policy_params": {"rounds": "2"}}, "rounds='2' must be a whole"),
                                                ({"policy": "must-measure"}, "unknown policy 'must-measure'"),
                                                ({"policy": ["fasta"]}, r"unknown policy \['fasta'\]")])
def test_an_unknown_policy_or_a_bad_parameter_is_refused_by_enable_itself(setting, match, tmp_path):
    with pytest.raises(PolicyError, match=match):
        fi.enable(state_dir=tmp_path, **setting)
    assert not fi.is_enabled()


def test_disable_puts_back_inductors_cached_autotune_even_after_the_hook_loaded_first(tmp_path):
    from fasta_sm.inductor import autotuner

    original = autotuner.ORIGINAL_CACHED_AUTOTUNE
    autotuner.install()  # what importing fasta_sm.inductor.hook does, from a cached kernel's source
    fi.enable(state_dir=tmp_path)
    fi.disable()
    assert triton_heuristics.cached_autotune is original


def test_enable_accepts_space_specific_params_without_pruning_a_probe_space(tmp_path, caplog):
    settings = fi.enable(state_dir=tmp_path, policy_params={"optimize_configs": True, "expert_configs": [3]})
    assert settings.policy_params["expert_configs"] == [3] and "pruned" not in caplog.text


def test_a_kernel_loaded_after_disable_that_imports_the_hook_installs_nothing(tmp_path):
    import importlib

    from fasta_sm.inductor import autotuner

    original = autotuner.ORIGINAL_CACHED_AUTOTUNE
    fi.enable(state_dir=tmp_path)
    fi.disable()
    importlib.reload(importlib.import_module("fasta_sm.inductor.hook"))  # a cached kernel's source runs it
    assert triton_heuristics.cached_autotune is original


def test_disable_before_inductors_codegen_loads_keeps_the_environment_switch_from_turning_it_on(tmp_path):
    code = (
        "import torch, fasta_sm.inductor as fi\n"
        "fi.autoload()\n"  # what torch's entry point does at `import torch` under FASTA_SM_INDUCTOR=1
        "fi.disable()\n"
        "import torch._inductor.codegen.triton\n"
        "print(fi.is_enabled())\n"
    )
    out = under_the_env_switch(code, tmp_path)
    assert out.stdout.split() == ["False"], out.stderr[-2000:]


def test_a_setting_that_would_end_the_string_inductor_embeds_kernel_source_in_is_refused_by_enable(tmp_path):
    with pytest.raises(ValueError, match=r"state_dir=.*cannot travel in kernel source"):
        fi.enable(state_dir=tmp_path / "a'''b")
    assert not fi.is_enabled()


def test_an_enabled_block_in_a_process_that_never_called_disable_does_not_switch_it_off_for_good(tmp_path,
                                                                                              monkeypatch):
    import importlib

    from fasta_sm.inductor import autotuner

    monkeypatch.setattr(fi, "_turned_off", False)  # a process that never called disable() (this file's fixture did)
    with fi.enabled(state_dir=tmp_path):
        pass
    importlib.reload(importlib.import_module("fasta_sm.inductor.hook"))  # a kernel cached with fasta-sm on
    assert not fi.turned_off() and triton_heuristics.cached_autotune is autotuner.cached_autotune
