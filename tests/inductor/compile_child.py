"""torch.compile in a fresh process with fasta-sm on; prints what was built, as JSON.

usage: python compile_child.py STATE_DIR [interpret]
With `interpret` (CPU): Inductor's Triton backend for CPU under TRITON_INTERPRET=1,
which builds every autotuner (so the codegen patch, the hook and the dispatcher
all run) but launches configs[0] without tuning. On a GPU: the real thing.
"""

import json
import os
import sys
import tempfile

interpret = len(sys.argv) > 2 and sys.argv[2] == "interpret"
if interpret:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fasta-inductor-"))

import torch
import torch._inductor.config as inductor_config

import fasta_sm.inductor as fi
from fasta_sm.inductor.autotuner import FastaCachingAutotuner
from fasta_sm.store import StateStore

device = "cpu" if interpret else "cuda"
if interpret:
    import torch.utils._triton as triton_utils

    inductor_config.cpu_backend = "triton"
    triton_utils.triton_hash_with_backend = lambda: "cpu-interpreter"  # no Triton driver on a CPU box

if os.environ.get("FASTA_SM_TEST_BENCHMARK_FUSION"):
    inductor_config.benchmark_fusion = True  # Inductor compiles and times kernels to choose fusions

from torch._inductor.runtime import triton_heuristics

names = []  # the name of every autotuner built in this process, fasta-sm's or Inductor's
base_init = triton_heuristics.CachingAutotuner.__init__


def name_spy(self, *args, **kwargs):
    base_init(self, *args, **kwargs)
    names.append(str(self.inductor_meta.get("kernel_name")))


triton_heuristics.CachingAutotuner.__init__ = name_spy
built = []
init = FastaCachingAutotuner.__init__


def spy(self, *args, **kwargs):
    init(self, *args, **kwargs)
    built.append(self)


FastaCachingAutotuner.__init__ = spy

kill_after = int(os.environ.get("FASTA_SM_TEST_KILL_AFTER_BENCH", "0"))
if kill_after:
    bench = FastaCachingAutotuner._fasta_bench
    calls = []

    def dying_bench(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > kill_after:
            os._exit(9)  # like a kill: no cleanup, no atexit
        return bench(self, *args, **kwargs)

    FastaCachingAutotuner._fasta_bench = dying_bench
fi.enable(state_dir=sys.argv[1], max_configs=24)


def f(x, y):
    return torch.relu(x + y).sum(dim=-1), (x * 2 + y).amax(0)


def softmax_like(x, y):  # a reduction and its consumers: fusions that benchmark_fusion times
    shifted = x - x.amax(-1, keepdim=True)
    return shifted.exp() / shifted.exp().sum(-1, keepdim=True) + y


if os.environ.get("FASTA_SM_TEST_BENCHMARK_FUSION"):
    f = softmax_like  # noqa: F811


x = torch.randn(32, 128, device=device)
y = torch.randn(32, 128, device=device)
out = torch.compile(f)(x, y)
ok = all(torch.allclose(a, b, atol=1e-4) for a, b in zip(out, f(x, y)))
store = StateStore(sys.argv[1])
states = [store.read(path) for path in store.state_files()]
print(json.dumps({
    "correct": ok,
    # built in this process: every kernel under the interpreter, only parent-side reloads with compile workers
    "kernels": [{"kind": k.heuristic_type.name, "space": len(k._fasta_space),
                 "tuned": k._fasta_plan is not None, "must": k._fasta_plan.must if k._fasta_plan else []}
                for k in built],
    "names": names,
    "states": [{"kernel": s.kernel, "position": s.position(), "configs": s.n_configs,
                "measured": s.measured_count()} for s in states],
}))
