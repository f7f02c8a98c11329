"""Importing torch_npu's Inductor backend: what its 2.13/2.14 `_load_triton_backend` does with the switch on."""

import logging
import os

if os.environ.get("STANDIN_BACKEND_ERROR"):
    raise RuntimeError("triton-ascend does not match this torch_npu (stand-in)")

if os.environ.get("FASTAUTOTUNE", "0") == "1" and os.environ.get("ENABLE_PRINT_UB_BITS", "0") == "0":
    logging.getLogger("torch_npu._inductor").warnings("Please set ENABLE_PRINT_UB_BITS to 1.")  # as published
