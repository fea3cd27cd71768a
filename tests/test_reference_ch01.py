"""The Chapter 1 reference agrees with PyTorch's own operations and with the formulas."""
import pytest
import torch
import torch.nn.functional as F

from solutions import ch01_bahdanau_attention as ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_softmax_matches_torch(dtype):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 4, 6, generator=g, dtype=dtype)
    torch.testing.assert_close(ref.masked_softmax(scores), torch.softmax(scores, dim=-1))
    mask = torch.rand(3, 4, 6, generator=g) < 0.6
    mask[..., 0] = True
    expected = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    weights = ref.masked_softmax(scores, mask)
    torch.testing.assert_close(weights, expected)
    assert weights.dtype == dtype
    assert torch.all(weights[~mask] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, dtype=dtype))


def test_masked_softmax_equals_softmax_over_the_allowed_positions():
    scores = torch.tensor([[0.3, -1.2, 2.0, 0.7]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True, False]])
    weights = ref.masked_softmax(scores, mask)
    torch.testing.assert_close(weights[0, [0, 2]], torch.softmax(scores[0, [0, 2]], dim=-1))


def test_masked_softmax_leaves_inputs_alone_and_gradients_match_torch():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    copy = scores.detach().clone()
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    weights = ref.masked_softmax(scores, mask)
    assert torch.equal(scores.detach(), copy)
    cot = torch.randn(2, 5, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((weights * cot).sum(), scores)
    expected = torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
    (grad_torch,) = torch.autograd.grad((expected * cot).sum(), scores)
    torch.testing.assert_close(grad, grad_torch)


def test_dot_score_matches_bmm_and_einsum():
    g = torch.Generator().manual_seed(2)
    query, keys = torch.randn(4, 8, generator=g), torch.randn(4, 6, 8, generator=g)
    scores = ref.dot_score(query, keys)
    torch.testing.assert_close(scores, torch.bmm(keys, query.unsqueeze(2)).squeeze(2))
    torch.testing.assert_close(scores, torch.einsum("bd,btd->bt", query, keys))
    assert ref.dot_score(torch.tensor([[1.0, 2.0]]), torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])).tolist() == [[1.0, 3.0]]


def test_additive_attention_is_the_formula_and_respects_padding():
    torch.manual_seed(0)
    attn = ref.AdditiveAttention(query_dim=5, key_dim=6, hidden_dim=7)
    g = torch.Generator().manual_seed(3)
    query, keys, values = (torch.randn(*s, generator=g) for s in [(3, 5), (3, 4, 6), (3, 4, 2)])
    mask = torch.tensor([[True] * 4, [True, True, False, False], [True, False, False, False]])
    context, weights = attn(query, keys, values, mask)
    W, U, v = attn.W_a.weight, attn.U_a.weight, attn.v_a.weight[0]
    for b in range(3):
        n = int(mask[b].sum())
        e = torch.stack([v @ torch.tanh(W @ query[b] + U @ keys[b, j]) for j in range(n)])
        alpha = torch.softmax(e, dim=0)
        torch.testing.assert_close(weights[b, :n], alpha)
        assert torch.all(weights[b, n:] == 0)
        torch.testing.assert_close(context[b], alpha @ values[b, :n])


def test_additive_attention_with_a_linear_score_is_luong_general():
    """Without tanh, v_a^T (W_a s + U_a h_j) differs from a dot score only by a term
    constant in j, which the softmax ignores: a sanity check of the decomposition."""
    torch.manual_seed(1)
    attn = ref.AdditiveAttention(query_dim=4, key_dim=4, hidden_dim=3)
    g = torch.Generator().manual_seed(4)
    query, keys = torch.randn(2, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    linear_scores = attn.v_a(attn.W_a(query).unsqueeze(1) + attn.U_a(keys)).squeeze(-1)
    u = attn.v_a.weight @ attn.U_a.weight                              # (1, d_k)
    by_dot = ref.dot_score(u.expand(2, -1), keys)
    torch.testing.assert_close(torch.softmax(linear_scores, -1), torch.softmax(by_dot, -1))


def test_decoder_step_is_a_gru_cell_on_embedding_and_previous_state_context():
    torch.manual_seed(2)
    dec = ref.BahdanauDecoder(vocab_size=12, embed_dim=5, enc_dim=8, hidden_dim=6, attn_dim=4)
    g = torch.Generator().manual_seed(5)
    token = torch.tensor([0, 3, 11])
    state, enc = torch.randn(3, 6, generator=g), torch.randn(3, 7, 8, generator=g)
    mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4, [True] * 6 + [False]])
    logits, new_state, weights = dec.forward_step(token, state, enc, mask)
    context, expected_w = dec.attention(state, enc, enc, mask)
    torch.testing.assert_close(weights, expected_w)
    # nn.GRUCell written out, as in the GRU equations of the PyTorch docs.
    x = torch.cat([dec.embedding(token), context], -1)
    gi = x @ dec.gru.weight_ih.T + dec.gru.bias_ih
    gh = state @ dec.gru.weight_hh.T + dec.gru.bias_hh
    r = torch.sigmoid(gi[:, :6] + gh[:, :6])
    z = torch.sigmoid(gi[:, 6:12] + gh[:, 6:12])
    n = torch.tanh(gi[:, 12:] + r * gh[:, 12:])
    torch.testing.assert_close(new_state, (1 - z) * n + z * state)
    torch.testing.assert_close(logits, F.linear(torch.cat([new_state, context], -1), dec.out.weight, dec.out.bias))
    assert torch.all(weights[1, 3:] == 0) and torch.all(weights[2, 6:] == 0)


def test_decoder_padding_changes_nothing():
    torch.manual_seed(3)
    dec = ref.BahdanauDecoder(vocab_size=6, embed_dim=3, enc_dim=4, hidden_dim=5, attn_dim=2)
    g = torch.Generator().manual_seed(6)
    token, state = torch.tensor([1, 2]), torch.randn(2, 5, generator=g)
    short = torch.randn(2, 3, 4, generator=g)
    padded = torch.cat([short, torch.randn(2, 4, 4, generator=g) * 10], dim=1)
    mask = torch.tensor([[True] * 3 + [False] * 4] * 2)
    a = dec.forward_step(token, state, short)
    b = dec.forward_step(token, state, padded, mask)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1], b[1])
    torch.testing.assert_close(a[2], b[2][:, :3])
