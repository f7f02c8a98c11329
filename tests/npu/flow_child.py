"""One scenario of fasta-sm over the torch_npu stand-in, in a process of its own; prints what it saw as JSON.

    python flow_child.py SCENARIO TABLE STATE_DIR
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


def build(space, heuristic_type="pointwise", **meta):
    from torch_npu._inductor.runtime import triton_heuristics

    fn = SimpleNamespace(__name__="triton_poi_0", fn=object())
    return triton_heuristics.cached_autotune(
        {"x": 1024}, space, {}, heuristic_type, inductor_meta={"kernel_name": "triton_poi_0", **meta}
    )(fn)


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
