"""Chapter 6's kernel figures: the reference FlashAttention against naive attention and PyTorch.

    .venv/bin/python benchmarks/efficient_attention.py [--n 16384] [--d 64] [--block 512] [--threads 1]
    .venv/bin/python benchmarks/efficient_attention.py --sweep        # the scaling table, 512 .. 16384

Prints, at one sequence length (one head, float32, CPU):

* peak memory above the starting point of the reference ``flash_attention`` (forward) and
  ``flash_attention_trainable`` (forward + backward, the custom autograd Function whose
  backward recomputes blocks), of the naive computation (the chapter's ``attention``, which
  stores the N x N weights) and of ``F.scaled_dot_product_attention``;
* their times, best of ``--repeat`` runs, and the ratios the issue sets as targets:
  memory at most 1/50 of the naive computation's, time at most 1.5x that of
  ``F.scaled_dot_product_attention``, forward and forward + backward.

Every measurement runs in a fresh child process, so the peak resident memory (Linux
``VmHWM``, read by the parent from /proc/<pid>/status after the run) belongs to that
measurement alone. Timings on a machine shared with other work are inflated and noisy;
the ratios compare runs taken in the same conditions, interleaved.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, math, sys, time
import torch
import torch.nn.functional as F
sys.path.insert(0, {root!r})
from solutions import ch06_efficient_attention as ref

method, n, d, block, backward, repeat, threads = {args!r}
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 1, n, d, generator=g) for _ in range(3))

def run(q=q, k=k, v=v):
    qq, kk, vv = (x.clone().requires_grad_(backward) for x in (q, k, v))
    if method == "naive":
        out = ref.attention(qq, kk, vv)[0]
    elif method == "sdpa":
        out = F.scaled_dot_product_attention(qq, kk, vv)
    elif method == "flash":
        out = ref.flash_attention_trainable(qq, kk, vv, block) if backward else ref.flash_attention(qq, kk, vv, block)
    else:
        raise SystemExit(method)
    if backward:
        out.sum().backward()
    return out

def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

run(*(torch.randn(1, 1, 256, d, generator=g) for _ in range(3)))   # load kernels and libraries first
gc.collect()
rss_before = status_kib("VmRSS")
open("/proc/self/clear_refs", "w").write("5")
times = []
for _ in range(repeat):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
    gc.collect()
peak = status_kib("VmHWM")
print(json.dumps({{"seconds": min(times), "peak_mib": (peak - rss_before) / 1024}}))
"""


def measure(method, n, d, block, backward, repeat, threads):
    code = CHILD.format(root=str(ROOT), args=(method, n, d, block, backward, repeat, threads))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_size(n, d, block, repeat, threads):
    rows = {}
    for backward in (False, True):
        for method in ("naive", "sdpa", "flash"):
            rows[method, backward] = measure(method, n, d, block, backward, repeat, threads)
    print(f"N = {n}, d = {d}, one head, float32, {threads} thread(s), flash blocks of {block}, best of {repeat}")
    print(f"{'':34s} {'time (s)':>9s} {'peak memory (MiB)':>18s}")
    names = {"naive": "naive (stores the N x N weights)", "sdpa": "F.scaled_dot_product_attention",
             "flash": "reference flash_attention"}
    for backward in (False, True):
        print("forward + backward" if backward else "forward")
        for method in ("naive", "sdpa", "flash"):
            r = rows[method, backward]
            print(f"  {names[method]:32s} {r['seconds']:9.3f} {r['peak_mib']:18.1f}")
    print("targets (reference flash_attention):")
    ok = True
    for backward in (False, True):
        f, s, nv = rows["flash", backward], rows["sdpa", backward], rows["naive", backward]
        mem_ratio = f["peak_mib"] / nv["peak_mib"]
        time_ratio = f["seconds"] / s["seconds"]
        label = "forward + backward" if backward else "forward"
        mem_ok, time_ok = mem_ratio <= 1 / 50, time_ratio <= 1.5
        ok &= mem_ok and time_ok
        print(f"  {label:18s} memory {mem_ratio:.4f} of naive (1/{1 / mem_ratio:.0f}; target <= 1/50: "
              f"{'met' if mem_ok else 'MISSED'}), time {time_ratio:.2f}x F.scaled_dot_product_attention "
              f"(target <= 1.5x: {'met' if time_ok else 'MISSED'})")
    return ok


def sweep(d, block, threads):
    print(f"{'N':>6s} " + " ".join(f"{m + (' fwd+bwd' if b else ' fwd'):>22s}" for b in (False, True)
                                   for m in ("naive", "sdpa", "flash")))
    for n in (512, 1024, 2048, 4096, 8192, 16384):
        cells = []
        for backward in (False, True):
            for method in ("naive", "sdpa", "flash"):
                if method == "naive" and n > (8192 if not backward else 8192):
                    cells.append(f"{'-':>22s}")
                    continue
                r = measure(method, n, d, block, backward, 1, threads)
                cells.append(f"{r['seconds']:9.3f} s {r['peak_mib']:7.0f} MiB")
        print(f"{n:6d} " + " ".join(cells), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--block", type=int, default=512, help="flash_attention block_size (512: a block of scores, 1 MiB, stays in a 2 MiB L2 cache)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sweep", action="store_true", help="time and memory from N = 512 to 16384")
    opts = parser.parse_args()
    if opts.sweep:
        sweep(opts.d, opts.block, opts.threads)
        return 0
    return 0 if one_size(opts.n, opts.d, opts.block, opts.repeat, opts.threads) else 1


if __name__ == "__main__":
    sys.exit(main())
