"""Chapter 10's catalog as answer cells: correct styles, mistakes, cheats (drafts; tests/test_grading_ch10.py wires them).

A mistake is one named change of a correct style's cell (``changed``: each ``old`` must be there,
exactly once). ``cases()`` gives each submission with the exercises a plain-PyTorch check
(check.py) must find wrong; a cheat computes the right values outside the kernels, so only the
grader's kernel-only rule can find it.
"""
from __future__ import annotations

import offsets_style
import tutorial_style

EXERCISES = list(offsets_style.ANSWERS)
BASE = offsets_style.ANSWERS
TUTORIAL = tutorial_style.ANSWERS
STYLES = {"offsets": BASE, "tutorial": TUTORIAL}


def changed(cell: str, *edits: tuple[str, str]) -> str:
    """``cell`` with each (old, new) replaced; every ``old`` occurs exactly once (a named change)."""
    for old, new in edits:
        if cell.count(old) != 1:
            raise ValueError(f"{old!r} occurs {cell.count(old)} times in the cell it should change")
        cell = cell.replace(old, new)
    return cell


# name -> (style, exercise, edits): each mistake as the one change a learner makes.
MISTAKES = {
    # softmax
    "softmax_max_not_subtracted": ("offsets", "softmax", [(
        "    x = x - tl.max(x, axis=0)                    # the largest entry becomes exp(0) = 1: no overflow\n",
        "")]),
    "softmax_masked_lanes_zero": ("offsets", "softmax", [(
        'mask=inside, other=-float("inf")', "mask=inside, other=0.0")]),
    # online softmax states
    "online_l_not_rescaled": ("offsets", "online_softmax_states", [(
        "l = l * tl.exp(m - m_new) + ", "l = l + ")]),
    "online_m_of_block_only": ("offsets", "online_softmax_states", [(
        "m_new = tl.maximum(m, tl.max(x, axis=0))", "m_new = tl.max(x, axis=0)")]),
    # FlashAttention-2 forward
    "forward_masked_scores_zero": ("offsets", "flash_attention_forward", [(
        's = tl.where(keep, s, float("-inf"))', "s = tl.where(keep, s, 0.0)")]),
    "forward_lse_without_max": ("offsets", "flash_attention_forward", [(
        "m_i + tl.log(l_i)", "tl.log(l_i)")]),
    "forward_lse_in_log2": ("tutorial", "flash_attention_forward", [(
        "m_i * 0.6931471805599453, mask", "m_i, mask")]),
    "forward_causal_strict": ("offsets", "flash_attention_forward", [(
        "keep = keep & (cols[None, :] <= rows[:, None])", "keep = keep & (cols[None, :] < rows[:, None])")]),
    "forward_causal_one_tile_short": ("offsets", "flash_attention_forward", [(
        "hi = tl.minimum((start_m + 1) * BLOCK_M, N)", "hi = tl.minimum(start_m * BLOCK_M, N)")]),
    "forward_diagonal_tile_unmasked": ("tutorial", "flash_attention_forward", [(
        "        if STAGE == 2:\n            valid = valid & (offs_m[:, None] >= start_n + offs_n[None, :])\n", "")]),
    "forward_ragged_keys_counted": ("offsets", "flash_attention_forward", [(
        "keep = cols[None, :] < N", "keep = cols[None, :] >= 0")]),
    "forward_ragged_loads_unmasked": ("offsets", "flash_attention_forward", [
        (", mask=cols[:, None] < N, other=0.0)\n        v = ", ")\n        v = "),
        (", mask=cols[:, None] < N, other=0.0)\n        s = ", ")\n        s = "),
        ("keep = cols[None, :] < N", "keep = cols[None, :] >= 0")]),
    "forward_scale_twice": ("offsets", "flash_attention_forward", [(
        "s = tl.dot(q, tl.trans(k)) * scale", "s = tl.dot(q * scale, tl.trans(k)) * scale")]),
    "forward_scale_missing": ("offsets", "flash_attention_forward", [(
        "s = tl.dot(q, tl.trans(k)) * scale", "s = tl.dot(q, tl.trans(k))")]),
    "forward_scale_argument_ignored": ("offsets", "flash_attention_forward", [(
        "    if scale is None:\n        scale = 1.0 / math.sqrt(d)", "    scale = 1.0 / math.sqrt(d)")]),
    # FlashAttention-2 backward
    "backward_D_from_P_of_one_key_tile": ("offsets", "flash_attention_backward", [(
        "ds = p * (dp - delta[:, None])\n        dk +=", "ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])\n        dk +=")]),
    "backward_dq_scaled_twice": ("offsets", "flash_attention_backward", [(
        "dq += tl.dot(ds.to(k.dtype), k)", "dq += tl.dot((ds * scale).to(k.dtype), k)")]),
    "backward_dk_missing_scale": ("offsets", "flash_attention_backward", [(
        "    dk = dk * scale\n", "")]),
    "backward_dk_dv_swapped": ("offsets", "flash_attention_backward", [(
        "    return dq, dk, dv", "    return dq, dv, dk")]),
    "backward_p_without_lse": ("offsets", "flash_attention_backward", [(
        "p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)",
        "p = tl.where(keep, tl.exp(s), 0.0)  # (BLOCK_M, BLOCK_N)")]),
    "backward_atomic_dq_unscaled": ("tutorial", "flash_attention_backward", [(
        "k.to(tl.float32)) * sm_scale", "k.to(tl.float32))")]),
    # autograd.Function
    "function_three_gradients": ("offsets", "flash_attention", [(
        "return (*grads, None, None)", "return grads")]),
    "function_backward_forgets_causal": ("offsets", "flash_attention", [(
        "causal=ctx.causal,\n", "\n")]),
    # flash-decoding
    "partials_split_floor": ("offsets", "flash_decoding_partials", [(
        "split_len = triton.cdiv(N, num_splits)", "split_len = N // num_splits")]),
    "partials_lse_without_max": ("offsets", "flash_decoding_partials", [(
        "m + tl.log(l))", "tl.log(l))")]),
    "combine_average": ("offsets", "combine_partials", [(
        "o = tl.sum(w[:, None] * o_s, axis=0) / total", "o = tl.sum(o_s, axis=0) / num_splits")]),
    "combine_not_shifted": ("offsets", "combine_partials", [
        ("w = tl.exp(lse_s - m) ", "w = tl.exp(lse_s) "), ("lse = m + tl.log(total)", "lse = tl.log(total)")]),
    # paged decoding
    "paged_logical_as_physical": ("offsets", "paged_decoding", [(
        "physical = tl.load(block_table_ptr + b * max_blocks + logical)", "physical = logical")]),
    "paged_table_row_of_sequence_0": ("offsets", "paged_decoding", [(
        "block_table_ptr + b * max_blocks + logical", "block_table_ptr + logical")]),
    "paged_div_mod_swapped": ("tutorial", "paged_decoding", [
        ("max_num_blocks_per_seq + token_idx // BLOCK_SIZE)", "max_num_blocks_per_seq + token_idx % BLOCK_SIZE)"),
        ("block_offset = token_idx % BLOCK_SIZE", "block_offset = token_idx // BLOCK_SIZE")]),
    "paged_slots_past_seq_len": ("offsets", "paged_decoding", [(
        "valid = t < seq_len", "valid = slots < BLOCK_SIZE")]),
    # memory: right values, an N x N tensor
    "forward_scores_buffer": ("offsets", "flash_attention_forward", [
        ("def fa_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, scale,",
         "def fa_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, s_ptr, N, scale,"),
        ('        s = tl.where(keep, s, float("-inf"))\n',
         '        s = tl.where(keep, s, float("-inf"))\n'
         "        tl.store(s_ptr + z * N * N + rows[:, None] * N + cols[None, :], s,\n"
         "                 mask=(rows[:, None] < N) & (cols[None, :] < N))  # kept to look at\n"),
        ("    grid = (triton.cdiv(N, block_m), B * H)\n",
         "    scores = torch.empty((B, H, N, N), dtype=torch.float32, device=q.device)\n"
         "    grid = (triton.cdiv(N, block_m), B * H)\n"),
        ("(q, k, v, o, lse, N, scale,", "(q, k, v, o, lse, scores, N, scale,")]),
    "function_saves_probabilities": ("offsets", "flash_attention", [
        ("        ctx.save_for_backward(q, k, v, out, logsumexp)    # the logsumexp: all the backward needs of P\n",
         "        p = torch.exp(q @ k.transpose(-2, -1) * (scale or q.shape[-1] ** -0.5) - logsumexp[..., None])\n"
         "        ctx.save_for_backward(q, k, v, out, logsumexp, p)   # P too, for a backward that might want it\n"),
        ("flash_attention_backward(*ctx.saved_tensors,", "flash_attention_backward(*ctx.saved_tensors[:5],")]),
}

# Mistakes whose wrong values only show through another exercise in check.py (it runs the learner's
# own forward and backward inside flash_attention; the grader stands the reference in for them).
# Mistakes that read wild memory (a table index past its row, so a block number nobody wrote): the
# process dies (SIGSEGV, measured), so the grader meets them as a dead kernel (kernel_only).
CRASHES = {"paged_div_mod_swapped"}
CHECKS_ALL = EXERCISES

SHOWS_IN = {"flash_attention_forward": {"flash_attention"}, "flash_attention_backward": {"flash_attention"}}

# Right values, computed outside the kernels (the grader's kernel-only rule must name them).
CHEATS = {
    "cheat_softmax_by_torch": ("softmax", '''
@triton.jit
def softmax_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def softmax(x):
    y = torch.softmax(x.float(), dim=-1).to(x.dtype)
    softmax_kernel[(1,)](y, y.numel(), BLOCK=16)          # a kernel launched, for the look of it
    return y
'''),
    "cheat_forward_by_torch": ("flash_attention_forward", '''
@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype)
    o = torch.empty_like(out)
    copy_kernel[(triton.cdiv(o.numel(), 1024),)](out, o, o.numel(), BLOCK=1024)
    return o, lse
'''),
    "cheat_kernel_body_calls_torch": ("combine_partials", '''
_HANDED = {}


@triton.jit
def combine_kernel(o_ptr, lse_ptr):
    # under the interpreter a kernel is Python: torch runs here, on no GPU ever
    w = torch.softmax(_HANDED["lse_part"], dim=-1)
    _HANDED["o"].copy_((w[..., None] * _HANDED["o_part"]).sum(-2))
    _HANDED["lse"].copy_(torch.logsumexp(_HANDED["lse_part"], dim=-1))


def combine_partials(o_part, lse_part):
    B, H, S, d = o_part.shape
    o = torch.empty((B, H, d), dtype=torch.float32)
    lse = torch.empty((B, H), dtype=torch.float32)
    _HANDED.update(o_part=o_part, lse_part=lse_part, o=o, lse=lse)
    combine_kernel[(1,)](o, lse)
    return o, lse
'''),
    "cheat_numpy_in_wrapper": ("online_softmax_states", '''
import numpy as np


@triton.jit
def touch_kernel(m_ptr):
    tl.store(m_ptr, tl.load(m_ptr))


def online_softmax_states(x, block_size):
    a = x.numpy()
    ends = [min(e, a.shape[1]) for e in range(block_size, a.shape[1] + block_size, block_size)]
    m = np.stack([a[:, :e].max(1) for e in ends], 1)
    l = np.stack([np.exp(a[:, :e] - m[:, [i]]).sum(1) for i, e in enumerate(ends)], 1)
    m, l = torch.from_numpy(m.astype(np.float32)), torch.from_numpy(l.astype(np.float32))
    touch_kernel[(1,)](m)
    return m, l
'''),
}


def mistake_answers(name: str) -> dict:
    style, exercise, edits = MISTAKES[name]
    return {**BASE, exercise: changed(STYLES[style][exercise], *edits)}


def cases() -> dict:
    """name -> (kind, {exercise: answer cell}, exercises a plain-PyTorch check must find wrong)."""
    out = {name: ("correct", dict(answers), set()) for name, answers in STYLES.items()}
    memory = {"forward_scores_buffer", "function_saves_probabilities"}
    for name, (_, exercise, _) in MISTAKES.items():
        wrong = set() if name in memory else {exercise} | SHOWS_IN.get(exercise, set())
        out[name] = ("memory" if name in memory else "mistake", mistake_answers(name), wrong)
    for name in CRASHES:
        out[name] = ("crash", out[name][1], set(CHECKS_ALL))
    for name, (exercise, cell) in CHEATS.items():
        out[name] = ("cheat", {**BASE, exercise: cell}, set())
    return out
