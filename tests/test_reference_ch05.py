"""The Chapter 5 reference agrees with PyTorch's own Transformer layers and with independent computations."""
import math

import pytest
import torch
import torch.nn as nn

from solutions import ch05_transformer as ref

D64 = torch.float64


def _randomise(module, scale=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return module


def _copy_attention(ours, theirs):
    theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
    theirs.out_proj.weight.copy_(ours.W_o.weight)
    theirs.out_proj.bias.copy_(ours.W_o.bias)


def _copy_linear_norm(pairs):
    for a, b in pairs:
        b.weight.copy_(a.weight)
        b.bias.copy_(a.bias)


def torch_encoder_layer(ours, d_model, h, d_ff, dtype=torch.float32):
    theirs = nn.TransformerEncoderLayer(d_model, h, d_ff, dropout=0.0, batch_first=True,
                                        norm_first=ours.norm_first, dtype=dtype)
    with torch.no_grad():
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_linear_norm([(ours.ffn.linear1, theirs.linear1), (ours.ffn.linear2, theirs.linear2),
                           (ours.norm1, theirs.norm1), (ours.norm2, theirs.norm2)])
    return theirs.eval()


def torch_decoder_layer(ours, d_model, h, d_ff, dtype=torch.float32):
    theirs = nn.TransformerDecoderLayer(d_model, h, d_ff, dropout=0.0, batch_first=True,
                                        norm_first=ours.norm_first, dtype=dtype)
    with torch.no_grad():
        _copy_attention(ours.self_attn, theirs.self_attn)
        _copy_attention(ours.cross_attn, theirs.multihead_attn)
        _copy_linear_norm([(ours.ffn.linear1, theirs.linear1), (ours.ffn.linear2, theirs.linear2),
                           (ours.norm1, theirs.norm1), (ours.norm2, theirs.norm2), (ours.norm3, theirs.norm3)])
    return theirs.eval()


def test_feed_forward_is_the_formula():
    torch.manual_seed(0)
    ff = ref.FeedForward(8, 32).double()
    x = torch.randn(2, 3, 8, dtype=D64)
    expected = torch.clamp(x @ ff.linear1.weight.T + ff.linear1.bias, min=0) @ ff.linear2.weight.T + ff.linear2.bias
    torch.testing.assert_close(ff(x), expected)


def test_sinusoidal_table_is_chapter_4s():
    pe = ref.sinusoidal_encoding(50, 16)
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-5)
            assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("d_model, h, d_ff", [(16, 4, 64), (12, 3, 24), (8, 1, 8)])
def test_encoder_layer_matches_torch(norm_first, d_model, h, d_ff):
    torch.manual_seed(1)
    ours = _randomise(ref.EncoderLayer(d_model, h, d_ff, norm_first=norm_first).double()).eval()
    theirs = torch_encoder_layer(ours, d_model, h, d_ff, dtype=D64)
    x = torch.randn(3, 6, d_model, dtype=D64)
    keep = torch.arange(6)[None, :] < torch.tensor([6, 4, 2])[:, None]
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))
        got = ours(x, keep[:, None, None, :])
        want = theirs(x, src_key_padding_mask=~keep)
        torch.testing.assert_close(got[keep], want[keep])
        causal = torch.ones(6, 6, dtype=torch.bool).tril()
        torch.testing.assert_close(ours(x, causal), theirs(x, src_mask=~causal))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("d_model, h, d_ff", [(16, 4, 64), (12, 2, 20)])
def test_decoder_layer_matches_torch(norm_first, d_model, h, d_ff):
    torch.manual_seed(2)
    ours = _randomise(ref.DecoderLayer(d_model, h, d_ff, norm_first=norm_first).double()).eval()
    theirs = torch_decoder_layer(ours, d_model, h, d_ff, dtype=D64)
    x, memory = torch.randn(2, 5, d_model, dtype=D64), torch.randn(2, 7, d_model, dtype=D64)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    keep = torch.arange(7)[None, :] < torch.tensor([7, 3])[:, None]
    with torch.no_grad():
        torch.testing.assert_close(ours(x, memory), theirs(x, memory))
        torch.testing.assert_close(ours(x, memory, causal, keep[:, None, None, :]),
                                   theirs(x, memory, tgt_mask=~causal, memory_key_padding_mask=~keep))


def test_float32_layers_agree_with_torch_to_float32_precision():
    torch.manual_seed(3)
    enc = _randomise(ref.EncoderLayer(32, 4, 128)).eval()
    dec = _randomise(ref.DecoderLayer(32, 4, 128, norm_first=True)).eval()
    x, y = torch.randn(2, 9, 32), torch.randn(2, 4, 32)
    with torch.no_grad():
        assert (enc(x) - torch_encoder_layer(enc, 32, 4, 128)(x)).abs().max() < 1e-5
        assert (dec(y, x) - torch_decoder_layer(dec, 32, 4, 128)(y, x)).abs().max() < 1e-5


def _torch_transformer(model, d_model, h, d_ff, num_layers):
    """nn.Transformer without its final norms, holding the reference model's layers."""
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model, h, d_ff, 0.0, batch_first=True, dtype=D64),
                                num_layers, norm=None, enable_nested_tensor=False)
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d_model, h, d_ff, 0.0, batch_first=True, dtype=D64),
                                num_layers, norm=None)
    theirs = nn.Transformer(d_model, h, custom_encoder=enc, custom_decoder=dec, batch_first=True, dtype=D64)
    for i in range(num_layers):   # after __init__, which re-initialises every weight of the custom stacks
        theirs.encoder.layers[i] = torch_encoder_layer(model.encoder_layers[i], d_model, h, d_ff, dtype=D64)
        theirs.decoder.layers[i] = torch_decoder_layer(model.decoder_layers[i], d_model, h, d_ff, dtype=D64)
    return theirs.eval()


def test_transformer_matches_nn_transformer_without_final_norms():
    torch.manual_seed(4)
    d_model, h, d_ff, L = 16, 4, 32, 2
    model = _randomise(ref.Transformer(11, 9, d_model, h, L, d_ff, max_len=30).double()).eval()
    theirs = _torch_transformer(model, d_model, h, d_ff, L)
    src, tgt = torch.randint(0, 11, (3, 7)), torch.randint(0, 9, (3, 5))
    keep = torch.arange(7)[None, :] < torch.tensor([7, 5, 2])[:, None]
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        x = model.src_embed(src) * math.sqrt(d_model) + model.pe[:7]
        y = model.tgt_embed(tgt) * math.sqrt(d_model) + model.pe[:5]
        want = theirs(x, y, tgt_mask=~causal, src_key_padding_mask=~keep, memory_key_padding_mask=~keep)
        got = model.decode(tgt, model.encode(src, keep[:, None, None, :]), keep[:, None, None, :], causal)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(model(src, tgt, keep[:, None, None, :], causal), model.out(want))


def _one_row_greedy(model, src, max_len, bos, eos):
    """Independent decoding of a single row, written as a plain Python loop over token lists."""
    tokens = [bos]
    memory = model.encode(src[None])
    for _ in range(max_len):
        n = len(tokens)
        logits = model.out(model.decode(torch.tensor([tokens]), memory, None,
                                        torch.ones(n, n, dtype=torch.bool).tril()))
        tokens.append(int(logits[0, n - 1].argmax()))
        if tokens[-1] == eos:
            break
    return tokens


def test_greedy_decode_matches_row_by_row_decoding_and_stops_when_every_row_ended():
    torch.manual_seed(5)
    model = _randomise(ref.Transformer(7, 6, 16, 2, 2, 32, max_len=20), scale=1.0).eval()
    src = torch.randint(0, 7, (5, 4))
    with torch.no_grad():
        free = ref.greedy_decode(model, src, 8, 1, -1)                  # no eos: 8 steps
        assert free.shape == (5, 9) and (free[:, 0] == 1).all()
        eos = int(free[0, 2])
        out = ref.greedy_decode(model, src, 8, 1, eos)
        rows = [_one_row_greedy(model, s, 8, 1, eos) for s in src]
    assert out.shape[1] == max(len(r) for r in rows)
    for b, row in enumerate(rows):
        assert out[b, :len(row)].tolist() == row


def test_hidden_greedy_cases_tell_every_common_mistake_from_the_reference():
    """GREEDY_CASES' fixed draws still decode varied tokens: together they catch every mistake model."""
    from autograder.judge.reference import call_reference as _call_reference
    from solutions import ch05_transformer_hidden as hidden_tests
    probes = hidden_tests.hidden.build("test_greedy_decode")
    caught = set()
    for probe in probes:
        expected = _call_reference(probe)
        for mistake in hidden_tests.GREEDY_MISTAKES:
            args = [a.fresh() if hasattr(a, "fresh") else a for a in probe.args]
            if not probe.equivalent(mistake.compute(*args, **probe.kwargs), expected):
                caught.add(mistake.message)
    assert caught == {m.message for m in hidden_tests.GREEDY_MISTAKES}
