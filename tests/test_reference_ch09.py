"""The Chapter 9 reference is ViT and Perceiver IO: the same logits as `transformers`' ViTForImageClassification
(also with interpolated positions), the same outputs as `transformers`' Perceiver layers, encoder, decoder and
Fourier features; patchify is a strided convolution; the encoder does not see the order of its inputs."""
import math

import pytest
import torch
import torch.nn.functional as F

from solutions import ch09_beyond_text as ref

transformers = pytest.importorskip("transformers")
from transformers import PerceiverConfig, ViTConfig, ViTForImageClassification  # noqa: E402
from transformers.models.perceiver import modeling_perceiver as hf_perceiver  # noqa: E402

transformers.logging.set_verbosity_error()


def _vit_pair(patch_size=2, image_size=8, d=16, layers=2, heads=4, d_ff=32, classes=7, seed=0):
    torch.manual_seed(seed)
    config = ViTConfig(image_size=image_size, patch_size=patch_size, num_channels=1, hidden_size=d,
                       num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=d_ff,
                       hidden_act="gelu", layer_norm_eps=1e-12, num_labels=classes, initializer_range=0.2)
    hf = ViTForImageClassification(config).eval()
    with torch.no_grad():                       # norms, class token and positions away from their defaults
        for name, p in hf.named_parameters():
            if "layernorm" in name or "cls_token" in name or "position_embeddings" in name:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    ours = ref.VisionTransformer(image_size, patch_size, 1, classes, d, layers, heads, d_ff).eval()
    ours.load_state_dict(ref.vit_weights_from_transformers(hf.state_dict(), layers))
    return hf, ours


@pytest.mark.parametrize("patch_size, shape, interpolate", [
    (2, (3, 1, 8, 8), False), (4, (1, 1, 8, 8), False), (2, (2, 1, 12, 12), True), (4, (2, 1, 8, 16), True),
    (2, (1, 1, 16, 8), True), (4, (4, 1, 8, 8), True)])
def test_logits_equal_transformers_vit(patch_size, shape, interpolate):
    hf, ours = _vit_pair(patch_size)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(pixel_values=x, interpolate_pos_encoding=interpolate).logits
        have = ours(x, interpolate_pos_encoding=interpolate)
    torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)
    assert want.abs().mean() > 0.1                       # not a comparison of near-zero logits


def test_other_size_without_interpolation_raises_like_transformers():
    hf, ours = _vit_pair(2)
    x = torch.randn(1, 1, 12, 12)
    with pytest.raises(ValueError):
        hf(pixel_values=x)
    with pytest.raises(ValueError):
        ours(x)


def test_patchify_is_a_strided_convolution():
    conv = torch.nn.Conv2d(3, 5, kernel_size=4, stride=4)
    x = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    conv = conv.double()
    with torch.no_grad():
        want = conv(x).flatten(2).transpose(1, 2)
        have = ref.patchify(x, 4) @ conv.weight.reshape(5, -1).T + conv.bias
    torch.testing.assert_close(have, want)
    unfolded = F.unfold(x, kernel_size=4, stride=4).transpose(1, 2)       # torch's own order
    torch.testing.assert_close(ref.patchify(x, 4), unfolded)


@pytest.mark.parametrize("index_dims, num_bands, max_resolution",
                         [((8, 8), 4, None), ((3, 5), 6, None), ((4, 6), 3, (16, 12)), ((7,), 5, None),
                          ((2, 3, 4), 2, None)])
def test_fourier_features_equal_transformers(index_dims, num_bands, max_resolution):
    pos = hf_perceiver.build_linear_positions(index_dims)[None]           # (1, *index_dims, D)
    want = hf_perceiver.generate_fourier_features(pos.reshape(1, -1, len(index_dims)), num_bands,
                                                  max_resolution=max_resolution or index_dims, concat_pos=True,
                                                  sine_only=False)[0]
    torch.testing.assert_close(ref.fourier_position_features(index_dims, num_bands, max_resolution), want)


def _perceiver_layer_state(hf_layer):
    """transformers' PerceiverLayer state under PerceiverLayer's flat names."""
    names = {"attention.self.layernorm1": "layernorm1", "attention.self.layernorm2": "layernorm2",
             "attention.self.query": "query", "attention.self.key": "key", "attention.self.value": "value",
             "attention.output.dense": "output", "layernorm": "layernorm", "mlp.dense1": "dense1",
             "mlp.dense2": "dense2"}
    state = {}
    for name, value in hf_layer.state_dict().items():
        module, kind = name.rsplit(".", 1)
        state[f"{names[module]}.{kind}"] = value
    return state


def _randomise(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():       # layer norms away from the identity
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if "layernorm" in name and
                                                               name.endswith("weight") else 0.0))
    return module


def _config(**kwargs):
    base = dict(num_latents=5, d_latents=8, num_blocks=2, num_self_attends_per_block=2, num_self_attention_heads=2,
                num_cross_attention_heads=2, hidden_act="gelu", attention_probs_dropout_prob=0.0)
    return PerceiverConfig(**{**base, **kwargs})


@pytest.mark.parametrize("cross, heads, qk, v, widening, residual", [
    (True, 2, None, None, 1, True), (True, 3, 12, 9, 2, True), (True, 1, None, None, 3, False),
    (False, 2, None, None, 1, True), (False, 2, 16, 6, 2, True)])
def test_perceiver_layer_equals_transformers(cross, heads, qk, v, widening, residual):
    config = _config()
    q_dim, kv_dim = 6, (12 if cross else 6)
    hf = _randomise(hf_perceiver.PerceiverLayer(config, is_cross_attention=cross, qk_channels=qk, v_channels=v,
                                                num_heads=heads, q_dim=q_dim, kv_dim=kv_dim,
                                                widening_factor=widening, use_query_residual=residual), 1).eval()
    qk_ours = qk if qk is not None else (kv_dim if cross else None)   # transformers' "kv" default for cross-attention
    ours = ref.PerceiverLayer(q_dim, kv_dim, heads, qk_channels=qk_ours, v_channels=v, widening_factor=widening,
                              use_query_residual=residual, is_cross_attention=cross)
    ours.load_state_dict(_perceiver_layer_state(hf))
    hidden = torch.randn(2, 4, q_dim, generator=torch.Generator().manual_seed(2))
    inputs = torch.randn(2, 11, kv_dim, generator=torch.Generator().manual_seed(3)) if cross else None
    with torch.no_grad():
        want = hf(hidden, inputs=inputs)[0]
        have = ours(hidden, inputs)
    torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)


def _encoder_pair(input_dim=8, **kwargs):
    config = _config(**kwargs)
    hf_enc = _randomise(hf_perceiver.PerceiverEncoder(config, kv_dim=input_dim), 4).eval()
    hf_emb = _randomise(hf_perceiver.PerceiverEmbeddings(config), 5)
    ours = ref.PerceiverEncoder(input_dim, config.num_latents, config.d_latents, config.num_blocks,
                                config.num_self_attends_per_block, config.num_cross_attention_heads,
                                config.num_self_attention_heads)
    state = {"latents": hf_emb.latents.detach()}
    state.update({f"cross_attention.{k}": v for k, v in _perceiver_layer_state(hf_enc.cross_attention).items()})
    for i, layer in enumerate(hf_enc.self_attends):
        state.update({f"self_attends.{i}.{k}": v for k, v in _perceiver_layer_state(layer).items()})
    ours.load_state_dict(state)
    return hf_enc, hf_emb, ours


@pytest.mark.parametrize("kwargs", [{}, dict(num_blocks=3, num_self_attends_per_block=1),
                                    dict(num_cross_attention_heads=1, num_self_attention_heads=4)])
def test_perceiver_encoder_equals_transformers(kwargs):
    hf_enc, hf_emb, ours = _encoder_pair(**kwargs)
    x = torch.randn(3, 13, 8, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = hf_enc(hf_emb(3), inputs=x).last_hidden_state
        have = ours(x)
    torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)


def test_perceiver_decoder_equals_transformers_basic_decoder():
    config = _config(d_latents=8)
    hf = hf_perceiver.PerceiverBasicDecoder(config, output_num_channels=5, position_encoding_type="trainable",
                                            output_index_dims=3, num_channels=6, num_heads=2,
                                            trainable_position_encoding_kwargs=dict(num_channels=6, index_dims=3))
    hf = _randomise(hf, 7).eval()
    ours = ref.PerceiverDecoder(8, 3, 6, 5, num_heads=2)
    state = {"output_queries": hf.output_position_encodings.position_embeddings.detach(),
             "final_layer.weight": hf.final_layer.weight.detach(), "final_layer.bias": hf.final_layer.bias.detach()}
    state.update({f"decoding_cross_attention.{k}": v
                  for k, v in _perceiver_layer_state(hf.decoding_cross_attention).items()})
    ours.load_state_dict(state)
    z = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        query = hf.decoder_query(z)
        want = hf(query, z).logits
        have = ours(z)
    torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)


def test_encoder_ignores_the_order_of_its_inputs_with_their_features():
    torch.manual_seed(9)
    enc = ref.PerceiverEncoder(1 + 18, 6, 8, num_blocks=2).double().eval()
    pixels = torch.rand(2, 16, 1, dtype=torch.float64)
    features = ref.fourier_position_features((4, 4), 4).double().expand(2, -1, -1)
    perm = torch.randperm(16)
    with torch.no_grad():
        z = enc(torch.cat([pixels, features], -1))
        z_shuffled = enc(torch.cat([pixels[:, perm], features[:, perm]], -1))
        z_pixels_only = enc(torch.cat([pixels[:, perm], features], -1))
    torch.testing.assert_close(z_shuffled, z)
    assert (z_pixels_only - z).abs().max() > 1e-3


def test_mean_attention_distance_of_uniform_attention():
    """Uniform attention over a g x g grid: the mean distance between two random cells' centres, in pixels."""
    g, p = 4, 2
    attn = torch.full((1, 2, 1 + g * g, 1 + g * g), 1.0 / (1 + g * g), dtype=torch.float64)
    centres = torch.tensor([[r, c] for r in range(g) for c in range(g)], dtype=torch.float64) * p
    want = torch.cdist(centres, centres).mean()
    torch.testing.assert_close(ref.mean_attention_distance(attn, (g, g), p), want.expand(2))
    assert math.isclose(ref.mean_attention_distance(torch.eye(1 + g * g)[None, None], (g, g), p).item(), 0.0)
