"""Imported by the kernel source fasta-sm's codegen patch writes: installs FastaNPUAutotuner where the kernel loads.

In torch_npu's compile workers fasta-sm's entry point never ran (see
`fasta_sm.npu.codegen`); this import runs there before the kernel's decorator
builds its autotuner. Only a process fasta-sm is on in (FASTA_SM_NPU=1,
inherited from `enable()`) installs anything; one that called `disable()`
keeps torch_npu's own.
"""

from . import install_for_kernel_source

install_for_kernel_source()
