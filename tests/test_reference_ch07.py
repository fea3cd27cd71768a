"""The Chapter 7 reference is GPT-2: same logits as `transformers`' GPT2LMHeadModel, with and without a cache."""
import math

import pytest
import torch

from solutions import ch07_gpt as ref

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

transformers.logging.set_verbosity_error()


def _pair(vocab=53, n_positions=32, d=32, layers=3, heads=4, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=d, n_layer=layers, n_head=heads,
                        bos_token_id=0, eos_token_id=0)
    hf = GPT2LMHeadModel(config).eval().to(dtype)
    ours = ref.GPT(vocab, n_positions, d, heads, layers).eval().to(dtype)
    returned = ref.load_gpt2_weights(ours, hf.state_dict())
    assert returned is ours
    return hf, ours


@pytest.mark.parametrize("layers, heads, d", [(1, 1, 16), (2, 4, 32), (3, 2, 24)])
def test_logits_equal_transformers_gpt2(layers, heads, d):
    hf, ours = _pair(d=d, layers=layers, heads=heads)
    ids = torch.randint(0, 53, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        have, presents = ours(ids)
    torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)
    assert len(presents) == layers and presents[0][0].shape == (3, heads, 17, d // heads)


def test_logits_equal_in_float64_to_float64_precision():
    hf, ours = _pair(dtype=torch.float64)
    ids = torch.randint(0, 53, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], hf(ids).logits, atol=1e-10, rtol=1e-9)


def test_cache_matches_transformers_step_by_step():
    hf, ours = _pair()
    ids = torch.randint(0, 53, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(ids).logits
        parts, past = [], None
        for chunk in (ids[:, :5], ids[:, 5:6], ids[:, 6:9], ids[:, 9:10], ids[:, 10:]):
            logits, past = ours(chunk, past)
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, dim=1), want, atol=1e-5, rtol=1e-4)
    assert past[0][0].shape == (2, 4, 12, 8)


def test_greedy_tokens_equal_transformers():
    hf, ours = _pair(seed=4)
    prompt = torch.randint(0, 53, (3, 4), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = prompt
        for _ in range(15):
            want = torch.cat([want, hf(want).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(ref.generate(ours, prompt, 15), want)
    assert torch.equal(ref.generate(ours, prompt, 15, use_cache=False), want)


def test_loader_skips_buffers_transposes_and_names_missing_keys():
    hf, ours = _pair(layers=2)
    sd = dict(hf.state_dict())
    sd["transformer.h.0.attn.bias"] = torch.ones(1, 1, 32, 32).tril()    # as in OpenAI's checkpoints
    sd["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e4)
    fresh = ref.load_gpt2_weights(ref.GPT(53, 32, 32, 4, 2), sd)
    torch.testing.assert_close(fresh.blocks[1].attn.c_proj.weight, sd["transformer.h.1.attn.c_proj.weight"].t())
    assert fresh.lm_head.weight is fresh.wte.weight
    del sd["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(Exception, match=r"h\.1\.mlp\.c_fc\.bias"):
        ref.load_gpt2_weights(ref.GPT(53, 32, 32, 4, 2), sd)
    with pytest.raises(Exception, match="wpe"):
        ref.load_gpt2_weights(ref.GPT(53, 16, 32, 4, 2), dict(hf.state_dict()))


def test_attention_matches_torch_sdpa_with_offset_causal_mask():
    torch.manual_seed(6)
    layer = ref.CausalSelfAttention(16, 4).double()
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    past = tuple(torch.randn(2, 4, 5, 4, dtype=torch.float64) for _ in range(2))
    y, (k, v) = layer(x, past)
    q = layer.c_attn(x).split(16, dim=-1)[0].view(2, 3, 4, 4).transpose(1, 2)
    mask = torch.ones(3, 8, dtype=torch.bool).tril(diagonal=5)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(y, layer.c_proj(out.transpose(1, 2).reshape(2, 3, 16)))


def test_filter_logits_matches_transformers_warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 50, generator=g) * 2
    for k, p in [(5, None), (None, 0.9), (None, 0.3), (10, 0.8)]:
        want = logits.clone()
        if k is not None:
            want = TopKLogitsWarper(k)(None, want)
        if p is not None:
            want = TopPLogitsWarper(p)(None, want)
        have = ref.filter_logits(logits, top_k=k, top_p=p)
        assert torch.equal(have.isfinite(), want.isfinite()), (k, p)
        assert torch.equal(have[have.isfinite()], logits[have.isfinite()])


def test_parameter_count_of_gpt2_small():
    with torch.device("meta"):
        model = ref.GPT(50257, 1024, 768, 12, 12)
    assert sum(p.numel() for p in model.parameters()) == 124_439_808
    assert math.isclose(124_439_808, 50257 * 768 + 1024 * 768 + 12 * (12 * 768 ** 2 + 13 * 768) + 2 * 768)
