"""The Chapter 2 reference agrees with PyTorch's own implementations."""
import math

import pytest
import torch
import torch.nn.functional as F

from solutions import ch02_self_attention as ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lead", [(), (3,), (2, 4)])
def test_attention_matches_torch(dtype, lead):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(*lead, 5, 8, generator=g, dtype=dtype)
    k = torch.randn(*lead, 7, 8, generator=g, dtype=dtype)
    v = torch.randn(*lead, 7, 3, generator=g, dtype=dtype)
    out, weights = ref.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(weights.sum(-1), torch.ones(*lead, 5, dtype=dtype))
    assert out.dtype == weights.dtype == dtype


def test_masked_attention_matches_torch_and_gradients_agree():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = ref.causal_mask(6) & ref.padding_mask(torch.tensor([6, 4]), 6)[:, None, :]
    out, weights = ref.scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, expected)
    assert torch.all(weights[~mask.expand_as(weights)] == 0)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    grads_torch = torch.autograd.grad(expected.sum(), (q, k, v))
    for a, b in zip(grads, grads_torch):
        torch.testing.assert_close(a, b)


def test_masks_match_torch_constructions():
    assert torch.equal(ref.causal_mask(5), torch.ones(5, 5).tril().bool())
    lengths = torch.tensor([0, 3, 5])
    expected = torch.tensor([[False] * 5, [True] * 3 + [False] * 2, [True] * 5])
    assert torch.equal(ref.padding_mask(lengths, 5), expected)


def test_self_attention_matches_torch_multihead_with_one_head():
    torch.manual_seed(0)
    d = 8
    layer = ref.SelfAttention(d, d, d)
    mha = torch.nn.MultiheadAttention(d, num_heads=1, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([layer.W_q.weight, layer.W_k.weight, layer.W_v.weight]))
        mha.in_proj_bias.copy_(torch.cat([layer.W_q.bias, layer.W_k.bias, layer.W_v.bias]))
        mha.out_proj.weight.copy_(torch.eye(d))
        mha.out_proj.bias.zero_()
    x = torch.randn(2, 5, d)
    causal = ref.causal_mask(5)
    out, weights = layer(x, causal)
    # nn.MultiheadAttention's boolean attn_mask is True where attention is NOT allowed.
    expected, expected_weights = mha(x, x, x, attn_mask=~causal)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)


def test_worked_example_numbers():
    x = torch.tensor([[1.0, 0, 1, 0], [0, 2, 0, 2]])
    w_q = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 1], [0, 1, 1, 0]])
    w_k = torch.tensor([[0.0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 1, 1], [1, 1, 0, 0]])
    w_v = torch.tensor([[1.0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]])
    out, weights = ref.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)
    assert (x @ w_q)[0].tolist() == [2, 0, 1, 1]
    assert weights[0].tolist() == pytest.approx([1 / (1 + math.exp(3.5)), 1 / (1 + math.exp(-3.5))])
    assert out[0].tolist() == pytest.approx([1.9707] * 4, abs=1e-4)
