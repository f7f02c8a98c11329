"""Contract: FastaNPUAutotuner against torch_npu's published source (2.13, 2.14), read with ast, never imported.

Downloads the torch_npu wheels (and, when the installed torch is another
version, the matching torch wheel for the CachingAutotuner base) into
$FASTA_SM_TEST_CACHE (default ~/.cache/fasta-sm/test-wheels); skips, saying
why, when they cannot be downloaded.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from fasta_sm.npu import codegen

sys.path.insert(0, str(Path(__file__).parent))
from contract import (
    NPU_CODEGEN,
    NPU_COMBO,
    NPU_CONFIG,
    NPU_FASTA,
    NPU_HEURISTICS,
    TORCH_HEURISTICS,
    BaseChain,
    class_info,
    download_wheel,
    incompatible,
    our_usage,
    read_from_wheel,
)

VERSIONS = ("2.13.0", "2.14.0")


def torch_source(version: str) -> str:
    spec = importlib.util.find_spec("torch")  # locates, does not import
    if spec is not None and spec.origin:
        installed = Path(spec.origin).parent
        version_file = (installed / "version.py").read_text()
        if f"__version__ = '{version}" in version_file:
            return (installed / "_inductor/runtime/triton_heuristics.py").read_text()
    wheel, why = download_wheel("torch", version)
    if wheel is None:
        pytest.skip(f"torch {version} source for the CachingAutotuner base is not available: {why}")
    return read_from_wheel(wheel, TORCH_HEURISTICS)


@pytest.fixture(scope="module", params=VERSIONS)
def published(request):
    version = request.param
    wheel, why = download_wheel("torch-npu", version)
    if wheel is None:
        pytest.skip(f"torch_npu {version} wheel not downloadable (no network?): {why}")
    npu = read_from_wheel(wheel, NPU_HEURISTICS)
    chain = BaseChain([class_info(npu, "NPUCachingAutotuner"), class_info(torch_source(version), "CachingAutotuner")])
    return {
        "version": version,
        "heuristics": npu,
        "fasta": read_from_wheel(wheel, NPU_FASTA),
        "config": read_from_wheel(wheel, NPU_CONFIG),
        "codegen": read_from_wheel(wheel, NPU_CODEGEN),
        "combo": read_from_wheel(wheel, NPU_COMBO),
        "chain": chain,
    }


def test_every_override_has_a_compatible_signature(published):
    chain, usage = published["chain"], our_usage()
    checked = 0
    for name, ours in usage.overrides.items():
        base = chain.method(name)
        if base is None:
            assert name.startswith("_fasta") or name == "__new__", (
                f"{name} overrides nothing in torch_npu {published['version']}"
            )
            continue
        assert not incompatible(ours, base), f"{name}: {incompatible(ours, base)}"
        checked += 1
    assert checked >= 6, "the overrides of the autotuner seams were found"


def test_every_member_read_exists_on_the_base(published):
    chain = published["chain"]
    missing = sorted(name for name in our_usage().reads if not chain.has(name))
    assert not missing, f"torch_npu {published['version']} base classes lack {missing}"


def test_every_member_written_is_one_the_base_reads(published):
    chain = published["chain"]
    usage = our_usage()
    assert {"best_launcher", "best_runtime_blocks", "best_candidate_config", "launchers"} <= usage.writes
    unknown = sorted(name for name in usage.writes if not chain.has(name))
    assert not unknown, f"torch_npu {published['version']} never uses {unknown}: writing them would do nothing"


def test_every_call_passes_keywords_the_base_accepts(published):
    chain, usage = published["chain"], our_usage()
    for name, keywords, via_super in usage.calls:
        if name.startswith("_fasta") or name == "__new__" or (name in usage.overrides and not via_super):
            continue
        method = chain.method(name)
        if method is None:
            assert chain.has(name), f"call to {name}: not on the base classes"
            continue
        rejected = [k for k in keywords if not method.names(k)]
        assert not rejected, f"{name} does not name {rejected} as parameters in torch_npu {published['version']}"


def test_the_slot_enable_fills_is_where_torch_npu_picks_its_fasta_autotuner(published):
    tree = ast.parse(published["heuristics"])
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cached_autotune")
    imports = [n for n in ast.walk(func) if isinstance(n, ast.ImportFrom) and n.module == "fasta_autotune"
               and any(a.name == "NPUFastAutotuner" for a in n.names)]
    assert imports, "cached_autotune imports NPUFastAutotuner from .fasta_autotune at call time"
    guards = [n for n in ast.walk(func) if isinstance(n, ast.If) and "fasta_autotune" in ast.unparse(n.test)
              and any(imp in list(ast.walk(n)) for imp in imports)]
    assert guards, "the import is guarded by torch_npu's fasta_autotune switch"
    made = [n for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == "NPUFastAutotuner"]
    assert made
    init = published["chain"].method("__init__")
    for call in made:
        rejected = [k.arg for k in call.keywords if k.arg and not init.accepts_keyword(k.arg)]
        assert not rejected, f"NPUCachingAutotuner.__init__ does not take {rejected}"
        assert {"inductor_meta", "configs"} <= {k.arg for k in call.keywords}, (
            "inductor_meta and configs are passed by keyword: FastaNPUAutotuner.__new__ reads them there to "
            "decline a kernel"
        )
    assert class_info(published["fasta"], "NPUFastAutotuner")
    config = ast.parse(published["config"])
    assert any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "fasta_autotune" for t in n.targets)
               for n in config.body), "torch_npu._inductor.config.fasta_autotune exists"
    assert any(isinstance(n, ast.Assign) and "num_vector_core" in ast.unparse(n.targets[0]) for n in config.body), (
        "torch_npu._inductor.config.num_vector_core exists: a tune's key counts the cores FastA generates for"
    )


def test_our_imports_exist_in_the_wheel(published):
    source = published["heuristics"]
    assert class_info(source, "NPUCachingAutotuner")
    ours = ast.parse((Path(__file__).resolve().parents[2] / "fasta_sm/npu/autotuner.py").read_text())
    imports = [n for n in ours.body if isinstance(n, ast.ImportFrom)]
    modules = {n.module for n in imports if (n.module or "").startswith("torch_npu")}
    assert modules == {"torch_npu._inductor", "torch_npu._inductor.runtime",
                       "torch_npu._inductor.runtime.triton_heuristics"}


def test_each_kernel_class_generates_the_import_the_hook_is_written_after(published):
    """The codegen patch wraps each class's own `gen_common_triton_imports` (a classmethod) and writes the hook
    after the line importing torch_npu's `triton_heuristics`: without that line, workers would build torch_npu's
    class again."""
    tree = ast.parse(published["codegen"])
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in codegen.KERNEL_CLASSES:
        method = next(n for n in classes[name].body if isinstance(n, ast.FunctionDef) and n.name == codegen.IMPORTS)
        assert "classmethod" in [ast.unparse(d) for d in method.decorator_list], f"{name}.{codegen.IMPORTS}"
        lines = [line.strip() for line in ast.get_source_segment(published["codegen"], method).splitlines()]
        assert codegen.ANCHOR in lines, f"{name}.{codegen.IMPORTS} in torch_npu {published['version']}"


def test_combo_kernels_take_their_imports_from_a_kernel_class(published):
    assert f"self.triton_kernel_cls.{codegen.IMPORTS}()" in published["combo"]
