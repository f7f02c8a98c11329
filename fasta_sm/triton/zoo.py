"""The kernel zoo: the Triton kernels and config spaces the replay data set is recorded from.

It lives in the package, not under benchmarks/, because compile workers (separate processes)
and `fasta-sm record fasta_sm.triton.zoo:<name>` must import each kernel by
module path from any working directory, and because the shipped tables must
say exactly which code produced them.

Every `spec_*` function returns a `KernelSpec`; its keyword arguments set the
problem size, so tests run the same kernels on tiny shapes. Spaces are the
plain cross products a kernel author writes (tiles × warps × stages), with
only the configs that cannot even be register-allocated sensibly left out;
out-of-resource configs stay in: a tuner has to survive them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from ..config import Config
from ..errors import ConfigError
from .spec import KernelSpec

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""Names, not torch dtypes: a compile worker imports this module without loading torch."""


def _space(
    axes: Mapping[str, Iterable[Any]],
    warps: Iterable[int],
    stages: Iterable[int],
    keep=lambda kw, w, s: True,
) -> list[Config]:
    """Cross product of kwarg axes × warps × stages, in a stable order."""
    names = list(axes)
    configs = []
    for values in itertools.product(*(list(axes[n]) for n in names)):
        kwargs = dict(zip(names, values))
        for w in warps:
            for s in stages:
                if keep(kwargs, w, s):
                    configs.append(Config(kwargs, num_warps=w, num_stages=s))
    return configs


def _given(configs: list[Config] | None, default: Callable[[], list[Config]]) -> list[Config]:
    """`configs` as given, or the kernel's own space when none is: an empty list stays empty, for the
    recorder to refuse, rather than passing for no list and recording the whole space."""
    return default() if configs is None else configs


def _per_thread(elements: int, warps: int) -> float:
    return elements / (32 * warps)


# --------------------------------------------------------------------------- matmul


@triton.jit
def _gelu_tanh(x):
    # 0.5·x·(1 + tanh(z)) == x·sigmoid(2z): exact tanh-GELU through sigmoid.
    z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x * tl.sigmoid(2.0 * z)


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_bn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if ACTIVATION == "gelu":
        acc = _gelu_tanh(acc)
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


def _matmul_spec(name, M, N, K, dtype, activation, configs) -> KernelSpec:
    torch_dtype = getattr(torch, _DTYPES[dtype])

    def make_args(device: str) -> tuple:
        a = torch.randn((M, K), device=device, dtype=torch_dtype)
        b = torch.randn((K, N), device=device, dtype=torch_dtype) / math.sqrt(K)
        c = torch.empty((M, N), device=device, dtype=torch_dtype)
        return (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))

    def reference(args: tuple):
        out = args[0].float() @ args[1].float()
        if activation == "gelu":
            out = torch.nn.functional.gelu(out, approximate="tanh")
        return out

    def grid(meta):
        return (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),)

    return KernelSpec(
        name=name,
        fn=matmul_kernel,
        configs=configs,
        make_args=make_args,
        grid=grid,
        shape=_sized({"M": M, "N": N, "K": K, "dtype": dtype, "activation": activation}),
        reference=reference,
        output=2,
        kwargs={"ACTIVATION": activation},
        tolerance=2e-2,
    )


def square_matmul_space(group_m: int = 8) -> list[Config]:
    """216 configs: BM 32–256 × BN 64–256 × BK 32–128 × warps 4/8 × stages 3–5."""
    axes = {"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128], "GROUP_M": [group_m]}
    return _space(axes, warps=[4, 8], stages=[3, 4, 5])


def _sized(shape: dict[str, Any]) -> dict[str, Any]:
    """`shape`, once each of its sizes is a whole number of at least 1: a zero-size problem times nothing."""
    for name, value in shape.items():
        if not isinstance(value, (str, bool)) and not (isinstance(value, int) and value >= 1):
            raise ConfigError(f"shape {shape}: {name}={value!r} must be a whole number of at least 1")
    return shape


def _square_name(prefix: str, M: int, N: int, K: int) -> str:
    """`mm_fp16_4096` for a square problem, `mm_fp16_2048x4096x4096` otherwise: a table per shape."""
    return f"{prefix}_{M}" if M == N == K else f"{prefix}_{M}x{N}x{K}"


def _shape_name(prefix: str, sizes: tuple[int, ...], recorded: tuple[int, ...]) -> str:
    """`rmsnorm_bf16` at the recorded data set's shape, `rmsnorm_bf16_65536x2048` at any other: a table per shape."""
    return prefix if sizes == recorded else f"{prefix}_{'x'.join(map(str, sizes))}"


def spec_mm_bf16_gelu(M: int = 4096, N: int = 4096, K: int = 4096, configs: list[Config] | None = None) -> KernelSpec:
    """Square bf16 matmul with a tanh-GELU epilogue."""
    name = _square_name("mm_bf16_gelu", M, N, K)
    return _matmul_spec(name, M, N, K, "bf16", "gelu", _given(configs, square_matmul_space))


def spec_mm_fp16(M: int = 4096, N: int = 4096, K: int = 4096, configs: list[Config] | None = None) -> KernelSpec:
    """Square fp16 matmul, plain epilogue; 162 configs (stages 2–4, BM ≥ 64)."""
    axes = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128], "GROUP_M": [8]}
    space = _given(configs, lambda: _space(axes, warps=[4, 8], stages=[2, 3, 4]))
    return _matmul_spec(_square_name("mm_fp16", M, N, K), M, N, K, "fp16", "none", space)


def spec_mm_skinny_bf16(M: int = 16, N: int = 8192, K: int = 8192, configs: list[Config] | None = None) -> KernelSpec:
    """Decode-style skinny bf16 matmul (few rows, wide weights); 288 configs."""
    axes = {"BLOCK_M": [16, 32], "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [64, 128, 256], "GROUP_M": [8]}
    space = _given(configs, lambda: _space(axes, warps=[2, 4, 8], stages=[2, 3, 4, 5]))
    return _matmul_spec(_shape_name(f"mm_skinny_bf16_m{M}", (N, K), (8192, 8192)), M, N, K, "bf16", "none", space)


def spec_mm_skinny_fp16(M: int = 64, N: int = 8192, K: int = 8192, configs: list[Config] | None = None) -> KernelSpec:
    """Skinny fp16 matmul, M=64; 216 configs."""
    axes = {"BLOCK_M": [16, 32, 64], "BLOCK_N": [32, 64, 128], "BLOCK_K": [64, 128, 256], "GROUP_M": [8]}
    space = _given(configs, lambda: _space(axes, warps=[4, 8], stages=[2, 3, 4, 5]))
    return _matmul_spec(_shape_name(f"mm_skinny_fp16_m{M}", (N, K), (8192, 8192)), M, N, K, "fp16", "none", space)


# --------------------------------------------------------------------------- row sum


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, M, N, stride_m, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0)
        acc += x.to(tl.float32)
    tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=rows < M)


def spec_row_sum(M: int = 16384, N: int = 8192, configs: list[Config] | None = None) -> KernelSpec:
    """fp32 row sum over a looped N; tiles of at most 16K elements."""
    axes = {"ROWS": [1, 2, 4, 8, 16], "BLOCK_N": [256, 512, 1024, 2048, 4096, 8192]}
    keep = lambda kw, w, s: kw["ROWS"] * kw["BLOCK_N"] <= 16384 and _per_thread(kw["ROWS"] * kw["BLOCK_N"], w) <= 256
    space = _given(configs, lambda: _space(axes, warps=[1, 2, 4, 8, 16], stages=[1, 2, 3], keep=keep))

    def make_args(device: str) -> tuple:
        x = torch.randn((M, N), device=device, dtype=torch.float32)
        out = torch.empty((M,), device=device, dtype=torch.float32)
        return (x, out, M, N, x.stride(0))

    return KernelSpec(
        name=_shape_name("row_sum_fp32", (M, N), (16384, 8192)),
        fn=row_sum_kernel,
        configs=space,
        make_args=make_args,
        grid=lambda meta: (triton.cdiv(meta["M"], meta["ROWS"]),),
        shape=_sized({"M": M, "N": N, "dtype": "fp32"}),
        reference=lambda args: args[0].double().sum(dim=1),
        output=1,
        tolerance=1e-5,
    )


# --------------------------------------------------------------------------- RMSNorm


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, M, N, stride_m, eps, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(y_ptr + rows[:, None] * stride_m + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def spec_rmsnorm(M: int = 16384, N: int = 8192, configs: list[Config] | None = None) -> KernelSpec:
    """bf16 RMSNorm, two passes over a looped row."""
    axes = {"ROWS": [1, 2, 4], "BLOCK_N": [512, 1024, 2048, 4096, 8192]}
    keep = lambda kw, w, s: _per_thread(kw["ROWS"] * kw["BLOCK_N"], w) <= 128
    space = _given(configs, lambda: _space(axes, warps=[1, 2, 4, 8, 16, 32], stages=[1, 2], keep=keep))

    def make_args(device: str) -> tuple:
        x = torch.randn((M, N), device=device, dtype=torch.bfloat16)
        w = torch.rand((N,), device=device, dtype=torch.bfloat16) + 0.5
        y = torch.empty_like(x)
        return (x, w, y, M, N, x.stride(0), 1e-6)

    def reference(args: tuple):
        x, w = args[0].float(), args[1].float()
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6) * w

    return KernelSpec(
        name=_shape_name("rmsnorm_bf16", (M, N), (16384, 8192)),
        fn=rmsnorm_kernel,
        configs=space,
        make_args=make_args,
        grid=lambda meta: (triton.cdiv(meta["M"], meta["ROWS"]),),
        shape=_sized({"M": M, "N": N, "dtype": "bf16"}),
        reference=reference,
        output=2,
        tolerance=1e-2,
    )


# --------------------------------------------------------------------------- softmax


@triton.jit
def softmax_kernel(x_ptr, y_ptr, M, N, stride_m, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    s = tl.zeros((ROWS,), tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=float("-inf"))
        y = tl.exp(x - m[:, None]) / s[:, None]
        tl.store(y_ptr + rows[:, None] * stride_m + cols[None, :], y, mask=mask)


def spec_softmax(M: int = 8192, N: int = 8192, configs: list[Config] | None = None) -> KernelSpec:
    """fp32 online softmax over a looped row."""
    axes = {"ROWS": [1, 2, 4], "BLOCK_N": [1024, 2048, 4096, 8192]}
    keep = lambda kw, w, s: _per_thread(kw["ROWS"] * kw["BLOCK_N"], w) <= 128
    space = _given(configs, lambda: _space(axes, warps=[4, 8, 16], stages=[1, 2], keep=keep))

    def make_args(device: str) -> tuple:
        x = torch.randn((M, N), device=device, dtype=torch.float32)
        return (x, torch.empty_like(x), M, N, x.stride(0))

    return KernelSpec(
        name=_shape_name("softmax_fp32", (M, N), (8192, 8192)),
        fn=softmax_kernel,
        configs=space,
        make_args=make_args,
        grid=lambda meta: (triton.cdiv(meta["M"], meta["ROWS"]),),
        shape=_sized({"M": M, "N": N, "dtype": "fp32"}),
        reference=lambda args: torch.softmax(args[0].double(), dim=1),
        output=1,
        tolerance=1e-5,
    )


# --------------------------------------------------------------------------- attention


@triton.jit
def attention_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    sm_scale,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One (batch·head, query block) per program; q, k, v, o are [Z·H, N_CTX, HEAD_DIM],
    # N_CTX a multiple of both blocks (the spec's shapes are).
    base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    for start_n in range(0, N_CTX, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_ptr + base + cols[None, :] * HEAD_DIM + offs_d[:, None])
        qk = tl.dot(q, k) * qk_scale
        m_ij = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp2(qk - m_ij[:, None])
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + cols[:, None] * HEAD_DIM + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(o_ptr.dtype.element_ty))


def spec_attention(
    Z: int = 4,
    H: int = 16,
    N_CTX: int = 4096,
    HEAD_DIM: int = 64,
    dtype: str = "fp16",
    configs: list[Config] | None = None,
) -> KernelSpec:
    """Flash-attention forward (non-causal) for one head dim; 160 configs."""
    axes = {"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256]}
    space = _given(configs, lambda: _space(axes, warps=[4, 8], stages=[1, 2, 3, 4]))

    def make_args(device: str) -> tuple:
        shape = (Z * H, N_CTX, HEAD_DIM)
        q, k, v = (torch.randn(shape, device=device, dtype=getattr(torch, _DTYPES[dtype])) for _ in range(3))
        return (q, k, v, torch.empty_like(q), HEAD_DIM**-0.5, N_CTX)

    def reference(args: tuple):
        q, k, v = (t.float() for t in args[:3])
        return torch.softmax((q @ k.transpose(1, 2)) * args[4], dim=-1) @ v

    return KernelSpec(
        name=_shape_name(f"attention_fwd_{dtype}_d{HEAD_DIM}", (Z, H, N_CTX), (4, 16, 4096)),
        fn=attention_fwd_kernel,
        configs=space,
        make_args=make_args,
        grid=lambda meta: (meta["N_CTX"] // meta["BLOCK_M"], Z * H),
        shape=_sized({"Z": Z, "H": H, "N_CTX": N_CTX, "HEAD_DIM": HEAD_DIM, "dtype": dtype, "causal": False}),
        reference=reference,
        output=3,
        kwargs={"HEAD_DIM": HEAD_DIM},
        tolerance=1e-2,
    )


def spec_attention_d128(Z: int = 4, H: int = 16, N_CTX: int = 4096, configs: list[Config] | None = None) -> KernelSpec:
    """bf16 flash-attention forward with head dim 128; 128 configs (BLOCK_N ≤ 128)."""
    axes = {"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128]}
    space = _given(configs, lambda: _space(axes, warps=[4, 8], stages=[1, 2, 3, 4]))
    return spec_attention(Z=Z, H=H, N_CTX=N_CTX, HEAD_DIM=128, dtype="bf16", configs=space)


# --------------------------------------------------------------------------- pointwise


@triton.jit
def add_gelu_kernel(x_ptr, bias_ptr, y_ptr, M, N, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = _gelu_tanh(x + b[None, :])
    tl.store(y_ptr + rows[:, None] * stride_m + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def spec_add_gelu(M: int = 16384, N: int = 8192, configs: list[Config] | None = None) -> KernelSpec:
    """bf16 bias-add + GELU over 2D tiles."""
    axes = {"BLOCK_M": [1, 2, 4, 8, 16, 32, 64], "BLOCK_N": [64, 128, 256, 512, 1024, 2048, 4096]}
    keep = lambda kw, w, s: (
        256 <= kw["BLOCK_M"] * kw["BLOCK_N"] <= 32768 and _per_thread(kw["BLOCK_M"] * kw["BLOCK_N"], w) <= 128
    )
    space = _given(configs, lambda: _space(axes, warps=[1, 2, 4, 8, 16], stages=[1, 2, 3], keep=keep))

    def make_args(device: str) -> tuple:
        x = torch.randn((M, N), device=device, dtype=torch.bfloat16)
        bias = torch.randn((N,), device=device, dtype=torch.bfloat16)
        return (x, bias, torch.empty_like(x), M, N, x.stride(0))

    return KernelSpec(
        name=_shape_name("add_gelu_bf16", (M, N), (16384, 8192)),
        fn=add_gelu_kernel,
        configs=space,
        make_args=make_args,
        grid=lambda meta: (triton.cdiv(meta["M"], meta["BLOCK_M"]), triton.cdiv(meta["N"], meta["BLOCK_N"])),
        shape=_sized({"M": M, "N": N, "dtype": "bf16"}),
        reference=lambda args: torch.nn.functional.gelu(args[0].float() + args[1].float(), approximate="tanh"),
        output=2,
        tolerance=1e-2,
    )


# --------------------------------------------------------------------------- transpose


@triton.jit
def transpose_kernel(
    x_ptr, y_ptr, M, N, stride_xm, stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask)
    tl.store(y_ptr + cols[:, None] * stride_ym + rows[None, :], tl.trans(tile), mask=tl.trans(mask))


def spec_transpose(M: int = 8192, N: int = 8192, configs: list[Config] | None = None) -> KernelSpec:
    """fp32 2D transpose (out-of-place copy) with grouped tile order; over 1,000 configs."""
    axes = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256], "GROUP_M": [1, 2, 4, 8, 16]}
    keep = lambda kw, w, s: _per_thread(kw["BLOCK_M"] * kw["BLOCK_N"], w) <= 256
    space = _given(configs, lambda: _space(axes, warps=[1, 2, 4, 8, 16], stages=[1, 2], keep=keep))

    def make_args(device: str) -> tuple:
        x = torch.randn((M, N), device=device, dtype=torch.float32)
        y = torch.empty((N, M), device=device, dtype=torch.float32)
        return (x, y, M, N, x.stride(0), y.stride(0))

    return KernelSpec(
        name=_shape_name("transpose_fp32", (M, N), (8192, 8192)),
        fn=transpose_kernel,
        configs=space,
        make_args=make_args,
        grid=lambda meta: (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),),
        shape=_sized({"M": M, "N": N, "dtype": "fp32"}),
        reference=lambda args: args[0].t(),
        output=1,
        tolerance=0.0,
    )


ZOO = {
    "mm_bf16_gelu": spec_mm_bf16_gelu,
    "mm_fp16": spec_mm_fp16,
    "mm_skinny_bf16": spec_mm_skinny_bf16,
    "mm_skinny_fp16": spec_mm_skinny_fp16,
    "attention": spec_attention,
    "attention_d128": spec_attention_d128,
    "row_sum": spec_row_sum,
    "rmsnorm": spec_rmsnorm,
    "softmax": spec_softmax,
    "add_gelu": spec_add_gelu,
    "transpose": spec_transpose,
}
"""Every spec of the recorded data set, by short name (`fasta_sm.triton.zoo:spec_<name>`)."""
