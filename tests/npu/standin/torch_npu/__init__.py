"""A stand-in for torch_npu, for tests on machines without Ascend: only the seams fasta-sm touches.

Each module mirrors what fasta-sm relies on in torch_npu 2.13/2.14 (checked
against the published source by tests/npu/test_contract.py): the FastA
switch read from FASTAUTOTUNE when its config loads, the crash on a missing
ENABLE_PRINT_UB_BITS, the `fasta_autotune.NPUFastAutotuner` slot that
`cached_autotune` imports at call time, and NPUCachingAutotuner's
run → autotuner → autotune_to_one_config → benchmark_all_configs → bench flow.
"""
