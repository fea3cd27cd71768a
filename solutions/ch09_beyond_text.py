"""Reference solution (instructor-only) for chapter 09_beyond_text.

generated from course/09_beyond_text.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def check_parts_first(*names):
    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        for name in names:
            try:
                if name == "patchify":
                    x = torch.randn(2, 3, 4, 6)
                    want = x.reshape(2, 3, 2, 2, 3, 2).permute(0, 2, 4, 1, 3, 5).reshape(2, 6, 12)
                    assert torch.allclose(patchify(x, 2), want), \
                        "fix `patchify` first: its patches or their features are in another order, and this test uses it"
                elif name == "PerceiverLayer":
                    layer = PerceiverLayer(8, 6, num_heads=2, is_cross_attention=True)
                    h, z = torch.randn(2, 3, 8), torch.randn(2, 5, 6)
                    assert torch.allclose(layer(h, z), perceiver_layer_by_formula(layer, h, z), atol=1e-5), \
                        "fix `PerceiverLayer` first: its cross-attention differs from the formula, and this test uses it"
            except NotImplementedError:
                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None


def built_with(cls, init, state, dtype=torch.float32):
    """Given: cls(**init) in eval mode, its parameters set to `state` (name -> tensor), in `dtype`."""
    module = cls(**init).to(dtype)
    with torch.no_grad():
        for name, value in state.items():
            module.get_parameter(name).copy_(value)
    return module.eval()


def refuses_other_sizes(init, state, images):
    """Given, for the grader: 1.0 if ViTEmbeddings(**init) with these parameters raises ValueError on
    `images` without interpolation, 0.0 if it returns."""
    embeddings = built_with(ViTEmbeddings, init, state, images.dtype)
    try:
        embeddings(images)
    except ValueError:
        return torch.tensor(1.0)
    return torch.tensor(0.0)


class MultiHeadSelfAttention(nn.Module):
    """Given (Chapter 3): multi-head self-attention over all tokens, no mask; head i uses features i*d_k:(i+1)*d_k."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)
        self.last_weights = None   # (B, h, T, T) of the last call, for plots

    def forward(self, x):
        """x (B, T, d_model) -> (B, T, d_model)."""
        B, T, d = x.shape
        h = self.num_heads
        q = self.q_proj(x).view(B, T, h, d // h).transpose(1, 2)   # (B, h, T, d_k)
        k = self.k_proj(x).view(B, T, h, d // h).transpose(1, 2)
        v = self.v_proj(x).view(B, T, h, d // h).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)   # (B, h, T, T)
        self.last_weights = weights.detach()
        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, d))


def vit_weights_from_transformers(hf_state, num_layers):
    """Given: the state dict of a transformers ViTForImageClassification, under VisionTransformer's names."""
    state = {
        "embeddings.cls_token": hf_state["vit.embeddings.cls_token"],
        "embeddings.position_embeddings": hf_state["vit.embeddings.position_embeddings"],
        "embeddings.projection.weight": hf_state["vit.embeddings.patch_embeddings.projection.weight"].flatten(1),
        "embeddings.projection.bias": hf_state["vit.embeddings.patch_embeddings.projection.bias"],
        "layernorm.weight": hf_state["vit.layernorm.weight"], "layernorm.bias": hf_state["vit.layernorm.bias"],
        "classifier.weight": hf_state["classifier.weight"], "classifier.bias": hf_state["classifier.bias"],
    }
    for i in range(num_layers):
        for ours, theirs in [("layernorm_before", "layernorm_before"), ("layernorm_after", "layernorm_after"),
                             ("attention.q_proj", "attention.q_proj"), ("attention.k_proj", "attention.k_proj"),
                             ("attention.v_proj", "attention.v_proj"), ("attention.o_proj", "attention.o_proj"),
                             ("fc1", "mlp.fc1"), ("fc2", "mlp.fc2")]:
            for kind in ("weight", "bias"):
                state[f"layers.{i}.{ours}.{kind}"] = hf_state[f"vit.layers.{i}.{theirs}.{kind}"]
    return state


def perceiver_layer_by_formula(layer, hidden, inputs=None):
    """Given: PerceiverLayer's output, head by head, written as plainly as possible."""
    q_in = layer.layernorm1(hidden)
    kv_in = q_in if inputs is None else layer.layernorm2(inputs)
    q_all, k_all, v_all = layer.query(q_in), layer.key(kv_in), layer.value(kv_in)
    h = layer.num_heads
    c, c_v = q_all.size(-1) // h, v_all.size(-1) // h
    heads = []
    for i in range(h):
        s = q_all[..., i * c:(i + 1) * c] @ k_all[..., i * c:(i + 1) * c].transpose(-2, -1) / math.sqrt(c)
        heads.append(torch.softmax(s, dim=-1) @ v_all[..., i * c_v:(i + 1) * c_v])
    a = layer.output(torch.cat(heads, dim=-1)) + (hidden if layer.use_query_residual else 0)
    return a + layer.dense2(F.gelu(layer.dense1(layer.layernorm(a))))


def patchify(images, patch_size):
    """Cut images into non-overlapping square patches, one flattened patch per token.

    images: (B, C, H, W) float tensor, H and W multiples of patch_size (p).
    Returns (B, N, C * p * p) with N = (H / p) * (W / p): patch n = r * (W / p) + c is the
    one at patch row r, patch column c (rows top to bottom, then left to right), and its
    C * p * p features are in the order (channel, row in the patch, column in the patch).
    """
    B, C, H, W = images.shape
    p = patch_size
    x = images.reshape(B, C, H // p, p, W // p, p)      # (B, C, gh, p, gw, p)
    x = x.permute(0, 2, 4, 1, 3, 5)                     # (B, gh, gw, C, p, p)
    return x.reshape(B, (H // p) * (W // p), C * p * p)


class ViTEmbeddings(nn.Module):
    """ViT's input: projected patches, a class token, learned position embeddings."""

    def __init__(self, image_size, patch_size, in_channels, d_model):
        super().__init__()
        self.image_size, self.patch_size = image_size, patch_size
        num_patches = (image_size // patch_size) ** 2
        self.projection = nn.Linear(in_channels * patch_size ** 2, d_model)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d_model) * 0.02)
        self.position_embeddings = nn.Parameter(torch.randn(1, 1 + num_patches, d_model) * 0.02)

    def forward(self, images, interpolate_pos_encoding=False):
        """images: (B, C, H, W). Returns (B, 1 + N', d_model), N' = (H / p) * (W / p).

        Token 0 is self.cls_token (one token, shared by the batch), then the projected
        patches of patchify; self.position_embeddings are added to all 1 + N' tokens.
        An image of another size than image_size x image_size raises ValueError unless
        interpolate_pos_encoding is True: then the N patch embeddings, laid out on their
        square (g, g) grid, are resized to (H / p, W / p) with
        F.interpolate(..., mode="bicubic", align_corners=False) over the grid's two axes
        (the class token's embedding unchanged; on the trained grid nothing is resized).
        """
        B, _, H, W = images.shape
        p = self.patch_size
        if not interpolate_pos_encoding and (H, W) != (self.image_size, self.image_size):
            raise ValueError(f"image size ({H}x{W}) differs from the model's ({self.image_size}x{self.image_size}); "
                             "pass interpolate_pos_encoding=True")
        x = self.projection(patchify(images, p))                  # (B, N', d)
        x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
        pos = self.position_embeddings                            # (1, 1 + N, d)
        g = self.image_size // p
        if (H // p, W // p) != (g, g):
            grid = pos[:, 1:].reshape(1, g, g, -1).permute(0, 3, 1, 2)          # (1, d, g, g)
            grid = F.interpolate(grid, size=(H // p, W // p), mode="bicubic", align_corners=False)
            pos = torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, pos.size(-1))], dim=1)
        return x + pos


class ViTLayer(nn.Module):
    """ViT's pre-LN encoder layer: attention and an MLP, each on a normalised input, each with a residual."""

    def __init__(self, d_model, num_heads, d_ff, eps=1e-12):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(d_model, eps=eps)
        self.attention = MultiHeadSelfAttention(d_model, num_heads)
        self.layernorm_after = nn.LayerNorm(d_model, eps=eps)
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        """x: (B, T, d_model) -> (B, T, d_model).

        h = x + attention(layernorm_before(x)); returns h + fc2(gelu(fc1(layernorm_after(h)))),
        with the exact (erf) GELU.
        """
        h = x + self.attention(self.layernorm_before(x))
        return h + self.fc2(F.gelu(self.fc1(self.layernorm_after(h))))


class VisionTransformer(nn.Module):
    """ViT for classification (Dosovitskiy et al., 2021)."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, d_model, num_layers, num_heads, d_ff,
                 eps=1e-12):
        super().__init__()
        self.embeddings = ViTEmbeddings(image_size, patch_size, in_channels, d_model)
        self.layers = nn.ModuleList(ViTLayer(d_model, num_heads, d_ff, eps) for _ in range(num_layers))
        self.layernorm = nn.LayerNorm(d_model, eps=eps)
        self.classifier = nn.Linear(d_model, num_classes)

    def forward(self, images, interpolate_pos_encoding=False):
        """images: (B, C, H, W) -> logits (B, num_classes).

        The embeddings (interpolate_pos_encoding passed on), every layer in order, the final
        layernorm, then the classifier on the class token's output (position 0) only.
        """
        x = self.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)   # (B, 1 + N, d)
        for layer in self.layers:
            x = layer(x)
        return self.classifier(self.layernorm(x)[:, 0])


def mean_attention_distance(attn, grid_size, patch_size):
    """How far each head looks, in pixels (the ViT paper's "attention distance", Figure 7).

    attn: (B, H, 1 + N, 1 + N) attention weights of one layer, the class token first.
    grid_size: (gh, gw), N = gh * gw patches in patchify's order. patch_size: pixels per patch step.
    Returns (H,): for each head, the mean over the batch and the N patch queries of
    sum_j w_ij * dist(i, j), the class token's row and column dropped, each row renormalised
    to sum to 1 over the N patches, dist the Euclidean distance between patch centres in pixels.
    """
    gh, gw = grid_size
    w = attn[..., 1:, 1:]                                          # (B, H, N, N)
    w = w / w.sum(-1, keepdim=True)
    rows = torch.arange(gh).repeat_interleave(gw)                  # patch n is at row n // gw, column n % gw
    cols = torch.arange(gw).repeat(gh)
    centres = torch.stack([rows, cols], -1).to(attn.dtype) * patch_size   # (N, 2), in pixels
    dist = torch.cdist(centres, centres)                           # (N, N)
    return (w * dist).sum(-1).mean(dim=(0, 2))


def fourier_position_features(index_dims, num_bands, max_resolution=None):
    """Perceiver's Fourier position features of a regular grid.

    index_dims: (n_1, ..., n_D); positions torch.linspace(-1, 1, n_d) along each axis, points in
    row-major order (torch.meshgrid(..., indexing="ij")). Frequencies f_{d,k} =
    torch.linspace(1, r_d / 2, num_bands)[k] with r = max_resolution (default index_dims).
    Returns (n_1 * ... * n_D, D * (2 * num_bands + 1)) float32:
    [x_1 .. x_D, sin(pi f_{d,k} x_d) for d then k, cos(pi f_{d,k} x_d) for d then k].
    """
    index_dims = tuple(index_dims)
    resolution = index_dims if max_resolution is None else tuple(max_resolution)
    axes = [torch.linspace(-1.0, 1.0, n) for n in index_dims]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(index_dims))   # (M, D)
    freqs = torch.stack([torch.linspace(1.0, r / 2, num_bands) for r in resolution])             # (D, K)
    angles = math.pi * (pos[:, :, None] * freqs[None]).reshape(pos.size(0), -1)                  # (M, D*K)
    return torch.cat([pos, torch.sin(angles), torch.cos(angles)], dim=-1)


class PerceiverLayer(nn.Module):
    """One Perceiver attention block (transformers' PerceiverLayer): cross- or self-attention, then an MLP."""

    def __init__(self, q_dim, kv_dim, num_heads=1, qk_channels=None, v_channels=None, widening_factor=1,
                 use_query_residual=True, is_cross_attention=False, eps=1e-5):
        super().__init__()
        qk_channels = q_dim if qk_channels is None else qk_channels
        v_channels = qk_channels if v_channels is None else v_channels
        assert qk_channels % num_heads == 0 and v_channels % num_heads == 0, "channels must divide into heads"
        self.num_heads, self.use_query_residual = num_heads, use_query_residual
        self.layernorm1 = nn.LayerNorm(q_dim, eps=eps)
        self.layernorm2 = nn.LayerNorm(kv_dim, eps=eps) if is_cross_attention else nn.Identity()
        self.query = nn.Linear(q_dim, qk_channels)
        self.key = nn.Linear(kv_dim, qk_channels)
        self.value = nn.Linear(kv_dim, v_channels)
        self.output = nn.Linear(v_channels, q_dim)
        self.layernorm = nn.LayerNorm(q_dim, eps=eps)
        self.dense1 = nn.Linear(q_dim, widening_factor * q_dim)
        self.dense2 = nn.Linear(widening_factor * q_dim, q_dim)

    def forward(self, hidden, inputs=None):
        """hidden: (B, N, q_dim); inputs: (B, M, kv_dim) for cross-attention, None for self-attention.

        Queries from layernorm1(hidden); keys and values from layernorm2(inputs), or from
        layernorm1(hidden) when inputs is None. num_heads heads (head i uses features i*c:(i+1)*c
        of each projection), scores scaled by 1/sqrt(qk_channels / num_heads), no mask; heads
        concatenated, a = output(...), plus hidden if use_query_residual.
        Returns a + dense2(gelu(dense1(layernorm(a)))), (B, N, q_dim).
        """
        B, N, _ = hidden.shape
        h = self.num_heads
        q_in = self.layernorm1(hidden)
        kv_in = q_in if inputs is None else self.layernorm2(inputs)
        M = kv_in.size(1)
        q = self.query(q_in).view(B, N, h, -1).transpose(1, 2)       # (B, h, N, c)
        k = self.key(kv_in).view(B, M, h, -1).transpose(1, 2)        # (B, h, M, c)
        v = self.value(kv_in).view(B, M, h, -1).transpose(1, 2)      # (B, h, M, c_v)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)   # (B, h, N, M)
        a = self.output((weights @ v).transpose(1, 2).reshape(B, N, -1))
        if self.use_query_residual:
            a = a + hidden
        return a + self.dense2(F.gelu(self.dense1(self.layernorm(a))))


class PerceiverEncoder(nn.Module):
    """Perceiver IO's encoder: a latent array cross-attends to the inputs, then self-attends."""

    def __init__(self, input_dim, num_latents, d_latents, num_blocks=1, num_self_attends_per_block=1,
                 num_cross_attention_heads=1, num_self_attention_heads=1):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(num_latents, d_latents))
        self.cross_attention = PerceiverLayer(d_latents, input_dim, num_cross_attention_heads,
                                              qk_channels=input_dim, is_cross_attention=True)
        self.self_attends = nn.ModuleList(PerceiverLayer(d_latents, d_latents, num_self_attention_heads)
                                          for _ in range(num_self_attends_per_block))
        self.num_blocks = num_blocks

    def forward(self, inputs):
        """inputs: (B, M, input_dim) -> (B, num_latents, d_latents).

        self.latents (one array, shared by the batch) cross-attends to the inputs; then the
        layers of self.self_attends, in order, are applied num_blocks times.
        """
        z = self.latents.expand(inputs.size(0), -1, -1)       # (B, N, d_latents)
        z = self.cross_attention(z, inputs)
        for _ in range(self.num_blocks):
            for layer in self.self_attends:
                z = layer(z)
        return z


class PerceiverDecoder(nn.Module):
    """Perceiver IO's decoder with trainable output queries (transformers' PerceiverBasicDecoder)."""

    def __init__(self, d_latents, num_outputs, query_dim, output_dim, num_heads=1):
        super().__init__()
        self.output_queries = nn.Parameter(torch.randn(num_outputs, query_dim) * 0.02)
        self.decoding_cross_attention = PerceiverLayer(query_dim, d_latents, num_heads, qk_channels=d_latents,
                                                       use_query_residual=False, is_cross_attention=True)
        self.final_layer = nn.Linear(query_dim, output_dim)

    def forward(self, latents):
        """latents: (B, N, d_latents) -> (B, num_outputs, output_dim).

        self.output_queries, shared by the batch, cross-attend to the latents; then final_layer.
        """
        q = self.output_queries.expand(latents.size(0), -1, -1)      # (B, O, query_dim)
        return self.final_layer(self.decoding_cross_attention(q, latents))


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\ndef check_parts_first(*names):\n    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""\n    with torch.random.fork_rng(), torch.no_grad():\n        torch.manual_seed(0)\n        for name in names:\n            try:\n                if name == "patchify":\n                    x = torch.randn(2, 3, 4, 6)\n                    want = x.reshape(2, 3, 2, 2, 3, 2).permute(0, 2, 4, 1, 3, 5).reshape(2, 6, 12)\n                    assert torch.allclose(patchify(x, 2), want), \\\n                        "fix `patchify` first: its patches or their features are in another order, and this test uses it"\n                elif name == "PerceiverLayer":\n                    layer = PerceiverLayer(8, 6, num_heads=2, is_cross_attention=True)\n                    h, z = torch.randn(2, 3, 8), torch.randn(2, 5, 6)\n                    assert torch.allclose(layer(h, z), perceiver_layer_by_formula(layer, h, z), atol=1e-5), \\\n                        "fix `PerceiverLayer` first: its cross-attention differs from the formula, and this test uses it"\n            except NotImplementedError:\n                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None\n\n\ndef built_with(cls, init, state, dtype=torch.float32):\n    """Given: cls(**init) in eval mode, its parameters set to `state` (name -> tensor), in `dtype`."""\n    module = cls(**init).to(dtype)\n    with torch.no_grad():\n        for name, value in state.items():\n            module.get_parameter(name).copy_(value)\n    return module.eval()\n\n\ndef refuses_other_sizes(init, state, images):\n    """Given, for the grader: 1.0 if ViTEmbeddings(**init) with these parameters raises ValueError on\n    `images` without interpolation, 0.0 if it returns."""\n    embeddings = built_with(ViTEmbeddings, init, state, images.dtype)\n    try:\n        embeddings(images)\n    except ValueError:\n        return torch.tensor(1.0)\n    return torch.tensor(0.0)\nclass MultiHeadSelfAttention(nn.Module):\n    """Given (Chapter 3): multi-head self-attention over all tokens, no mask; head i uses features i*d_k:(i+1)*d_k."""\n\n    def __init__(self, d_model, num_heads):\n        super().__init__()\n        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"\n        self.num_heads = num_heads\n        self.q_proj = nn.Linear(d_model, d_model)\n        self.k_proj = nn.Linear(d_model, d_model)\n        self.v_proj = nn.Linear(d_model, d_model)\n        self.o_proj = nn.Linear(d_model, d_model)\n        self.last_weights = None   # (B, h, T, T) of the last call, for plots\n\n    def forward(self, x):\n        """x (B, T, d_model) -> (B, T, d_model)."""\n        B, T, d = x.shape\n        h = self.num_heads\n        q = self.q_proj(x).view(B, T, h, d // h).transpose(1, 2)   # (B, h, T, d_k)\n        k = self.k_proj(x).view(B, T, h, d // h).transpose(1, 2)\n        v = self.v_proj(x).view(B, T, h, d // h).transpose(1, 2)\n        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // h), dim=-1)   # (B, h, T, T)\n        self.last_weights = weights.detach()\n        return self.o_proj((weights @ v).transpose(1, 2).reshape(B, T, d))\ndef vit_weights_from_transformers(hf_state, num_layers):\n    """Given: the state dict of a transformers ViTForImageClassification, under VisionTransformer\'s names."""\n    state = {\n        "embeddings.cls_token": hf_state["vit.embeddings.cls_token"],\n        "embeddings.position_embeddings": hf_state["vit.embeddings.position_embeddings"],\n        "embeddings.projection.weight": hf_state["vit.embeddings.patch_embeddings.projection.weight"].flatten(1),\n        "embeddings.projection.bias": hf_state["vit.embeddings.patch_embeddings.projection.bias"],\n        "layernorm.weight": hf_state["vit.layernorm.weight"], "layernorm.bias": hf_state["vit.layernorm.bias"],\n        "classifier.weight": hf_state["classifier.weight"], "classifier.bias": hf_state["classifier.bias"],\n    }\n    for i in range(num_layers):\n        for ours, theirs in [("layernorm_before", "layernorm_before"), ("layernorm_after", "layernorm_after"),\n                             ("attention.q_proj", "attention.q_proj"), ("attention.k_proj", "attention.k_proj"),\n                             ("attention.v_proj", "attention.v_proj"), ("attention.o_proj", "attention.o_proj"),\n                             ("fc1", "mlp.fc1"), ("fc2", "mlp.fc2")]:\n            for kind in ("weight", "bias"):\n                state[f"layers.{i}.{ours}.{kind}"] = hf_state[f"vit.layers.{i}.{theirs}.{kind}"]\n    return state\ndef perceiver_layer_by_formula(layer, hidden, inputs=None):\n    """Given: PerceiverLayer\'s output, head by head, written as plainly as possible."""\n    q_in = layer.layernorm1(hidden)\n    kv_in = q_in if inputs is None else layer.layernorm2(inputs)\n    q_all, k_all, v_all = layer.query(q_in), layer.key(kv_in), layer.value(kv_in)\n    h = layer.num_heads\n    c, c_v = q_all.size(-1) // h, v_all.size(-1) // h\n    heads = []\n    for i in range(h):\n        s = q_all[..., i * c:(i + 1) * c] @ k_all[..., i * c:(i + 1) * c].transpose(-2, -1) / math.sqrt(c)\n        heads.append(torch.softmax(s, dim=-1) @ v_all[..., i * c_v:(i + 1) * c_v])\n    a = layer.output(torch.cat(heads, dim=-1)) + (hidden if layer.use_query_residual else 0)\n    return a + layer.dense2(F.gelu(layer.dense1(layer.layernorm(a))))'
