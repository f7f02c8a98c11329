"""Imported by generated kernel source: installs the dispatcher wherever the kernel is loaded.

A patch applied in the parent does not reach async_compile's subprocess
workers; an import in the kernel's own source does (torch_npu reaches its
workers the same way). The dispatcher leaves kernels without fasta-sm
settings untouched, so having it installed in a worker costs nothing.
"""

from . import turned_off
from .autotuner import install

if not turned_off():  # a process that called disable() keeps Inductor's own autotuner
    install()
