"""The NPU codegen patch: kernel source that imports fasta-sm's hook, so compile workers build fasta-sm's class.

torch_npu 2.13 and 2.14 warm Inductor's compile pool while importing
`torch_npu._inductor`, with `TORCH_DEVICE_BACKEND_AUTOLOAD=0`, so fasta-sm's
`torch.backends` entry point never runs in those workers. The kernel's own
source does run there: the patch adds the hook's import right after the line
that imports torch_npu's `triton_heuristics` in the imports its Triton kernel
classes generate (`gen_common_triton_imports`, which combo kernels reuse), so
it runs before the kernel's decorator builds its autotuner. The settings need
not travel in the source: the workers inherit the environment `enable()` set
before it imported torch_npu. Source without that line is left unchanged; its
kernels then stay torch_npu's (`FastaNPUAutotuner.__setstate__`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..driver import call_after_import, cancel_after_import, hook_import

CODEGEN_MODULE = "torch_npu._inductor.codegen.triton"
KERNEL_CLASSES = ("NPUTritonKernel", "NPUIndexTritonKernel")
"""torch_npu's Triton kernel classes, each with imports of its own (checked against the published source by
tests/npu/test_contract.py)."""
IMPORTS = "gen_common_triton_imports"
ANCHOR = "from torch_npu._inductor.runtime import triton_heuristics as triton_heuristics"
HOOK = hook_import("fasta_sm.npu.hook", "torch_npu")

_saved: dict[type, Any] = {}
"""Each patched class's own `gen_common_triton_imports`, as it was in its `__dict__`."""


def with_hook(source: str) -> str:
    """`source` with the hook's import after torch_npu's `triton_heuristics` import, or unchanged."""
    if ANCHOR not in source or f"{ANCHOR}\n{HOOK}" in source:
        return source
    return source.replace(ANCHOR, f"{ANCHOR}\n{HOOK}", 1)


def without_hook(source: str) -> str:
    """`source` as torch_npu wrote it, before `with_hook`."""
    return source.replace(f"{ANCHOR}\n{HOOK}", ANCHOR, 1)


def patch() -> None:
    """Write the hook into the kernels torch_npu generates from now on: now, or once its codegen is imported."""
    call_after_import(CODEGEN_MODULE, _patch_loaded)


def unpatch() -> None:
    """Put back each class's own imports (and forget a patch still waiting for the codegen)."""
    cancel_after_import(CODEGEN_MODULE)
    for kernel_cls, original in _saved.items():
        setattr(kernel_cls, IMPORTS, original)
    _saved.clear()


def _patch_loaded() -> None:
    codegen = sys.modules[CODEGEN_MODULE]
    for name in KERNEL_CLASSES:
        kernel_cls = getattr(codegen, name, None)
        original = None if kernel_cls is None else kernel_cls.__dict__.get(IMPORTS)
        if not isinstance(original, classmethod) or kernel_cls in _saved:
            continue
        _saved[kernel_cls] = original
        setattr(kernel_cls, IMPORTS, classmethod(_hooked(original.__func__)))


def _hooked(imports: Callable[[type], str]) -> Callable[[type], str]:
    def gen_common_triton_imports(cls: type) -> str:
        return with_hook(imports(cls))

    gen_common_triton_imports.__wrapped__ = imports  # type: ignore[attr-defined]
    return gen_common_triton_imports
