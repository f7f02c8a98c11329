"""torch_npu's Triton kernel classes: only the imports each generates, an lru-cached classmethod as published."""

import functools

NPU_IMPORTS = """import torch_npu
from torch_npu._inductor.runtime import triton_heuristics as triton_heuristics
"""


class NPUTritonKernel:
    @classmethod
    @functools.lru_cache(None)
    def gen_common_triton_imports(cls) -> str:
        return NPU_IMPORTS


class NPUIndexTritonKernel:
    @classmethod
    @functools.lru_cache(None)
    def gen_common_triton_imports(cls) -> str:
        return NPU_IMPORTS
