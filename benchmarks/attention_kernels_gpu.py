"""Chapter 10's Triton kernels against PyTorch on a CUDA GPU; on a CPU, their correctness only.

    .venv/bin/python benchmarks/attention_kernels_gpu.py                  # GPU: the whole sweep
    .venv/bin/python benchmarks/attention_kernels_gpu.py --n 4096 16384 --d 64 --dtype bf16 --causal on
        [--batch 1] [--heads 16] [--block-m 64] [--block-n 64] [--pass fwd fwd+bwd]
        [--kernels solutions.ch10_attention_kernels]

On a machine with a CUDA GPU, times the chapter's reference kernels (``flash_attention_forward``
and ``flash_attention_backward`` of ``solutions/ch10_attention_kernels.py``, or of any module with
the same wrappers: ``--kernels``) against ``F.scaled_dot_product_attention`` and a naive PyTorch
attention (``softmax(q kᵀ · scale) v``, the N × N scores stored), forward and forward+backward,
N from 128 to 16,384, d 64 and 128, float16 and bfloat16, causal and not. Each time is the median
of ``triton.testing.do_bench`` (which flushes the L2 cache between runs); TFLOP/s count
4·B·H·N²·d for a forward (two matrix products of 2·N²·d each per head), halved when causal,
and the backward as 2.5 forwards (FlashAttention-2's count: two products more than the forward,
plus the recomputed scores), so forward+backward is 3.5 forwards. Peak memory is the most
allocated above the inputs during one call (``torch.cuda.max_memory_allocated``). The error
column is the largest difference from float32 SDPA on the same inputs (the output, or dq, dk,
dv). The reference kernels are the chapter's teaching kernels (no autotuning, one tile size,
4 warps): expect them below SDPA's FlashAttention. CS336's public leaderboard (assignment 2:
H100, bf16, causal, 16 heads of 64, N = 16,384, forward+backward) has a PyTorch baseline of
80 ms and a best of 5.4 ms: `--batch 1 --heads 16 --d 64 --dtype bf16 --causal on --n 16384`
is that shape.

Without a CUDA GPU, Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is imported)
runs the kernels on the CPU with numpy, one program at a time, about 5 ms per tile iteration
whatever the tile: its times say nothing about a GPU. Then the script checks correctness only,
at a few small shapes (ragged sequence lengths, causal and not, float32 and float16), against
float64 autograd of the naive attention, and prints the largest errors and the interpreter's
seconds; it exits 1 if an error is above the tolerance.
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
if not ON_GPU:  # as the chapter's export cell: set before triton is imported, or it compiles for a GPU
    os.environ["TRITON_INTERPRET"] = "1"
DEVICE = "cuda"  # the GPU path's device (the CPU path makes its tensors on the CPU, as the interpreter needs)

KERNELS = "solutions.ch10_attention_kernels"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PASSES = ("fwd", "fwd+bwd")
METHODS = ("triton", "sdpa", "naive")

# CPU check: (B, H, N, d, causal, dtype, block_m, block_n); N not a multiple of the tiles
CPU_CASES = [
    (1, 2, 40, 16, False, torch.float32, 16, 16),
    (1, 2, 40, 16, True, torch.float32, 16, 16),
    (2, 1, 33, 32, True, torch.float32, 32, 16),
    (1, 1, 48, 64, True, torch.float16, 16, 32),
]
CPU_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2}


def attention_flops(batch, heads, n, d, causal, pass_name) -> float:
    """Matrix-product FLOPs of one call: 4·B·H·N²·d forward, half of it causal; backward 2.5× forward."""
    forward = 4.0 * batch * heads * n * n * d / (2 if causal else 1)
    return forward * (3.5 if pass_name == "fwd+bwd" else 1.0)


def naive_scores(q, k, causal=False, scale=None):
    """scale · q kᵀ, (B, H, N, N), -inf above the diagonal when causal."""
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n = q.size(-2)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores


def naive_attention(q, k, v, causal=False, scale=None):
    """softmax(q kᵀ · scale) v with the (B, H, N, N) scores and weights stored."""
    return torch.softmax(naive_scores(q, k, causal, scale), dim=-1) @ v  # (B, H, N, d)


def run(kernels, method, pass_name, q, k, v, do, causal, block_m, block_n):
    """One call of METHOD: the output (``fwd``) or the gradients dq, dk, dv (``fwd+bwd``), as a tuple."""
    if method == "triton":
        o, lse = kernels.flash_attention_forward(q, k, v, causal, None, block_m, block_n)
        if pass_name == "fwd":
            return (o,)
        return kernels.flash_attention_backward(q, k, v, o, lse, do, causal, None, block_m, block_n)
    attend = {"sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
              "naive": lambda q, k, v: naive_attention(q, k, v, causal)}[method]
    if pass_name == "fwd":
        with torch.no_grad():
            return (attend(q, k, v),)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]          # fresh leaves: no gradient accumulates
    return torch.autograd.grad(attend(*leaves), leaves, do)


def largest_error(got, want) -> float:
    return max(float((g.detach().float() - w.detach().float()).abs().max()) for g, w in zip(got, want))


# ------------------------------------------------------------------------------------------- GPU

def peak_mib(fn) -> float:
    """The most memory allocated above what was allocated before, during one call of FN."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def gpu_sweep(args, kernels) -> int:
    import triton.testing

    print(f"CUDA GPU: {torch.cuda.get_device_name()}; kernels from {args.kernels}, "
          f"tiles {args.block_m} x {args.block_n}; B = {args.batch}, H = {args.heads}")
    print("ms: median of triton.testing.do_bench; TFLOP/s: 4·B·H·N²·d per forward (half when causal), "
          "backward 2.5 forwards; peak: MiB above the inputs; error: largest |difference| from float32 SDPA")
    header = (f"{'N':>6} {'d':>4} {'dtype':>5} {'causal':>6} {'pass':>7} {'method':>7} {'ms':>10} "
              f"{'TFLOP/s':>8} {'peak MiB':>9} {'error':>9}")
    print(header)
    print("-" * len(header))
    failures = 0
    for d in args.d:
        for dtype_name in args.dtype:
            for causal in args.causal:
                for n in args.n:
                    gen = torch.Generator(device=DEVICE).manual_seed(0)
                    shape = (args.batch, args.heads, n, d)
                    q, k, v, do = (torch.randn(shape, device=DEVICE, dtype=DTYPES[dtype_name], generator=gen)
                                   for _ in range(4))
                    for pass_name in args.passes:
                        want = run(None, "sdpa", pass_name, q.float(), k.float(), v.float(), do.float(), causal,
                                   0, 0)
                        for method in METHODS:
                            row = f"{n:6d} {d:4d} {dtype_name:>5} {str(causal):>6} {pass_name:>7} {method:>7} "

                            def call(method=method, pass_name=pass_name):
                                return run(kernels, method, pass_name, q, k, v, do, causal,
                                           args.block_m, args.block_n)
                            try:
                                error = largest_error(call(), want)
                                peak = peak_mib(call)
                                ms = triton.testing.do_bench(call, return_mode="median")
                            except torch.cuda.OutOfMemoryError:
                                print(row + f"{'out of memory':>10}")
                                torch.cuda.empty_cache()
                                continue
                            except Exception as err:  # noqa: BLE001 - a kernel that fails at one shape: say so, go on
                                failures += 1
                                print(row + f"failed: {type(err).__name__}: {str(err).splitlines()[0][:80]}")
                                continue
                            tflops = attention_flops(args.batch, args.heads, n, d, causal, pass_name) / (ms * 1e-3) / 1e12
                            print(row + f"{ms:10.3f} {tflops:8.2f} {peak:9.1f} {error:9.2e}")
                        del want
                    del q, k, v, do
                    torch.cuda.empty_cache()
    print("CS336 leaderboard (H100, bf16, causal, 16 heads of 64, N = 16,384, forward+backward): "
          "PyTorch baseline 80 ms, best 5.4 ms")
    return 1 if failures else 0


# ------------------------------------------------------------------------------------------- CPU

def cpu_check(args, kernels) -> int:
    print("No CUDA GPU: Triton's interpreter (TRITON_INTERPRET=1) runs the kernels on the CPU with numpy, "
          "one program at a time (about 5 ms per tile iteration). Its times are not a GPU's: correctness only, "
          f"against float64 autograd of the naive attention; kernels from {args.kernels}.")
    header = (f"{'B,H,N,d':>12} {'causal':>6} {'dtype':>8} {'tiles':>6} {'|Δo|':>8} {'|Δlse|':>8} {'|Δdq|':>8} "
              f"{'|Δdk|':>8} {'|Δdv|':>8} {'fwd s':>6} {'bwd s':>6}  verdict")
    print(header)
    print("-" * len(header))
    failures = 0
    for b, h, n, d, causal, dtype, block_m, block_n in CPU_CASES:
        gen = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, generator=gen).to(dtype) for _ in range(4))
        exact = [x.double().requires_grad_() for x in (q, k, v)]
        o_want = naive_attention(*exact, causal)
        grads_want = torch.autograd.grad(o_want, exact, do.double())
        lse_want = torch.logsumexp(naive_scores(exact[0], exact[1], causal), dim=-1)
        started = time.perf_counter()
        o, lse = kernels.flash_attention_forward(q, k, v, causal, None, block_m, block_n)
        forward_s = time.perf_counter() - started
        started = time.perf_counter()
        grads = kernels.flash_attention_backward(q, k, v, o, lse, do, causal, None, block_m, block_n)
        backward_s = time.perf_counter() - started
        errors = [largest_error((o,), (o_want,)), largest_error((lse,), (lse_want,)),
                  *(largest_error((g,), (w,)) for g, w in zip(grads, grads_want))]
        ok = all(e <= CPU_TOLERANCE[dtype] for e in errors) and o.dtype == dtype and lse.dtype == torch.float32
        failures += not ok
        shape = f"{b},{h},{n},{d}"
        print(f"{shape:>12} {str(causal):>6} {str(dtype).removeprefix('torch.'):>8} {f'{block_m}x{block_n}':>6} "
              + " ".join(f"{e:8.1e}" for e in errors)
              + f" {forward_s:6.2f} {backward_s:6.2f}  {'ok' if ok else 'TOO FAR'}")
    print(f"tolerance: {CPU_TOLERANCE[torch.float32]:.0e} (float32), {CPU_TOLERANCE[torch.float16]:.0e} (float16); "
          "on a GPU this script times the kernels against SDPA and the naive attention")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2**i for i in range(7, 15)])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["fp16", "bf16"])
    parser.add_argument("--causal", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--pass", dest="passes", nargs="+", choices=PASSES, default=list(PASSES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--block-m", type=int, default=64)
    parser.add_argument("--block-n", type=int, default=64)
    parser.add_argument("--kernels", default=KERNELS, help="a module with the chapter's wrappers")
    args = parser.parse_args(argv)
    args.causal = [c == "on" for c in args.causal]
    kernels = importlib.import_module(args.kernels)
    return gpu_sweep(args, kernels) if ON_GPU else cpu_check(args, kernels)


if __name__ == "__main__":
    sys.exit(main())
