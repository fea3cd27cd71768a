"""The Chapter 3 reference agrees with PyTorch's own multi-head attention and with the formula."""
import math

import pytest
import torch
import torch.nn.functional as F

from solutions import ch03_multi_head_attention as ref


def _torch_copy(layer, d_model, num_heads, dtype=torch.float32):
    """nn.MultiheadAttention holding the same weights as the reference layer."""
    mha = torch.nn.MultiheadAttention(d_model, num_heads, batch_first=True, dtype=dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([layer.W_q.weight, layer.W_k.weight, layer.W_v.weight]))
        mha.in_proj_bias.copy_(torch.cat([layer.W_q.bias, layer.W_k.bias, layer.W_v.bias]))
        mha.out_proj.weight.copy_(layer.W_o.weight)
        mha.out_proj.bias.copy_(layer.W_o.bias)
    return mha


@pytest.mark.parametrize("shape, h", [((2, 5, 8), 2), ((1, 3, 12), 4), ((3, 1, 6), 6), ((2, 4, 5), 1)])
def test_split_and_merge_are_inverse_and_slice_features_in_order(shape, h):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    B, N, C = shape
    heads = ref.split_heads(x, h)
    assert heads.shape == (B, h, N, C // h)
    for i in range(h):
        torch.testing.assert_close(heads[:, i], x[..., i * (C // h):(i + 1) * (C // h)], rtol=0, atol=0)
    torch.testing.assert_close(ref.merge_heads(heads), x, rtol=0, atol=0)


def test_given_attention_matches_torch():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    out, w = ref.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64))


@pytest.mark.parametrize("d_model, h", [(8, 1), (8, 2), (16, 4), (12, 12)])
def test_matches_torch_multihead_attention_self_and_cross(d_model, h):
    torch.manual_seed(0)
    layer = ref.MultiHeadAttention(d_model, h)
    mha = _torch_copy(layer, d_model, h)
    x, mem = torch.randn(2, 5, d_model), torch.randn(2, 7, d_model)
    for q, kv in [(x, x), (x, mem)]:
        out, w = layer(q, kv, kv)
        out_t, w_t = mha(q, kv, kv, average_attn_weights=False)
        torch.testing.assert_close(out, out_t)
        torch.testing.assert_close(w, w_t)


def test_masks_match_torch_with_inverted_convention():
    torch.manual_seed(1)
    layer = ref.MultiHeadAttention(16, 4)
    mha = _torch_copy(layer, 16, 4)
    x = torch.randn(2, 6, 16)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    keep = torch.arange(6)[None, :] < torch.tensor([6, 3])[:, None]        # (B, N_k), True = real token
    out, w = layer(x, x, x, mask=causal & keep[:, None, None, :])
    # nn.MultiheadAttention: True = NOT allowed, in both attn_mask and key_padding_mask.
    out_t, w_t = mha(x, x, x, attn_mask=~causal, key_padding_mask=~keep, average_attn_weights=False)
    torch.testing.assert_close(out, out_t)
    torch.testing.assert_close(w, w_t)
    assert torch.all(w[1, :, :, 3:] == 0)


def test_gradients_match_torch_in_float64():
    torch.manual_seed(2)
    layer = ref.MultiHeadAttention(8, 2).double()
    mha = _torch_copy(layer, 8, 2, dtype=torch.float64)
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    cot = torch.randn(2, 4, 8, dtype=torch.float64)
    (layer(x, x, x)[0] * cot).sum().backward()
    (mha(x, x, x)[0] * cot).sum().backward()
    in_grad = torch.cat([layer.W_q.weight.grad, layer.W_k.weight.grad, layer.W_v.weight.grad])
    torch.testing.assert_close(in_grad, mha.in_proj_weight.grad)
    torch.testing.assert_close(layer.W_o.weight.grad, mha.out_proj.weight.grad)


def test_equals_the_formula_head_by_head():
    """Concat(head_1..head_h) W^O with explicit feature slices, no reshaping."""
    torch.manual_seed(3)
    d_model, h = 12, 3
    d_k = d_model // h
    layer = ref.MultiHeadAttention(d_model, h)
    x, y = torch.randn(1, 4, d_model), torch.randn(1, 6, d_model)
    q, k, v = layer.W_q(x), layer.W_k(y), layer.W_v(y)
    heads = []
    for i in range(h):
        sl = slice(i * d_k, (i + 1) * d_k)
        w = torch.softmax(q[..., sl] @ k[..., sl].transpose(-2, -1) / math.sqrt(d_k), dim=-1)
        heads.append(w @ v[..., sl])
    torch.testing.assert_close(layer(x, y, y)[0], layer.W_o(torch.cat(heads, dim=-1)))


def test_parameter_count_equals_torch_and_one_wide_head():
    d_model, h = 64, 8
    ours = sum(p.numel() for p in ref.MultiHeadAttention(d_model, h).parameters())
    theirs = sum(p.numel() for p in torch.nn.MultiheadAttention(d_model, h).parameters())
    assert ours == theirs == 4 * (d_model * d_model + d_model)
