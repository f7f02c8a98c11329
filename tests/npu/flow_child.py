"""One scenario of fasta-sm over the torch_npu stand-in, in a process of its own; prints what it saw as JSON.

    python flow_child.py SCENARIO TABLE STATE_DIR
"""

from __future__ import annotations

import contextlib
import copyreg
import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

scenario, table_path, state_dir = sys.argv[1:4]
os.environ["STANDIN_TABLE"] = table_path
seen: dict = {}


def configs(expert=(0, 5), twins=False, split=False):
    """The table's configs as torch_npu's; `split`: with the `split_axis`/`split_blocks` tuples its
    `_triton_config_npu_index_legacy` sets on every config."""
    from fasta_sm.backends.replay import load_table

    table = load_table(table_path)
    out = [SimpleNamespace(kwargs=dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages,
                           from_expert=i in expert) for i, c in enumerate(table.configs)]
    for config in out if split else ():
        config.kwargs.update(split_axis=(0,), split_blocks=(config.kwargs["BLOCK_M"],))
    if twins:
        out.append(SimpleNamespace(**vars(out[1])))
    return out


def build(space, heuristic_type="pointwise", filename=None, **meta):
    from torch_npu._inductor.runtime import triton_heuristics

    fn = SimpleNamespace(__name__="triton_poi_0", fn=object())
    return triton_heuristics.cached_autotune(
        {"x": 1024}, space, {}, heuristic_type, filename=filename, inductor_meta={"kernel_name": "triton_poi_0", **meta}
    )(fn)


KERNEL_BODY = """
import __main__

kernel = __main__.build(__main__.configs(), filename=__file__)
"""
"""What follows the imports in a generated kernel's source: here, the stand-in's kernel, built as its decorator
would build it."""


RUNTIME_BLOCKS_KERNEL_BODY = """
import __main__

kernel = __main__.build(__main__.configs(), filename=__file__, runtime_block_arg_names=["XBLOCK"])
"""
"""As `KERNEL_BODY`, for a kernel with runtime block arguments, which fasta-sm leaves to torch_npu's FastA."""


def compile_in_worker(source, work):
    """The kernel of `source` as a compile worker of torch_npu's pool builds and pickles it (the environment of
    this process, and no backend entry points): what the worker saw, and the pickle."""
    (work / "kernel.py").write_text(source)
    worker_env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "KERNEL_SOURCE": str(work / "kernel.py"),
                  "KERNEL_PICKLE": str(work / "kernel.pickle")}
    done = subprocess.run([sys.executable, __file__, "compile_worker", table_path, state_dir], env=worker_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), (work / "kernel.pickle").read_bytes()


def load_kernel(path):
    """The kernel of the source file at `path`, loaded as Inductor's code cache loads one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel


def hooked_imports():
    """The imports torch_npu generates now, and whether they import fasta-sm's hook."""
    from torch_npu._inductor.codegen.triton import NPUIndexTritonKernel, NPUTritonKernel

    texts = [cls.gen_common_triton_imports() for cls in (NPUTritonKernel, NPUIndexTritonKernel)]
    return [text.count("import fasta_sm.npu.hook") for text in texts]


def quiet_device_guard():
    from fasta_sm.npu.autotuner import FastaNPUAutotuner

    FastaNPUAutotuner._fasta_device_guard = lambda self: contextlib.nullcontext()


if scenario in ("tune", "tune_split"):
    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)
    quiet_device_guard()
    from torch_npu._inductor.runtime import triton_heuristics as th

    from fasta_sm.npu import autotuner

    reads, read_settings = [], autotuner.current_settings
    autotuner.current_settings = lambda: (reads.append(1), read_settings())[1]
    space = configs(split=scenario == "tune_split")
    kernel = build(space)
    seen["class"] = type(kernel).__name__
    seen["settings_reads"] = len(reads)
    kernel.precompile(warm_cache_only=True)  # the compile worker's half
    seen["worker_compiles"] = th.CALLS["compile"]
    kernel.precompile()
    seen["ran"] = kernel.run(stream=0)[1]
    seen["best"] = {k: v for k, v in kernel.best_launcher.config.kwargs.items() if not k.startswith("split_")} | {
        "num_warps": kernel.best_launcher.config.num_warps}
    seen["saved"] = len(th.SAVED)
    seen["compiles"], seen["benches"] = th.CALLS["compile"], th.CALLS["bench"]
    kernel.run(stream=0)
    seen["benches_after_second_run"] = th.CALLS["bench"]
    seen["n"] = len(space)
elif scenario == "device_limit":
    from torch_npu._inductor import config as npu_config

    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)
    npu_config.num_vector_core = int(os.environ["STANDIN_CORES"])  # as NPU_DEVICE_LIMIT leaves it; the device: 48
    seen["key"] = build(configs())._fasta_plan.key
elif scenario == "declined":
    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)
    seen["runtime_blocks"] = type(build(configs(), runtime_block_arg_names=["R0_BLOCK"])).__name__
    from torch._inductor.runtime.hints import HeuristicType

    deterministic = {"are_deterministic_algorithms_enabled": True}
    kept = build(configs(), HeuristicType.REDUCTION, **deterministic)
    seen["deterministic_reduction"] = type(kept).__name__
    seen["deterministic_reduction_configs"] = [c.from_expert for c in kept.configs]
    seen["deterministic_pointwise"] = type(build(configs(), HeuristicType.POINTWISE, **deterministic)).__name__
    os.environ.pop(fasta_sm.npu.ENV_VAR)
    seen["switched_off"] = type(build(configs())).__name__
elif scenario == "not_convertible":
    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)
    kernel = build(configs(expert=(0, 5), twins=True))
    seen["configs"] = [dict(c.kwargs) | {"num_warps": c.num_warps} for c in kernel.configs]
elif scenario == "disable":
    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)
    fasta_sm.npu.disable()
    from torch_npu._inductor import config
    from torch_npu._inductor.runtime import fasta_autotune

    seen["slot"] = fasta_autotune.NPUFastAutotuner.__name__
    seen["switch"] = config.fasta_autotune
    seen["pickled_by_fasta_sm"] = fasta_autotune.NPUFastAutotuner in copyreg.dispatch_table
    seen["env"] = {name: os.environ.get(name) for name in ("FASTAUTOTUNE", "FASTA_SM_NPU", "ENABLE_PRINT_UB_BITS")}
elif scenario == "autoload":
    import fasta_sm.npu

    fasta_sm.npu.autoload()  # as torch's backend entry point runs it, with only FASTA_SM_NPU=1 set
    import torch_npu._inductor  # noqa: F401  torch_npu's own import at the first torch.compile
    from torch_npu._inductor.runtime import fasta_autotune

    seen["slot"] = fasta_autotune.NPUFastAutotuner.__name__
elif scenario == "autoload_then_disable":
    import fasta_sm.npu

    fasta_sm.npu.autoload()
    fasta_sm.npu.disable()  # before torch_npu's first import of the slot
    import torch_npu._inductor  # noqa: F401
    from torch_npu._inductor.runtime import fasta_autotune

    seen["slot"] = fasta_autotune.NPUFastAutotuner.__name__
elif scenario == "autoload_codegen":
    import fasta_sm.npu

    fasta_sm.npu.autoload()
    if os.environ.get("STANDIN_DISABLE_FIRST"):
        fasta_sm.npu.disable()  # before torch_npu loads its codegen
    import torch_npu._inductor.codegen.triton  # noqa: F401  loaded with torch_npu's backend, before any kernel

    seen["slot_loaded"] = "torch_npu._inductor.runtime.fasta_autotune" in sys.modules
    seen["hooked"] = hooked_imports()
elif scenario == "autoload_then_import_the_class":
    import fasta_sm.npu

    fasta_sm.npu.autoload()
    from fasta_sm.npu.autotuner import FastaNPUAutotuner  # its import is the first of torch_npu's slot

    seen["ours"] = FastaNPUAutotuner.__name__
    from torch_npu._inductor.runtime import fasta_autotune

    seen["is_ours"] = fasta_autotune.NPUFastAutotuner is FastaNPUAutotuner
elif scenario == "install_fails":
    import logging

    import fasta_sm.npu

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fasta_sm.npu.autoload()
    sys.modules["fasta_sm.npu.autotuner"] = None  # its import now fails, as a broken install would
    from torch_npu._inductor.runtime import fasta_autotune

    seen["slot"] = fasta_autotune.NPUFastAutotuner.__name__
elif scenario == "tune_fails":
    import logging

    import fasta_sm.npu

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fasta_sm.npu.enable(state_dir=state_dir)
    quiet_device_guard()
    kernel = build(configs())
    shutil.rmtree(state_dir)
    open(state_dir, "w").close()  # once the settings were checked: a file where the state dir was
    kernel.precompile(warm_cache_only=True)
    kernel.precompile()
    seen["class"] = type(kernel).__name__
    seen["ran"] = kernel.run(stream=0)[1]
elif scenario == "unusable_settings":
    import logging

    import fasta_sm.npu

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fasta_sm.npu.autoload()
    seen["classes"] = [type(build(configs())).__name__ for _ in range(2)]
elif scenario == "enable_fails":
    import fasta_sm.npu

    try:
        fasta_sm.npu.enable(state_dir=state_dir)
    except fasta_sm.npu.NPUUnavailable as exc:
        seen["error"] = str(exc)
    seen["env"] = {name: os.environ.get(name) for name in ("FASTAUTOTUNE", "FASTA_SM_NPU", "ENABLE_PRINT_UB_BITS")}
elif scenario == "disable_after_the_worker":
    import pickle

    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)
    quiet_device_guard()
    from torch_npu._inductor.runtime import triton_heuristics as th

    kernel = build(configs())
    kernel.precompile(warm_cache_only=True)  # in a compile worker that never hears of disable()
    blob = pickle.dumps(kernel)
    fasta_sm.npu.disable()
    parent = pickle.loads(blob)
    parent.precompile()
    th.CALLS["bench"] = 0
    parent.run(stream=0)
    seen["benches"], seen["plan"] = th.CALLS["bench"], parent._fasta_plan is not None
elif scenario == "worker_without_fasta_sm":
    import logging
    import pickle

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # a compile worker where fasta-sm's entry point never ran: torch_npu starts Inductor's pool with
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0 (or it started before enable()), so its slot holds torch_npu's own class
    os.environ.update(FASTAUTOTUNE="1", ENABLE_PRINT_UB_BITS="1")
    worker_kernel = build(configs())
    worker_kernel.precompile(warm_cache_only=True)
    blob = pickle.dumps(worker_kernel)
    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)  # the parent
    quiet_device_guard()
    parent = pickle.loads(blob)
    parent.precompile()
    seen["worker"] = type(worker_kernel).__name__
    seen["parent"] = type(parent).__name__
    seen["ran"] = parent.run(stream=0)[1]
    seen["states"] = len(os.listdir(state_dir)) if os.path.isdir(state_dir) else 0
elif scenario == "hooked_worker":
    import pickle
    from pathlib import Path

    import fasta_sm.npu

    fasta_sm.npu.enable(state_dir=state_dir)  # the parent
    from torch_npu._inductor.codegen.triton import NPUIndexTritonKernel

    from fasta_sm.npu.codegen import without_hook

    work = Path(state_dir).parent
    source = NPUIndexTritonKernel.gen_common_triton_imports() + KERNEL_BODY
    (work / "plain.py").write_text(without_hook(source))
    seen["worker"], blob = compile_in_worker(source, work)
    quiet_device_guard()
    from torch_npu._inductor.runtime import triton_heuristics as th

    parent = pickle.loads(blob)
    parent.precompile()
    seen["parent"] = type(parent).__name__
    seen["ran"] = parent.run(stream=0)[1]
    seen["parent_compiles"], seen["benches"] = th.CALLS["compile"], th.CALLS["bench"]
    hooked_key = parent._fasta_kernel_hash()
    parent.filename = str(work / "plain.py")
    seen["key_ignores_the_hook"] = parent._fasta_kernel_hash() == hooked_key
elif scenario == "hooked_worker_runtime_blocks":
    import logging
    import pickle
    from pathlib import Path

    import fasta_sm.npu

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fasta_sm.npu.enable(state_dir=state_dir)  # the parent
    from torch_npu._inductor.codegen.triton import NPUIndexTritonKernel

    source = NPUIndexTritonKernel.gen_common_triton_imports() + RUNTIME_BLOCKS_KERNEL_BODY
    worker, blob = compile_in_worker(source, Path(state_dir).parent)
    seen["worker"], seen["parent"] = worker["kind"], type(pickle.loads(blob)).__name__
elif scenario == "hooked_worker_unusable_settings":
    import logging
    import pickle
    from pathlib import Path

    import fasta_sm.npu

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    fasta_sm.npu.autoload()  # FASTA_SM_NPU=1 alone, with settings no process can use
    from torch_npu._inductor.codegen.triton import NPUIndexTritonKernel
    from torch_npu._inductor.runtime import fasta_autotune  # noqa: F401  the parent builds a kernel: its slot loads

    source = NPUIndexTritonKernel.gen_common_triton_imports() + KERNEL_BODY
    worker, blob = compile_in_worker(source, Path(state_dir).parent)
    seen["worker"], seen["parent"] = worker["kind"], type(pickle.loads(blob)).__name__
elif scenario == "hooked_worker_switch_off":
    import pickle
    from pathlib import Path

    import fasta_sm.npu

    fasta_sm.npu.autoload()  # FASTA_SM_NPU=1 with the user's FASTAUTOTUNE=0: torch_npu's FastA stays off
    from torch_npu._inductor.codegen.triton import NPUIndexTritonKernel

    source = NPUIndexTritonKernel.gen_common_triton_imports() + KERNEL_BODY
    seen["here"] = type(build(configs())).__name__  # a kernel this process compiles itself
    worker, blob = compile_in_worker(source, Path(state_dir).parent)
    seen["worker"], seen["parent"] = worker["kind"], type(pickle.loads(blob)).__name__
    seen["here_after"] = type(build(configs())).__name__
elif scenario == "compile_worker":
    import pickle

    kernel = load_kernel(os.environ["KERNEL_SOURCE"])
    from torch_npu._inductor.runtime import triton_heuristics as th

    if type(kernel).__name__ == "FastaNPUAutotuner":
        quiet_device_guard()
    kernel.precompile(warm_cache_only=True)
    with open(os.environ["KERNEL_PICKLE"], "wb") as out:
        pickle.dump(kernel, out)
    seen.update(kind=type(kernel).__name__, compiles=th.CALLS["compile"],
                plan=getattr(kernel, "_fasta_plan", None) is not None)
elif scenario == "hooked_source_elsewhere":
    # a process that loads a kernel source written with the hook, where fasta-sm is off or not installed
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    os.environ.update(FASTAUTOTUNE="1", ENABLE_PRINT_UB_BITS="1")
    if os.environ.get("STANDIN_NO_FASTA_SM"):
        sys.modules["fasta_sm.npu.hook"] = None  # its import now fails, as with fasta-sm uninstalled
    from fasta_sm.npu.codegen import with_hook

    path = os.path.join(os.path.dirname(state_dir), "kernel.py")
    with open(path, "w") as out:
        out.write(with_hook("import torch_npu\nfrom torch_npu._inductor.runtime import triton_heuristics as "
                            "triton_heuristics\n") + KERNEL_BODY)
    kernel = load_kernel(path)
    from torch_npu._inductor.runtime import fasta_autotune

    seen["class"], seen["slot"] = type(kernel).__name__, fasta_autotune.NPUFastAutotuner.__name__
elif scenario == "codegen_patch":
    import fasta_sm.npu

    if os.environ.get("STANDIN_CODEGEN_FIRST"):
        import torch_npu._inductor.codegen.triton  # noqa: F401  loaded before enable()
    fasta_sm.npu.enable(state_dir=state_dir)
    seen["enabled"] = hooked_imports()
    fasta_sm.npu.enable(state_dir=state_dir)
    seen["enabled_twice"] = hooked_imports()
    fasta_sm.npu.disable()
    seen["disabled"] = hooked_imports()
elif scenario in ("old_bench", "no_slot_class"):
    from torch_npu._inductor import config
    from torch_npu._inductor.runtime import fasta_autotune
    from torch_npu._inductor.runtime import triton_heuristics as th

    import fasta_sm.npu

    if scenario == "old_bench":
        th.NPUCachingAutotuner.bench = lambda self, launcher, *args, **kwargs: 1.0  # no runtime_blocks
    else:
        del fasta_autotune.NPUFastAutotuner
    try:
        fasta_sm.npu.enable(state_dir=state_dir)
    except fasta_sm.npu.NPUUnavailable as exc:
        seen["error"] = str(exc)
    seen["switch"] = config.fasta_autotune
print(json.dumps(seen))
