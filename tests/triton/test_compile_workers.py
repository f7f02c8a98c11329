"""Compile workers need neither torch nor a GPU: they compile for the tuning process's target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fasta_sm.errors import SettingError
from fasta_sm.triton import fork_server
from fasta_sm.triton.compile_pool import CompilePool
from fasta_sm.triton.fork_server import preload_modules
from fasta_sm.triton.worker import CompileJob, DeferredModule, defer_import

HERE = Path(__file__).parent


def _nvidia_backend() -> bool:
    from triton.backends import backends

    return "nvidia" in backends


@pytest.fixture(scope="module")
def compile_only(tmp_path_factory):
    """What compile_only_child.py saw: a worker compiling an sm_90 kernel, then this process the same launch."""
    if not _nvidia_backend():
        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    cache = tmp_path_factory.mktemp("triton_cache")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(cache)}
    child = subprocess.run([sys.executable, str(HERE / "compile_only_child.py")], capture_output=True, text=True,
                           timeout=300, env=env, cwd=HERE)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_a_worker_compiles_for_the_target_it_is_given_without_a_gpu(compile_only):
    assert compile_only["worker_error"] is None
    assert compile_only["cubins"] == ["accumulate_kernel.cubin", "tile_dot_kernel.cubin", "tile_dot_kernel.cubin"]


def test_a_worker_compiles_without_loading_the_torch_its_kernel_module_imports(compile_only):
    assert compile_only["torch_in_worker"] == "RuntimeError: torch is DeferredModule"


def test_a_worker_compiles_into_the_cache_its_job_names_not_the_one_of_its_environment(compile_only):
    assert compile_only["elsewhere_cubins"] == ["accumulate_kernel.cubin"]


def test_the_tuning_process_finds_the_workers_binary_under_its_own_key(compile_only):
    """Compiled here with torch dtypes, the same launches are cache hits, the one compiled under a shared-memory
    limit among them: nothing new is written."""
    assert compile_only["new_cache_entries"] == []


@pytest.fixture(scope="module")
def edited_kernel(tmp_path_factory):
    """What edited_kernel_child.py saw: one worker compiling a kernel, then its edited, reloaded version."""
    if not _nvidia_backend():
        pytest.skip("this Triton has no NVIDIA backend to compile for sm_90")
    cache, folder = tmp_path_factory.mktemp("triton_cache"), tmp_path_factory.mktemp("edited")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(cache)}
    child = subprocess.run([sys.executable, str(HERE / "edited_kernel_child.py"), str(folder)], capture_output=True,
                           text=True, timeout=300, env=env, cwd=HERE)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def test_a_worker_compiles_a_kernel_edited_and_reloaded_since_its_first_import_not_the_old_text(edited_kernel):
    assert edited_kernel["first"].startswith("CompileTimeAssertionFailure")
    assert edited_kernel["edited"] is None  # not the first version's error, kept by the worker's stale module


def test_a_kernel_no_import_in_the_worker_reproduces_is_left_to_the_tuning_process(edited_kernel):
    assert edited_kernel["changed_unavailable"], edited_kernel["changed"]
    assert edited_kernel["changed"].startswith("ImportError")


def test_a_config_over_the_shared_memory_limit_fails_in_the_worker_with_the_error_its_load_would_raise(compile_only):
    from triton.runtime.errors import OutOfResources

    needed = compile_only["tile_shared"]
    assert needed > 1024
    assert compile_only["over_limit_error"] == f"OutOfResources: {OutOfResources(needed, 1024, 'shared memory')}"


def test_a_config_over_the_shared_memory_limit_stops_before_its_ptx_and_binary_are_built(compile_only):
    assert ".llir" in compile_only["over_limit_files"]
    assert not {".ptx", ".cubin"} & set(compile_only["over_limit_files"])


def test_a_config_within_the_shared_memory_limit_compiles_in_full(compile_only):
    assert compile_only["under_limit_error"] is None


def test_a_job_without_a_limit_compiles_in_full_in_a_worker_that_had_one(compile_only):
    assert compile_only["no_limit_error"] is None


def _write_module(tmp_path, monkeypatch, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # undone last: the module, stand-in or real, is gone after the test
    monkeypatch.delitem(sys.modules, name)


def test_a_deferred_import_binds_a_stand_in_without_running_the_module(tmp_path, monkeypatch):
    _write_module(tmp_path, monkeypatch, "fasta_deferred_a")
    defer_import("fasta_deferred_a")
    import fasta_deferred_a

    assert isinstance(fasta_deferred_a, DeferredModule)
    assert isinstance(sys.modules["fasta_deferred_a"], DeferredModule)


def test_a_deferred_module_is_imported_on_first_use_and_read_through_after(tmp_path, monkeypatch):
    _write_module(tmp_path, monkeypatch, "fasta_deferred_b")
    defer_import("fasta_deferred_b")
    import fasta_deferred_b

    assert fasta_deferred_b.VALUE == 42
    real = sys.modules["fasta_deferred_b"]
    assert not isinstance(real, DeferredModule)
    real.VALUE = 43
    assert fasta_deferred_b.VALUE == 43


def test_a_module_already_imported_is_not_deferred():
    defer_import("json")
    assert not isinstance(sys.modules["json"], DeferredModule)


def test_a_kernel_module_that_uses_torch_on_import_is_named_once_with_the_remedy(caplog):
    jobs = [CompileJob("torch_at_import", "noop", (), {}), CompileJob("worker_probe", "torch_probe", (), {})]
    pool = CompilePool(1)
    try:
        pool.start()
        results = list(pool.run(jobs))
    finally:
        pool.close()
    assert sorted(error for _, error, _ in results if error) == ["RuntimeError: torch is module"]
    warnings = [r.getMessage() for r in caplog.records if "uses torch when imported" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("torch_at_import") and "FASTA_WORKER_TORCH=1" in warnings[0]


def test_fasta_worker_torch_forces_torch_into_the_fork_server_or_out(monkeypatch):
    monkeypatch.setattr(fork_server, "_torch_on_import", set())
    monkeypatch.setenv("FASTA_WORKER_TORCH", "1")
    assert preload_modules()[0] == "torch"
    monkeypatch.setattr(fork_server, "_torch_on_import", {"a_module"})
    monkeypatch.setenv("FASTA_WORKER_TORCH", "0")
    assert "torch" not in preload_modules()


def test_a_fasta_worker_torch_that_is_neither_yes_nor_no_nor_auto_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("FASTA_WORKER_TORCH", "torch")
    with pytest.raises(SettingError, match=r"\$FASTA_WORKER_TORCH='torch'.*, nor auto"):
        preload_modules()


def test_a_misspelt_fasta_prewarm_is_an_error_naming_it_not_a_silent_default(monkeypatch):
    monkeypatch.setenv("FASTA_PREWARM", "of")
    with pytest.raises(SettingError, match=r"\$FASTA_PREWARM='of'"):
        fork_server.start_fork_server()


def test_unset_the_fork_server_imports_torch_once_a_noted_kernel_module_uses_it(monkeypatch):
    monkeypatch.delenv("FASTA_WORKER_TORCH", raising=False)
    monkeypatch.setattr(fork_server, "_torch_on_import", set())
    fork_server.note_kernel_module("plain", {"torch": torch, "N": 3})
    assert "torch" not in preload_modules()
    fork_server.note_kernel_module("with_table", {"torch": torch, "DTYPES": {"bf16": torch.bfloat16}})
    assert preload_modules()[0] == "torch"


@pytest.mark.parametrize("namespace", [
    {"DTYPES": {"bf16": torch.bfloat16}},
    {"DEVICE": torch.device("cpu")},
    {"F": torch.nn.functional},
    {"gelu": torch.nn.functional.gelu},
    {"Tensor": torch.Tensor},
], ids=["dtype table", "device", "submodule", "function", "class"])
def test_torch_objects_in_a_modules_globals_mean_it_uses_torch_on_import(namespace):
    assert fork_server.uses_torch_on_import(namespace)


def test_the_torch_module_alone_does_not_mean_it_uses_torch_on_import():
    import triton

    namespace = {"torch": torch, "triton": triton, "N": 3, "CONFIGS": [triton.Config({"BLOCK": 16})], "f": len}
    assert not fork_server.uses_torch_on_import(namespace)


@pytest.fixture(scope="module")
def guardless(tmp_path_factory):
    """What guardless_child.py saw: its top-level runs, and its workers' reports."""
    if not _nvidia_backend():
        pytest.skip("this Triton has no NVIDIA backend to stand in for the tuning process's target")
    runs = tmp_path_factory.mktemp("guardless") / "runs.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "FASTA_WORKER_TORCH")}
    child = subprocess.run([sys.executable, str(HERE / "guardless_child.py"), str(runs)], capture_output=True,
                           text=True, timeout=300, env=env, cwd=HERE)
    assert child.returncode == 0, child.stderr[-3000:]
    return {"runs": runs.read_text().split(), **json.loads(child.stdout.strip().splitlines()[-1])}


def _shared_server(order: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    child = subprocess.run([sys.executable, str(HERE / "shared_server_child.py"), order], capture_output=True,
                           text=True, timeout=180, env=env, cwd=HERE)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform == "win32", reason="no fork server on Windows")
def test_workers_keep_their_preload_when_the_program_started_multiprocessings_fork_server_first():
    """As another library does, or any process pool from Python 3.14, where the fork server is the default."""
    seen = _shared_server("program-first")
    assert seen["worker"] == "RuntimeError: preload=True main=None"


@pytest.mark.skipif(sys.platform == "win32", reason="no fork server on Windows")
def test_the_programs_own_fork_server_children_get_none_of_the_workers_preload():
    seen = _shared_server("fasta-first")
    assert seen["worker"] == "RuntimeError: preload=True main=None"
    assert seen["program_child_preloaded"] is False


def test_a_script_without_a_main_guard_runs_once_not_again_in_each_worker(guardless):
    assert len(guardless["runs"]) == 1
    assert guardless["main_probe"] == "RuntimeError: __main__ file=None"


def test_a_script_that_imports_torch_nn_leaves_torch_deferred_in_the_workers(guardless):
    assert guardless["torch_probe"] == "RuntimeError: torch is DeferredModule"


def test_a_kernel_defined_in_the_main_script_compiles_in_this_process(monkeypatch):
    """Workers do not run `__main__`, so they could not import it; without the rule it would go to them."""
    from kernels import accumulate_kernel
    from triton.runtime.jit import JITFunction

    from fasta_sm.triton.backend import TritonBackend

    kernel = JITFunction(getattr(accumulate_kernel, "fn", accumulate_kernel))  # compiled, even beside the interpreter
    monkeypatch.setattr(kernel, "module", "__main__")
    for main in ("__main__", "__mp_main__"):
        if main in sys.modules:
            monkeypatch.setattr(sys.modules[main], kernel.fn.__qualname__, kernel, raising=False)
    backend = TritonBackend(kernel, (None, None, 8, 2.0), lambda meta: (1,), rep_ms=0.0)
    assert backend._jobs([]) is None
