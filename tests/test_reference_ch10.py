"""The Chapter 10 reference kernels, run by Triton's interpreter on the CPU, against PyTorch: the softmax against
torch.softmax, the online softmax's states against max and logsumexp of each prefix, FlashAttention-2's forward
against F.scaled_dot_product_attention (and its logsumexp), its backward and the autograd Function against
autograd of the same; every head dimension of the spec, ragged N, causal, float16, several tile sizes."""
import math
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():  # as the chapter's export cell: before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
from solutions import ch10_attention_kernels as ref  # noqa: E402


def _qkv(shape, dtype=torch.float32, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to(dtype).requires_grad_(requires_grad) for _ in range(3)]


def _logsumexp_of_scores(q, k, causal, scale):
    n = q.shape[-2]
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, -1)


@pytest.mark.parametrize("rows, cols, dtype", [(3, 1, torch.float32), (5, 57, torch.float32), (2, 4096, torch.float32),
                                               (4, 100, torch.float16)])
def test_softmax_equals_torch(rows, cols, dtype):
    x = (torch.randn(rows, cols + 7, generator=torch.Generator().manual_seed(cols)) * 30).to(dtype)[:, 3:3 + cols]
    y = ref.softmax(x)
    assert y.dtype == dtype and y.shape == (rows, cols)
    assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-6 if dtype == torch.float32 else 1e-3)


def test_softmax_does_not_overflow():
    x = torch.tensor([[1.0e4, 0.0, -1.0e4], [-1.0e4, -1.0e4, -1.0e4]])
    assert torch.equal(ref.softmax(x), torch.softmax(x, -1))


@pytest.mark.parametrize("cols, block", [(70, 16), (64, 16), (33, 64), (200, 32)])
def test_online_softmax_states_are_prefix_max_and_sum(cols, block):
    x = torch.randn(19, cols, generator=torch.Generator().manual_seed(cols)) * 4    # 19 rows: a ragged row tile
    m, l = ref.online_softmax_states(x, block)
    assert m.shape == l.shape == (19, math.ceil(cols / block))
    for b in range(m.shape[1]):
        seen = x[:, :(b + 1) * block]
        assert torch.allclose(m[:, b], seen.max(-1).values)
        assert torch.allclose(l[:, b], torch.exp(seen - seen.max(-1, keepdim=True).values).sum(-1), rtol=1e-5)
    assert torch.allclose(m[:, -1] + torch.log(l[:, -1]), torch.logsumexp(x, -1), atol=1e-5)


@pytest.mark.parametrize("shape, causal, tiles", [
    ((1, 2, 40, 16), False, (16, 16)), ((1, 2, 40, 16), True, (16, 32)), ((2, 1, 37, 32), True, (32, 16)),
    ((1, 1, 20, 64), False, (16, 16)), ((1, 1, 17, 128), True, (16, 16)), ((1, 1, 1, 16), True, (16, 16))])
def test_forward_equals_scaled_dot_product_attention(shape, causal, tiles):
    q, k, v = _qkv(shape, seed=shape[2])
    o, lse = ref.flash_attention_forward(q, k, v, causal=causal, block_m=tiles[0], block_n=tiles[1])
    assert torch.allclose(o, F.scaled_dot_product_attention(q, k, v, is_causal=causal), atol=1e-5)
    assert torch.allclose(lse, _logsumexp_of_scores(q, k, causal, 1 / math.sqrt(shape[-1])), atol=1e-5)


def test_forward_float16_and_scale():
    q, k, v = _qkv((1, 2, 40, 64), dtype=torch.float16, seed=3)
    o, lse = ref.flash_attention_forward(q, k, v, causal=True, scale=0.3)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, scale=0.3)
    assert o.dtype == torch.float16 and lse.dtype == torch.float32
    assert torch.allclose(o.float(), want, atol=2e-3)
    assert torch.allclose(lse, _logsumexp_of_scores(q, k, True, 0.3), atol=1e-3)


@pytest.mark.parametrize("shape, causal, tiles", [
    ((1, 2, 32, 16), False, (16, 16)), ((1, 1, 37, 32), True, (16, 32)), ((1, 1, 45, 16), True, (32, 16)),
    ((1, 1, 20, 64), False, (16, 16))])
def test_backward_equals_autograd(shape, causal, tiles):
    q, k, v = _qkv(shape, seed=shape[2] + 1, requires_grad=True)
    do = torch.randn(*shape, generator=torch.Generator().manual_seed(9))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    want.backward(do)
    o, lse = ref.flash_attention_forward(q.detach(), k.detach(), v.detach(), causal=causal)
    have = ref.flash_attention_backward(q.detach(), k.detach(), v.detach(), o, lse, do, causal=causal,
                                        block_m=tiles[0], block_n=tiles[1])
    for got, t in zip(have, (q, k, v)):
        assert torch.allclose(got, t.grad, atol=1e-5)


def test_flash_attention_function_saves_only_inputs_output_and_lse():
    q, k, v = _qkv((1, 2, 24, 16), seed=5, requires_grad=True)
    o = ref.flash_attention(q, k, v, causal=True)
    assert sorted(t.numel() for t in o.grad_fn.saved_tensors) == [48] + [768] * 4
    o.sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(q2, k2, v2, is_causal=True).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)
