"""Check Chapter 10's catalog against plain PyTorch under TRITON_INTERPRET=1, before the grader exists.

    nice .venv/bin/python drafts/ch10/catalog/check.py [name ...]

Each submission (a correct style or a mistake: exercise -> answer cell) is executed after the
chapter's fixed export cell, in one namespace as a notebook would run it (exercises missing from a
style come from the offsets style). Every exercise is then compared with naive attention and
autograd on small shapes (ragged N, causal, float16, several tiles). A correct style must pass
everything; a mistake must fail exactly the exercises it names and pass the others.
"""
from __future__ import annotations

import math
import os
import sys
import time
import traceback

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

import submissions  # noqa: E402

EXPORT = '''
import math
import os

import torch

if not torch.cuda.is_available():  # no GPU: Triton's interpreter runs the kernels on the CPU, with numpy
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton
import triton.language as tl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
'''


def run_cells(answers: dict) -> dict:
    ns: dict = {"__name__": "__main__"}
    exec(compile(EXPORT, "<export>", "exec"), ns)
    for name in submissions.EXERCISES:
        exec(compile(answers[name], f"<{name}>", "exec"), ns)
    return ns


# ------------------------------------------------------------------ plain PyTorch
def naive(q, k, v, causal, scale):
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


def close(a, b, tol):
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    err = (a.double() - b.double()).abs().max().item()
    return None if err <= tol else f"max error {err:.3g} > {tol}"


def check_softmax(ns):
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(6, 80, generator=g)
    cases = [torch.randn(5, 37, generator=g), torch.randn(3, 1, generator=g), wide[:, 3:40],
             torch.randn(4, 64, generator=g) * 1e4, (-torch.rand(3, 19, generator=g) * 50),
             torch.randn(4, 300, generator=g).half()]
    for x in cases:
        y = ns["softmax"](x)
        if y.dtype != x.dtype:
            return f"dtype {y.dtype}"
        bad = close(y, torch.softmax(x.double(), -1), 1e-3 if x.dtype == torch.half else 1e-5)
        if bad:
            return f"{tuple(x.shape)} {x.dtype}: {bad}"


def check_online(ns):
    g = torch.Generator().manual_seed(1)
    for R, C, bs in [(3, 37, 16), (2, 64, 32), (2, 5, 16), (1, 100, 64)]:
        x = torch.randn(R, C, generator=g) * 3
        m, l = ns["online_softmax_states"](x, bs)
        n_b = math.ceil(C / bs)
        ends = [min((b + 1) * bs, C) for b in range(n_b)]
        m_ref = torch.stack([x[:, :e].max(1).values for e in ends], 1)
        l_ref = torch.stack([torch.exp(x[:, :e] - m_ref[:, [b]]).sum(1) for b, e in enumerate(ends)], 1)
        bad = close(m, m_ref, 1e-6) or close(l, l_ref, 1e-4)
        if bad:
            return f"({R},{C}) block {bs}: {bad}"


FWD_CASES = [((1, 2, 37, 16), False, None, 16, 16), ((1, 2, 37, 16), True, None, 16, 16),
             ((1, 1, 50, 32), True, 0.3, 32, 16), ((1, 1, 50, 32), True, None, 16, 32),
             ((2, 1, 20, 16), False, None, 16, 16), ((1, 1, 16, 64), True, None, 16, 16)]


def qkv(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(3)]


def check_forward(ns):
    for i, (shape, causal, scale, bm, bn) in enumerate(FWD_CASES):
        q, k, v = qkv(shape, i)
        o, lse = ns["flash_attention_forward"](q, k, v, causal=causal, scale=scale, block_m=bm, block_n=bn)
        o_ref, lse_ref = naive(q, k, v, causal, scale or 1 / math.sqrt(shape[-1]))
        bad = close(o, o_ref, 1e-4) or close(lse, lse_ref, 1e-4) or (lse.dtype != torch.float32 and "lse dtype")
        if bad:
            return f"{shape} causal={causal} scale={scale} tiles {bm}x{bn}: {bad}"
    q, k, v = qkv((1, 1, 40, 16), 9, torch.half)
    o, lse = ns["flash_attention_forward"](q, k, v, causal=True)
    bad = (o.dtype != torch.half and "o dtype") or close(o, naive(q, k, v, True, 0.25)[0], 3e-3)
    if bad:
        return f"float16: {bad}"


def backward_ref(q, k, v, do, causal, scale):
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    o, _ = naive(q, k, v, causal, scale)
    o.backward(do.double())
    return q.grad, k.grad, v.grad


BWD_CASES = [((1, 2, 37, 16), False, None, 16, 16), ((1, 2, 37, 16), True, None, 16, 16),
             ((1, 1, 50, 32), True, 0.3, 32, 16), ((1, 1, 50, 32), True, None, 16, 32)]


def check_backward(ns):
    for i, (shape, causal, scale, bm, bn) in enumerate(BWD_CASES):
        q, k, v = qkv(shape, 20 + i)
        do = torch.randn(shape, generator=torch.Generator().manual_seed(40 + i))
        sc = scale or 1 / math.sqrt(shape[-1])
        o, lse = naive(q, k, v, causal, sc)
        grads = ns["flash_attention_backward"](q, k, v, o.float(), lse.float(), do, causal=causal, scale=scale,
                                               block_m=bm, block_n=bn)
        for name, g, r in zip("dq dk dv".split(), grads, backward_ref(q, k, v, do, causal, sc)):
            bad = close(g, r, 1e-4)
            if bad:
                return f"{shape} causal={causal} scale={scale} tiles {bm}x{bn}: {name} {bad}"
    q, k, v = qkv((1, 1, 40, 16), 59, torch.half)
    do = torch.randn(1, 1, 40, 16, generator=torch.Generator().manual_seed(59)).half()
    o, lse = naive(q, k, v, True, 0.25)
    grads = ns["flash_attention_backward"](q, k, v, o.half(), lse.float(), do, causal=True)
    for name, g, r in zip("dq dk dv".split(), grads, backward_ref(q, k, v, do, True, 0.25)):
        bad = (g.dtype != torch.half and f"{name} dtype {g.dtype}") or close(g, r, 2e-2)
        if bad:
            return f"float16: {name} {bad}"


def check_autograd(ns):
    for i, (shape, causal, scale) in enumerate([((1, 2, 37, 16), True, None), ((1, 1, 20, 32), False, 0.5)]):
        q, k, v = (t.requires_grad_() for t in qkv(shape, 60 + i))
        torch.manual_seed(i)
        do = torch.randn(shape)
        o = ns["flash_attention"](q, k, v, causal=causal, scale=scale)
        sc = scale or 1 / math.sqrt(shape[-1])
        bad = close(o, naive(q.detach(), k.detach(), v.detach(), causal, sc)[0], 1e-4)
        if bad:
            return f"{shape} o: {bad}"
        o.backward(do)
        for name, g, r in zip("dq dk dv".split(), (q.grad, k.grad, v.grad),
                              backward_ref(q.detach(), k.detach(), v.detach(), do, causal, sc)):
            bad = close(g, r, 1e-4)
            if bad:
                return f"{shape} causal={causal}: {name} {bad}"


def decode_ref(q, k, v, scale):
    s = torch.einsum("bhd,bhnd->bhn", q.double(), k.double()) * scale
    return torch.einsum("bhn,bhnd->bhd", torch.softmax(s, -1), v.double()), torch.logsumexp(s, -1)


def check_partials(ns):
    for i, (B, H, N, d, S, bn) in enumerate([(1, 2, 70, 16, 3, 16), (2, 1, 33, 32, 4, 16), (1, 1, 64, 16, 2, 32)]):
        g = torch.Generator().manual_seed(80 + i)
        q, k, v = torch.randn(B, H, d, generator=g), torch.randn(B, H, N, d, generator=g), torch.randn(B, H, N, d, generator=g)
        o_part, lse_part = ns["flash_decoding_partials"](q, k, v, S, block_n=bn)
        L = math.ceil(N / S)
        for s in range(S):
            o_ref, lse_ref = decode_ref(q, k[:, :, s * L:(s + 1) * L], v[:, :, s * L:(s + 1) * L], 1 / math.sqrt(d))
            bad = close(o_part[:, :, s], o_ref, 1e-4) or close(lse_part[:, :, s], lse_ref, 1e-4)
            if bad:
                return f"N={N} splits={S} split {s}: {bad}"


def check_combine(ns):
    g = torch.Generator().manual_seed(90)
    for B, H, S, d, shift in [(1, 2, 3, 16, 0), (2, 1, 5, 32, 30), (1, 1, 1, 16, 0), (1, 2, 4, 16, 120)]:
        o_part = torch.randn(B, H, S, d, generator=g)
        lse_part = torch.randn(B, H, S, generator=g) * 4 + shift
        o, lse = ns["combine_partials"](o_part, lse_part)
        lse_ref = torch.logsumexp(lse_part.double(), -1)
        o_ref = (torch.exp(lse_part.double() - lse_ref[..., None])[..., None] * o_part.double()).sum(2)
        bad = close(o, o_ref, 1e-5) or close(lse, lse_ref, 1e-5)
        if bad:
            return f"splits={S}: {bad}"


def check_paged(ns):
    g = torch.Generator().manual_seed(100)
    for (B, H, d, bs, lens, index) in [(3, 2, 16, 16, [5, 37, 16], torch.int32), (2, 1, 32, 32, [40, 1], torch.int64)]:
        max_blocks = max(math.ceil(n / bs) for n in lens) + 1
        num_blocks = B * max_blocks + 3
        k_cache = torch.full((num_blocks, H, bs, d), float("nan"))      # slots nobody wrote: must not count
        v_cache = torch.full((num_blocks, H, bs, d), float("nan"))
        perm = torch.randperm(num_blocks, generator=g)
        table = torch.full((B, max_blocks), num_blocks - 1, dtype=index)   # past the last block: junk entries
        q = torch.randn(B, H, d, generator=g)
        out_ref = []
        for b, n in enumerate(lens):
            keys, vals = torch.randn(H, n, d, generator=g), torch.randn(H, n, d, generator=g)
            for lb in range(math.ceil(n / bs)):
                phys = int(perm[b * max_blocks + lb])
                table[b, lb] = phys
                chunk = slice(lb * bs, min((lb + 1) * bs, n))
                k_cache[phys, :, :chunk.stop - chunk.start] = keys[:, chunk]
                v_cache[phys, :, :chunk.stop - chunk.start] = vals[:, chunk]
            out_ref.append(decode_ref(q[b:b + 1], keys[None], vals[None], 1 / math.sqrt(d))[0][0])
        seq_lens = torch.tensor(lens, dtype=index)
        k_cache[num_blocks - 1] = 1e4                      # the junk entries' block: huge scores if read
        o = ns["paged_decoding"](q, k_cache, v_cache, table, seq_lens)
        bad = close(o, torch.stack(out_ref), 1e-4)
        if bad:
            return f"lens={lens}: {bad}"


CHECKS = {"softmax": check_softmax, "online_softmax_states": check_online, "flash_attention_forward": check_forward,
          "flash_attention_backward": check_backward, "flash_attention": check_autograd,
          "flash_decoding_partials": check_partials, "combine_partials": check_combine, "paged_decoding": check_paged}


def failures(answers: dict) -> dict:
    """exercise -> why it failed (None: passed)."""
    try:
        ns = run_cells(answers)
    except Exception as e:  # noqa: BLE001
        return {name: f"cells did not run: {e!r}" for name in CHECKS}
    out = {}
    for name, check in CHECKS.items():
        try:
            out[name] = check(ns)
        except Exception as e:  # noqa: BLE001
            out[name] = f"raised {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if os.environ.get("CATALOG_TRACEBACK"):
                traceback.print_exc()
    return out


def in_child(answers: dict) -> dict:
    """``failures`` in a forked child: a kernel that reads wild memory kills the child, not the run."""
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=lambda: child.send(failures(answers)))
    proc.start()
    child.close()                                   # the parent's copy: a dead child's pipe then closes
    try:
        got = parent.recv()
    except EOFError:
        got = None
    proc.join()
    return got or {name: f"the process died (exit code {proc.exitcode})" for name in CHECKS}


def main(names):
    cases = submissions.cases()
    wrong = 0
    for name in names or cases:
        kind, answers, expect_fail = cases[name]
        t = time.perf_counter()
        got = in_child(answers)
        failed = {k for k, v in got.items() if v}
        ok = failed == set(expect_fail)
        wrong += not ok
        print(f"{'ok ' if ok else 'BAD'} {kind:8s} {name:42s} {time.perf_counter() - t:5.1f} s  "
              f"failed {sorted(failed) or '-'}")
        for k in sorted(failed | set(expect_fail)):
            if not ok or os.environ.get("CATALOG_VERBOSE"):
                print(f"      {k}: {got[k]}")
    print(f"{wrong} case(s) not as expected")
    return wrong


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)
