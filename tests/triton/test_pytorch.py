"""PyTorch takes a `fasta_sm.autotune` kernel for a Triton autotuned kernel: wrap_triton, triton_op, torch.compile."""

from __future__ import annotations

import pytest
import torch
import triton
from kernels import CONFIGS, accumulate_kernel, grid, make_tuned
from triton_device import DEVICE

import fasta_sm
from fasta_sm.store import StateStore


def inputs(n=1000):
    return torch.randn(n, device=DEVICE), torch.zeros(n, device=DEVICE)


def test_wrap_triton_launches_it_and_the_launch_is_a_durable_tune(tmp_path):
    kernel = make_tuned(str(tmp_path), policy="exhaustive")
    x, out = inputs()
    torch.library.wrap_triton(kernel)[grid](x, out, x.numel(), 2.0)
    torch.testing.assert_close(out, 2.0 * x)
    (state,) = [StateStore.read(path) for path in StateStore(tmp_path).state_files()]
    assert state.done and state.evaluations() == len(CONFIGS)


def test_a_triton_op_built_on_it_runs_and_gives_the_kernels_output(tmp_path):
    kernel = make_tuned(str(tmp_path), policy="exhaustive")

    @torch.library.triton_op("fasta_sm_tests::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        torch.library.wrap_triton(kernel)[grid](x, out, x.numel(), 2.0)
        return out

    x, _ = inputs()
    torch.testing.assert_close(twice(x), 2.0 * x)


def test_pytorch_reads_its_tuning_arguments_under_tritons_names(tmp_path):
    kernel = make_tuned(str(tmp_path), prune_configs_by={"top_k": 4, "perf_model": lambda **_: 1.0})
    assert isinstance(kernel, triton.runtime.autotuner.Autotuner)
    assert (kernel.fn, kernel.configs, kernel.keys) == (accumulate_kernel, CONFIGS, ["n"])
    assert (kernel.reset_to_zero, kernel.restore_value, kernel.configs_top_k) == (["out_ptr"], [], 4)
    assert (kernel.user_defined_pre_hook, kernel.user_defined_post_hook, kernel.use_cuda_graph) == (False, False, False)


def compiled_twice(kernel, backend):
    def twice(x):
        out = torch.zeros_like(x)
        kernel[grid](x, out, x.numel(), 2.0)
        return out

    return torch.compile(twice, backend=backend, fullgraph=True)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU: torch.compile traces Triton kernels only there")
def test_torch_compile_traces_its_launch_whole_and_inductor_compiles_its_configs(tmp_path):
    kernel = make_tuned(str(tmp_path))
    x, _ = inputs()
    torch.testing.assert_close(compiled_twice(kernel, "inductor")(x), 2.0 * x)
    assert kernel.results == {}  # Inductor tuned the configs itself: fasta-sm's tune did not run


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU: torch.compile traces Triton kernels only there")
def test_under_a_backend_that_runs_the_graph_eagerly_the_launch_is_a_durable_tune(tmp_path):
    kernel = make_tuned(str(tmp_path), policy="exhaustive")
    x, _ = inputs()
    torch.testing.assert_close(compiled_twice(kernel, "aot_eager")(x), 2.0 * x)
    (result,) = kernel.results.values()
    assert result.state.done and result.state.evaluations() == len(CONFIGS)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU: torch.compile traces Triton kernels only there")
def test_torch_compile_refuses_a_pre_hook_whole_as_it_does_for_triton_autotune(tmp_path):
    kernel = fasta_sm.autotune(CONFIGS, key=["n"], pre_hook=lambda nargs, reset_only=False: nargs["out_ptr"].zero_(),
                               state_dir=str(tmp_path))(accumulate_kernel)
    x, _ = inputs()
    with pytest.raises(Exception, match="pre_hook and post_hook are not supported"):
        compiled_twice(kernel, "inductor")(x)
