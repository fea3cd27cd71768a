"""Hidden tests of Chapter 9 against a catalog of correct, wrong and hostile submissions.

Correct styles and mistakes are judged in process by the kernel's own call routine and the
grader's judge; tampering and a sample go through the real pipeline (see tests/catalog.py).
A correct style gets every point; a mistake loses exactly the listed tests, each with the
given message fragment, and passes every other test.

The styles are written as other codebases write the same things: ``transformers``' ViT and
Perceiver layout, ``F.unfold`` / ``Tensor.unfold`` and einsum rearranges (what einops'
``rearrange`` spells out), a ``Conv2d``-style patch embedding (the projection's weight used as
a convolution kernel: allowed, since only ``patchify`` is from scratch), loops over heads.
"""
from __future__ import annotations

import functools
import textwrap

from autograder.chapters import ChapterInfo
from catalog import (Catalog, CatalogTests, body, common_tampering, fn, others_stubbed, submitter, tampered,
                     with_methods)

CHAPTER = "09_beyond_text"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
EMB_TESTS = ["test_ViTEmbeddings", "test_ViTEmbeddings_interpolate"]
CROSS_TESTS = ["test_PerceiverLayer_cross", "test_PerceiverLayer_self"]


# Each class exercise's forward as the spec writes its signature.
FORWARDS = {
    "ViTEmbeddings": "forward(self, images, interpolate_pos_encoding=False)",
    "ViTLayer": "forward(self, x)",
    "VisionTransformer": "forward(self, images, interpolate_pos_encoding=False)",
    "PerceiverLayer": "forward(self, hidden, inputs=None)",
    "PerceiverEncoder": "forward(self, inputs)",
    "PerceiverDecoder": "forward(self, latents)",
}


def given(exercise: str, forward_body: str, methods: str = "") -> str:
    """The exercise's class with its ``__init__`` as the chapter source gives it, and ``forward``
    (and any ``methods``) as a learner wrote them."""
    forward = f"def {FORWARDS[exercise]}:\n" + body(forward_body, 4)
    return with_methods(CHAPTER, exercise, forward + textwrap.dedent(methods))


embeddings, vit_layer, vit, perceiver_layer, encoder, decoder = (functools.partial(given, name) for name in FORWARDS)

sub = submitter(CHAPTER)

PATCH_SIG = "patchify(images, patch_size)"
MAD_SIG = "mean_attention_distance(attn, grid_size, patch_size)"
FOURIER_SIG = "fourier_position_features(index_dims, num_bands, max_resolution=None)"

# ------------------------------------------------------------------ correct, other styles
HF_STYLE_EMB_FORWARD = """
    batch_size, num_channels, height, width = images.shape
    if not interpolate_pos_encoding:
        if height != self.image_size or width != self.image_size:
            raise ValueError(f"Input image size ({height}*{width}) doesn't match model "
                             f"({self.image_size}*{self.image_size}).")
    embeddings = self.projection(patchify(images, self.patch_size))
    cls_tokens = self.cls_token.expand(batch_size, -1, -1)
    embeddings = torch.cat((cls_tokens, embeddings), dim=1)
    if interpolate_pos_encoding:
        embeddings = embeddings + self.interpolate_pos_encoding(embeddings, height, width)
    else:
        embeddings = embeddings + self.position_embeddings
    return embeddings
"""
HF_STYLE_EMB_METHODS = """
    def interpolate_pos_encoding(self, embeddings, height, width):
        num_patches = embeddings.shape[1] - 1
        num_positions = self.position_embeddings.shape[1] - 1
        if num_patches == num_positions and height == width:
            return self.position_embeddings
        class_pos_embed = self.position_embeddings[:, :1]
        patch_pos_embed = self.position_embeddings[:, 1:]
        dim = embeddings.shape[-1]
        new_height = height // self.patch_size
        new_width = width // self.patch_size
        sqrt_num_positions = int(num_positions ** 0.5)
        patch_pos_embed = patch_pos_embed.reshape(1, sqrt_num_positions, sqrt_num_positions, dim)
        patch_pos_embed = patch_pos_embed.permute(0, 3, 1, 2)
        patch_pos_embed = nn.functional.interpolate(patch_pos_embed, size=(new_height, new_width),
                                                    mode="bicubic", align_corners=False)
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed, patch_pos_embed), dim=1)
"""

# transformers' own layout: ViTEmbeddings.interpolate_pos_encoding as it is written there (a square
# grid permuted to channels first, F.interpolate to a size, permuted back), ViTLayer's named steps,
# Perceiver's transpose_for_scores, generate_fourier_features with numpy's pi.
HF_STYLE = {
    "patchify": fn(PATCH_SIG, """
        # space-to-depth: each p x p block becomes C * p * p channels in (channel, row, column) order
        blocks = F.pixel_unshuffle(images, patch_size)                    # (B, C p p, H/p, W/p)
        return blocks.flatten(start_dim=2).transpose(1, 2)                # (B, N, C p p)
    """),
    "ViTEmbeddings": embeddings(HF_STYLE_EMB_FORWARD, HF_STYLE_EMB_METHODS),
    "ViTLayer": vit_layer("""
        attention_output = self.attention(self.layernorm_before(x))
        hidden_states = attention_output + x
        layer_output = self.layernorm_after(hidden_states)
        layer_output = self.intermediate_act_fn(self.fc1(layer_output))
        layer_output = self.fc2(layer_output)
        return layer_output + hidden_states
    """, methods="""
        def intermediate_act_fn(self, hidden_states):
            return nn.functional.gelu(hidden_states)
    """),
    "VisionTransformer": vit("""
        embedding_output = self.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)
        hidden_states = embedding_output
        for layer_module in self.layers:
            hidden_states = layer_module(hidden_states)
        sequence_output = self.layernorm(hidden_states)
        logits = self.classifier(sequence_output[:, 0, :])
        return logits
    """),
    "mean_attention_distance": fn(MAD_SIG, """
        gh, gw = grid_size
        weights = attn[:, :, 1:, 1:]
        weights = weights / weights.sum(dim=-1, keepdim=True)
        rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        centres = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1).to(attn.dtype) * patch_size
        distances = torch.cdist(centres, centres)                          # (N, N) pixels
        return (weights * distances).sum(dim=-1).mean(dim=(0, 2))
    """),
    "fourier_position_features": fn(FOURIER_SIG, """
        import numpy as np
        if max_resolution is None:
            max_resolution = index_dims
        dim_ranges = [torch.linspace(start=-1.0, end=1.0, steps=n, dtype=torch.float32) for n in index_dims]
        pos = torch.stack(torch.meshgrid(*dim_ranges, indexing="ij"), dim=-1)
        pos = pos.reshape(-1, len(index_dims))
        freq_bands = torch.stack([torch.linspace(start=1.0, end=res / 2, steps=num_bands) for res in max_resolution])
        per_pos_features = pos[:, :, None] * freq_bands[None, :, :]
        per_pos_features = torch.reshape(per_pos_features, [-1, int(np.prod(per_pos_features.shape[1:]))])
        per_pos_features = torch.cat([torch.sin(np.pi * per_pos_features), torch.cos(np.pi * per_pos_features)], dim=-1)
        return torch.cat([pos, per_pos_features], dim=-1)
    """),
    "PerceiverLayer": perceiver_layer("""
        is_cross_attention = inputs is not None
        hidden_states = self.layernorm1(hidden)
        inputs = self.layernorm2(inputs) if is_cross_attention else hidden_states
        queries = self.transpose_for_scores(self.query(hidden_states))
        keys = self.transpose_for_scores(self.key(inputs))
        values = self.transpose_for_scores(self.value(inputs))
        attention_scores = torch.matmul(queries, keys.transpose(-1, -2))
        batch_size, num_heads, seq_len, q_head_dim = queries.shape
        attention_scores = attention_scores / math.sqrt(q_head_dim)
        attention_probs = nn.Softmax(dim=-1)(attention_scores)
        context_layer = torch.matmul(attention_probs, values)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        context_layer = context_layer.view(batch_size, seq_len, -1)
        attention_output = self.output(context_layer)
        if self.use_query_residual:
            attention_output = attention_output + hidden
        layer_output = self.layernorm(attention_output)
        layer_output = self.dense2(nn.functional.gelu(self.dense1(layer_output)))
        return layer_output + attention_output
    """, methods="""
        def transpose_for_scores(self, x):
            batch_size, seq_length, channels = x.shape
            x = x.view(batch_size, seq_length, self.num_heads, channels // self.num_heads)
            return x.permute(0, 2, 1, 3)
    """),
    "PerceiverEncoder": encoder("""
        batch_size = inputs.shape[0]
        hidden_states = self.latents.expand(batch_size, -1, -1)
        hidden_states = self.cross_attention(hidden_states, inputs)
        for _ in range(self.num_blocks):
            for layer in self.self_attends:
                hidden_states = layer(hidden_states)
        return hidden_states
    """),
    "PerceiverDecoder": decoder("""
        batch_size = latents.shape[0]
        query = self.output_queries.expand(batch_size, -1, -1)
        output = self.decoding_cross_attention(query, inputs=latents)
        return self.final_layer(output)
    """),
}

# Rearranges spelled as einsum (what einops' rearrange writes), F.unfold, the projection's weight used as
# a convolution kernel (a Conv2d patch embedding), one fused attention with einsum and softmax by exp/sum.
EINSUM_STYLE = {
    "patchify": fn(PATCH_SIG, """
        n, c, rows, cols = images.shape
        grid = images.view(n, c, rows // patch_size, patch_size, cols // patch_size, patch_size)
        # rearrange 'b c (h p) (w q) -> b (h w) (c p q)', spelled as einsum then two flattens
        return torch.einsum("bchpwq->bhwcpq", grid).flatten(3).flatten(1, 2)
    """),
    "ViTEmbeddings": embeddings("""
        B, C, H, W = images.shape
        p, D = self.patch_size, self.cls_token.shape[-1]
        gh, gw = H // p, W // p
        g = self.image_size // p
        if (gh, gw) != (g, g) and not interpolate_pos_encoding:
            raise ValueError("this model was built for %d x %d images, got %d x %d"
                             % (self.image_size, self.image_size, H, W))
        kernel = self.projection.weight.view(D, C, p, p)                  # the Linear as a Conv2d(kernel=stride=p)
        tokens = F.conv2d(images, kernel, self.projection.bias, stride=p).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.repeat(B, 1, 1), tokens], dim=1)
        pos = self.position_embeddings
        if (gh, gw) != (g, g):
            grid = pos[0, 1:].transpose(0, 1).reshape(1, D, g, g)         # (1, D, g, g)
            grid = F.interpolate(grid, size=(gh, gw), mode="bicubic", align_corners=False)
            pos = torch.cat([pos[:, :1], grid.flatten(2).transpose(1, 2)], dim=1)
        return tokens + pos
    """),
    "ViTLayer": vit_layer("""
        ln1, ln2 = self.layernorm_before, self.layernorm_after
        d = x.shape[-1]
        h = x + self.attention(F.layer_norm(x, (d,), ln1.weight, ln1.bias, ln1.eps))
        z = F.linear(F.layer_norm(h, (d,), ln2.weight, ln2.bias, ln2.eps), self.fc1.weight, self.fc1.bias)
        z = 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))
        return h + F.linear(z, self.fc2.weight, self.fc2.bias)
    """),
    "VisionTransformer": vit("""
        import functools
        x = self.embeddings(images, interpolate_pos_encoding)
        x = functools.reduce(lambda h, layer: layer(h), self.layers, x)
        cls = x[:, 0]                                  # a layer norm works token by token: normalise the one read
        return self.classifier(self.layernorm(cls))
    """),
    "mean_attention_distance": fn(MAD_SIG, """
        gh, gw = grid_size
        n = gh * gw
        w = attn[..., 1:, 1:]
        w = w / w.sum(-1, keepdim=True)
        idx = torch.arange(n)
        r = (idx // gw).to(attn.dtype) * patch_size
        c = (idx % gw).to(attn.dtype) * patch_size
        d = torch.sqrt((r[:, None] - r[None, :]) ** 2 + (c[:, None] - c[None, :]) ** 2)
        return torch.einsum("bhij,ij->h", w, d) / (attn.shape[0] * n)
    """),
    "fourier_position_features": fn(FOURIER_SIG, """
        res = tuple(index_dims) if max_resolution is None else tuple(max_resolution)
        D = len(index_dims)
        grids = torch.meshgrid(*[torch.linspace(-1, 1, n) for n in index_dims], indexing="ij")
        pos = torch.stack([g.flatten() for g in grids], 1)                       # (P, D)
        f = torch.stack([torch.linspace(1.0, r / 2.0, num_bands) for r in res])  # (D, K)
        angles = torch.einsum("pd,dk->pdk", pos, f).flatten(1) * math.pi
        return torch.cat([pos, angles.sin(), angles.cos()], dim=1).float()
    """),
    "PerceiverLayer": perceiver_layer("""
        h = self.num_heads
        x = self.layernorm1(hidden)
        kv = x if inputs is None else self.layernorm2(inputs)
        q = self.query(x).unflatten(-1, (h, -1))                 # (B, N, h, c)
        k = self.key(kv).unflatten(-1, (h, -1))                  # (B, M, h, c)
        v = self.value(kv).unflatten(-1, (h, -1))                # (B, M, h, cv)
        s = torch.einsum("bnhc,bmhc->bhnm", q, k) * q.shape[-1] ** -0.5
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))
        w = e / e.sum(dim=-1, keepdim=True)
        a = self.output(torch.einsum("bhnm,bmhc->bnhc", w, v).flatten(2))
        if self.use_query_residual:
            a = a + hidden
        return a + self.dense2(F.gelu(self.dense1(self.layernorm(a))))
    """),
    "PerceiverEncoder": encoder("""
        B = inputs.size(0)
        z = self.cross_attention(self.latents.unsqueeze(0).repeat(B, 1, 1), inputs=inputs)
        n = len(self.self_attends)
        for i in range(self.num_blocks * n):
            z = self.self_attends[i % n](z)
        return z
    """),
    "PerceiverDecoder": decoder("""
        q = self.output_queries[None].repeat(latents.size(0), 1, 1)
        return self.final_layer(self.decoding_cross_attention(q, latents))
    """),
}

# By another hand again: Tensor.unfold, a loop over heads with torch.cat, explicit coordinates,
# Fourier features from broadcasting and a cartesian product, torch.stack of the shared arrays.
LOOP_STYLE = {
    "patchify": fn(PATCH_SIG, """
        B, C, H, W = images.shape
        x = images.unfold(2, patch_size, patch_size).unfold(3, patch_size, patch_size)  # (B, C, gh, gw, p, p)
        x = x.permute(0, 2, 3, 1, 4, 5)
        return x.reshape(B, x.shape[1] * x.shape[2], -1)
    """),
    "ViTEmbeddings": embeddings("""
        B, C, H, W = images.shape
        p = self.patch_size
        g = int(round((self.position_embeddings.shape[1] - 1) ** 0.5))
        same = H == W == self.image_size
        if not same and not interpolate_pos_encoding:
            raise ValueError(f"expected {self.image_size}x{self.image_size} images; "
                             "pass interpolate_pos_encoding=True for another size")
        patches = self.projection(patchify(images, p))                      # (B, N, D)
        cls_pos, patch_pos = self.position_embeddings[:, :1], self.position_embeddings[:, 1:]
        if not same:
            D = patch_pos.shape[-1]
            grid = patch_pos.reshape(g, g, D).permute(2, 0, 1).unsqueeze(0)
            grid = F.interpolate(grid, size=(H // p, W // p), mode="bicubic", align_corners=False)
            patch_pos = grid.squeeze(0).permute(1, 2, 0).reshape(1, -1, D)
        cls = (self.cls_token + cls_pos).expand(B, 1, -1)                   # the class token at position 0
        return torch.cat([cls, patches + patch_pos], dim=1)
    """),
    "ViTLayer": vit_layer("""
        gelu = nn.GELU()
        mlp = nn.Sequential(self.layernorm_after, self.fc1, gelu, self.fc2)
        x = x + self.attention(self.layernorm_before(x))
        return x + mlp(x)
    """),
    "VisionTransformer": vit("""
        tokens = self.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)
        for i in range(len(self.layers)):
            tokens = self.layers[i](tokens)
        return self.classifier(self.layernorm(tokens).select(1, 0))
    """),
    "mean_attention_distance": fn(MAD_SIG, """
        gh, gw = grid_size
        B, H = attn.shape[:2]
        coords = [(r * patch_size, c * patch_size) for r in range(gh) for c in range(gw)]
        xy = torch.tensor(coords, dtype=attn.dtype)
        dist = (xy[:, None, :] - xy[None, :, :]).pow(2).sum(-1).sqrt()
        out = []
        for head in range(H):
            w = attn[:, head, 1:, 1:]
            w = w / w.sum(-1, keepdim=True)
            out.append((w * dist).sum(-1).mean())
        return torch.stack(out)
    """),
    "fourier_position_features": fn(FOURIER_SIG, """
        dims = list(index_dims)
        res = dims if max_resolution is None else list(max_resolution)
        axes = [torch.linspace(-1.0, 1.0, n) for n in dims]
        pos = torch.cartesian_prod(*axes) if len(axes) > 1 else axes[0][:, None]      # row-major, (P, D)
        sines, cosines = [], []
        for d, r in enumerate(res):
            freqs = torch.linspace(1.0, r / 2, num_bands)
            phase = math.pi * pos[:, d:d + 1] * freqs
            sines.append(torch.sin(phase))
            cosines.append(torch.cos(phase))
        return torch.cat([pos] + sines + cosines, dim=-1)
    """),
    "PerceiverLayer": perceiver_layer("""
        q_in = self.layernorm1(hidden)
        kv_in = q_in if inputs is None else self.layernorm2(inputs)
        Q, K, V = self.query(q_in), self.key(kv_in), self.value(kv_in)
        c = Q.shape[-1] // self.num_heads
        cv = V.shape[-1] // self.num_heads
        heads = []
        for i in range(self.num_heads):
            q, k, v = Q[..., i * c:(i + 1) * c], K[..., i * c:(i + 1) * c], V[..., i * cv:(i + 1) * cv]
            w = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(c), dim=-1)
            heads.append(w @ v)
        a = self.output(torch.cat(heads, dim=-1))
        a = a + hidden if self.use_query_residual else a
        return a + self.dense2(F.gelu(self.dense1(self.layernorm(a)), approximate="none"))
    """),
    "PerceiverEncoder": encoder("""
        schedule = [layer for _ in range(self.num_blocks) for layer in self.self_attends]   # shared weights in depth
        latents = self.cross_attention(torch.stack([self.latents] * inputs.shape[0]), inputs)
        for layer in schedule:
            latents = layer(latents)
        return latents
    """),
    "PerceiverDecoder": decoder("""
        queries = self.output_queries.unsqueeze(0).expand(latents.shape[0], *self.output_queries.shape)
        return self.final_layer(self.decoding_cross_attention(hidden=queries, inputs=latents))
    """),
}

# A fourth hand: F.unfold for the patches, a size check on the patch grid, positions resized with
# scale factors, attention through baddbmm over batch x heads.
UNFOLD_STYLE = {
    "patchify": fn(PATCH_SIG, """
        return F.unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)
    """),
    "ViTEmbeddings": embeddings("""
        B, _, H, W = images.shape
        g = self.image_size // self.patch_size
        grid = (H // self.patch_size, W // self.patch_size)
        if grid != (g, g) and not interpolate_pos_encoding:
            raise ValueError("image size differs from the size the position embeddings were trained for")
        x = self.projection(patchify(images, self.patch_size))
        x = torch.cat([self.cls_token.expand(x.shape[0], 1, x.shape[2]), x], dim=1)
        if grid == (g, g):
            return x + self.position_embeddings
        D = x.shape[-1]
        table = self.position_embeddings[0, 1:].reshape(g, g, D)
        table = F.interpolate(table.permute(2, 0, 1)[None], scale_factor=(grid[0] / g, grid[1] / g),
                              mode="bicubic", align_corners=False)[0]     # (D, H/p, W/p)
        pos = torch.cat([self.position_embeddings[0, :1], table.flatten(1).T], dim=0)
        return x + pos
    """),
    "PerceiverLayer": perceiver_layer("""
        B, N, _ = hidden.shape
        h = self.num_heads
        x = self.layernorm1(hidden)
        kv = self.layernorm2(inputs) if inputs is not None else x
        M = kv.shape[1]
        q = self.query(x).view(B, N, h, -1).transpose(1, 2).reshape(B * h, N, -1)
        k = self.key(kv).view(B, M, h, -1).transpose(1, 2).reshape(B * h, M, -1)
        v = self.value(kv).view(B, M, h, -1).transpose(1, 2).reshape(B * h, M, -1)
        scores = torch.baddbmm(torch.zeros(B * h, N, M, dtype=q.dtype), q, k.transpose(1, 2),
                               beta=0.0, alpha=q.shape[-1] ** -0.5)
        y = torch.bmm(scores.softmax(-1), v).view(B, h, N, -1).transpose(1, 2).reshape(B, N, -1)
        a = self.output(y) + (hidden if self.use_query_residual else 0)
        return a + self.dense2(F.gelu(self.dense1(self.layernorm(a))))
    """),
}

CORRECT = {
    "reference": sub(),
    "transformers_style": sub(HF_STYLE),
    "einsum_style": sub(EINSUM_STYLE, prepend=["def unused_helper(x):\n    return x\n"]),
    "loop_style": sub(LOOP_STYLE),
    "unfold_style": sub(UNFOLD_STYLE),
}

# ------------------------------------------------------------------ common mistakes
# Each one named change of a correct answer (the transformers style unless said otherwise).


def patchify_variant(order: str) -> str:
    """patchify with the (B, C, H/p, p, W/p, p) view permuted by ``order``."""
    return fn(PATCH_SIG, f"""
        B, C, H, W = images.shape
        p = patch_size
        x = images.reshape(B, C, H // p, p, W // p, p).permute({order})
        return x.reshape(B, (H // p) * (W // p), C * p * p)
    """)


PATCH_CHANNELS_LAST = patchify_variant("0, 2, 4, 3, 5, 1")     # features (row, column, channel)
PATCH_COLUMNS_FIRST = patchify_variant("0, 4, 2, 1, 3, 5")     # patch n = c * (H/p) + r
PATCH_CONV2D = fn(PATCH_SIG, """
    C = images.shape[1]
    eye = torch.eye(C * patch_size * patch_size, dtype=images.dtype)
    kernel = eye.reshape(-1, C, patch_size, patch_size)           # one output channel per patch feature
    return F.conv2d(images, kernel, stride=patch_size).flatten(2).transpose(1, 2)
""")


def embeddings_variant(old: str, new: str, method_old: str = "", method_new: str = "") -> str:
    """The transformers style's ViTEmbeddings with ``old`` replaced by ``new`` in forward (and
    ``method_old`` by ``method_new`` in its interpolate_pos_encoding)."""
    forward = textwrap.dedent(HF_STYLE_EMB_FORWARD)
    methods = textwrap.dedent(HF_STYLE_EMB_METHODS)
    if old:
        assert old in forward, old
        forward = forward.replace(old, new)
    if method_old:
        assert method_old in methods, method_old
        methods = methods.replace(method_old, method_new)
    return embeddings(forward, methods)


# positions added to the patches, then the class token prepended: the class token gets none
EMB_POS_BEFORE_CLS = embeddings_variant(
    "embeddings = self.projection(patchify(images, self.patch_size))\n"
    "cls_tokens = self.cls_token.expand(batch_size, -1, -1)\n"
    "embeddings = torch.cat((cls_tokens, embeddings), dim=1)\n"
    "if interpolate_pos_encoding:\n"
    "    embeddings = embeddings + self.interpolate_pos_encoding(embeddings, height, width)\n"
    "else:\n"
    "    embeddings = embeddings + self.position_embeddings\n",
    "embeddings = self.projection(patchify(images, self.patch_size))\n"
    "cls_tokens = self.cls_token.expand(batch_size, -1, -1)\n"
    "if interpolate_pos_encoding:\n"
    "    pos = self.interpolate_pos_encoding(torch.cat((cls_tokens, embeddings), dim=1), height, width)\n"
    "else:\n"
    "    pos = self.position_embeddings\n"
    "embeddings = embeddings + pos[:, 1:]\n"
    "embeddings = torch.cat((cls_tokens, embeddings), dim=1)\n")
EMB_NO_POSITIONS = embeddings_variant(
    "if interpolate_pos_encoding:\n"
    "    embeddings = embeddings + self.interpolate_pos_encoding(embeddings, height, width)\n"
    "else:\n"
    "    embeddings = embeddings + self.position_embeddings\n", "")
# a fresh class token for each example, made in forward: not the trained, shared parameter
EMB_CLS_PER_EXAMPLE = embeddings_variant(
    "cls_tokens = self.cls_token.expand(batch_size, -1, -1)",
    "cls_tokens = torch.zeros(batch_size, 1, self.cls_token.shape[-1], dtype=images.dtype)")
EMB_NO_SIZE_CHECK = embeddings_variant(
    "if not interpolate_pos_encoding:\n"
    "    if height != self.image_size or width != self.image_size:\n"
    "        raise ValueError(f\"Input image size ({height}*{width}) doesn't match model \"\n"
    "                         f\"({self.image_size}*{self.image_size}).\")\n", "")
# the size checked with an assert: an AssertionError, where the spec asks for a ValueError
EMB_ASSERT_SIZE = embeddings_variant(
    "if not interpolate_pos_encoding:\n"
    "    if height != self.image_size or width != self.image_size:\n"
    "        raise ValueError(f\"Input image size ({height}*{width}) doesn't match model \"\n"
    "                         f\"({self.image_size}*{self.image_size}).\")\n",
    "if not interpolate_pos_encoding:\n"
    "    assert height == width == self.image_size, \"wrong image size\"\n")
# the (N, D) table reshaped straight to (1, D, g, g): the grid's axes are not the patch rows and columns
EMB_INTERP_RESHAPED = embeddings_variant("", "", method_old=(
    "patch_pos_embed = patch_pos_embed.reshape(1, sqrt_num_positions, sqrt_num_positions, dim)\n"
    "    patch_pos_embed = patch_pos_embed.permute(0, 3, 1, 2)"),
    method_new="patch_pos_embed = patch_pos_embed.reshape(1, dim, sqrt_num_positions, sqrt_num_positions)")
# height and width swapped in the resized grid (right only for square images)
EMB_INTERP_TRANSPOSED = embeddings_variant("", "", method_old="size=(new_height, new_width)",
                                           method_new="size=(new_width, new_height)")
EMB_INTERP_BILINEAR = embeddings_variant("", "", method_old='mode="bicubic"', method_new='mode="bilinear"')
EMB_INTERP_ALIGN_CORNERS = embeddings_variant("", "", method_old="align_corners=False",
                                              method_new="align_corners=True")
# the whole table, class token included, resized along the token axis (1-D, linear)
EMB_INTERP_WHOLE_TABLE = embeddings_variant("", "", method_old=(
    "class_pos_embed = self.position_embeddings[:, :1]\n"), method_new=(
    "return F.interpolate(self.position_embeddings.transpose(1, 2), size=embeddings.shape[1],\n"
    "                         mode=\"linear\", align_corners=False).transpose(1, 2)\n"
    "    class_pos_embed = self.position_embeddings[:, :1]\n"))


def layer_variant(code: str) -> str:
    return vit_layer(code)


LAYER_POST_LN = layer_variant("""
    h = self.layernorm_before(x + self.attention(x))
    return self.layernorm_after(h + self.fc2(F.gelu(self.fc1(h))))
""")
LAYER_TANH_GELU = layer_variant("""
    h = x + self.attention(self.layernorm_before(x))
    return h + self.fc2(F.gelu(self.fc1(self.layernorm_after(h)), approximate="tanh"))
""")
LAYER_NORMED_RESIDUAL = layer_variant("""
    z = self.layernorm_before(x)
    h = z + self.attention(z)
    return h + self.fc2(F.gelu(self.fc1(self.layernorm_after(h))))
""")
LAYER_RELU = layer_variant("""
    h = x + self.attention(self.layernorm_before(x))
    return h + self.fc2(F.relu(self.fc1(self.layernorm_after(h))))
""")

VIT_MEAN_POOL = vit("""
    x = self.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)
    for layer in self.layers:
        x = layer(x)
    return self.classifier(self.layernorm(x).mean(dim=1))
""")
VIT_NO_FINAL_NORM = vit("""
    x = self.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)
    for layer in self.layers:
        x = layer(x)
    return self.classifier(x[:, 0])
""")
VIT_LAST_TOKEN = vit("""
    x = self.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)
    for layer in self.layers:
        x = layer(x)
    return self.classifier(self.layernorm(x)[:, -1])
""")


def distance_variant(weights="w / w.sum(-1, keepdim=True)", scale="patch_size", rows="attn[:, :, 1:, 1:]",
                     metric="torch.cdist(centres, centres)") -> str:
    return fn(MAD_SIG, f"""
        gh, gw = grid_size
        w = {rows}
        w = {weights}
        r, c = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        centres = torch.stack([r.flatten(), c.flatten()], -1).to(attn.dtype) * {scale}
        dist = {metric}
        return (w * dist).sum(-1).mean(dim=(0, 2))
    """)


MAD_IN_PATCHES = distance_variant(scale="1")
MAD_NOT_RENORMALISED = distance_variant(weights="w")
MAD_CLS_LAST = distance_variant(rows="attn[:, :, :-1, :-1]")
MAD_MANHATTAN = distance_variant(metric="torch.cdist(centres, centres, p=1)")


def fourier_variant(features="[pos, torch.sin(angles), torch.cos(angles)]", top="r / 2",
                    interleave=False, lo="-1.0") -> str:
    trig = ("torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)" if interleave else None)
    combine = f"torch.cat([pos, {trig}], dim=-1)" if interleave else f"torch.cat({features}, dim=-1)"
    return fn(FOURIER_SIG, f"""
        res = index_dims if max_resolution is None else max_resolution
        axes = [torch.linspace({lo}, 1.0, n) for n in index_dims]
        pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(index_dims))
        freqs = torch.stack([torch.linspace(1.0, {top}, num_bands) for r in res])      # (D, K)
        angles = math.pi * (pos[:, :, None] * freqs[None]).reshape(pos.shape[0], -1)
        return {combine}
    """)


FOURIER_NO_RAW = fourier_variant(features="[torch.sin(angles), torch.cos(angles)]")
FOURIER_UP_TO_R = fourier_variant(top="r")
FOURIER_INTERLEAVED = fourier_variant(interleave=True)
FOURIER_FROM_ZERO = fourier_variant(lo="0.0")
FOURIER_MESHGRID_XY = fourier_variant().replace('indexing="ij"', 'indexing="xy"')
FOURIER_WITHOUT_PI = fourier_variant().replace("angles = math.pi * (", "angles = (")
# max_resolution ignored: the frequencies always from the grid's own size
FOURIER_IGNORES_MAX_RES = fourier_variant().replace(
    "res = index_dims if max_resolution is None else max_resolution", "res = index_dims")


def layer_attention(q_source="x", kv_source="x if inputs is None else self.layernorm2(inputs)",
                    scale="math.sqrt(q.shape[-1])", residual="self.use_query_residual",
                    gelu="F.gelu(self.dense1(self.layernorm(a)))") -> str:
    return perceiver_layer(f"""
        B, N, _ = hidden.shape
        h = self.num_heads
        x = self.layernorm1(hidden)
        kv = {kv_source}
        q = self.query({q_source}).view(B, -1, h, self.query.out_features // h).transpose(1, 2)
        k = self.key(kv).view(B, kv.shape[1], h, -1).transpose(1, 2)
        v = self.value(kv).view(B, kv.shape[1], h, -1).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / {scale}, dim=-1)
        a = self.output((w @ v).transpose(1, 2).reshape(B, q.shape[2], -1))
        if {residual}:
            a = a + hidden
        return a + self.dense2({gelu})
    """)


PL_KEYS_FROM_HIDDEN = layer_attention(kv_source="x")
PL_KV_NOT_NORMALISED = layer_attention(kv_source="x if inputs is None else inputs")
PL_FULL_WIDTH_SCALE = layer_attention(scale="math.sqrt(self.query.out_features)")
PL_RESIDUAL_ALWAYS = layer_attention(residual="True")
PL_RESIDUAL_NEVER = layer_attention(residual="False")
PL_TANH_GELU = layer_attention(gelu='F.gelu(self.dense1(self.layernorm(a)), approximate="tanh")')
PL_MLP_WITHOUT_NORM = layer_attention(gelu="F.gelu(self.dense1(a))")
PL_SDPA = perceiver_layer("""
    B, N, _ = hidden.shape
    h = self.num_heads
    x = self.layernorm1(hidden)
    kv = x if inputs is None else self.layernorm2(inputs)
    q = self.query(x).view(B, N, h, -1).transpose(1, 2)
    k = self.key(kv).view(B, kv.shape[1], h, -1).transpose(1, 2)
    v = self.value(kv).view(B, kv.shape[1], h, -1).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v)
    a = self.output(y.transpose(1, 2).reshape(B, N, -1))
    if self.use_query_residual:
        a = a + hidden
    return a + self.dense2(F.gelu(self.dense1(self.layernorm(a))))
""")
PL_NN_MHA = perceiver_layer("""
    x = self.layernorm1(hidden)
    kv = x if inputs is None else self.layernorm2(inputs)
    q, k, v = self.query(x), self.key(kv), self.value(kv)
    E = q.shape[-1]
    mha = nn.MultiheadAttention(E, self.num_heads, batch_first=True, bias=False, vdim=v.shape[-1]).to(q.dtype)
    with torch.no_grad():
        mha.out_proj.weight.copy_(torch.eye(E, dtype=q.dtype))
        if mha._qkv_same_embed_dim:
            mha.in_proj_weight.copy_(torch.eye(E, dtype=q.dtype).repeat(3, 1))
        else:
            mha.q_proj_weight.copy_(torch.eye(E, dtype=q.dtype))
            mha.k_proj_weight.copy_(torch.eye(E, dtype=q.dtype))
            mha.v_proj_weight.copy_(torch.eye(E, v.shape[-1], dtype=q.dtype))
    y, _ = mha(q, k, v, need_weights=False)
    a = self.output(y)
    if self.use_query_residual:
        a = a + hidden
    return a + self.dense2(F.gelu(self.dense1(self.layernorm(a))))
""")
PL_DELEGATES_TO_TRANSFORMERS = perceiver_layer("""
    from transformers import PerceiverConfig
    from transformers.models.perceiver.modeling_perceiver import PerceiverLayer as HFLayer
    cross = inputs is not None
    q_dim = self.query.in_features
    cfg = PerceiverConfig(attention_probs_dropout_prob=0.0, hidden_act="gelu")
    layer = HFLayer(cfg, is_cross_attention=cross, qk_channels=self.query.out_features,
                    v_channels=self.value.out_features, num_heads=self.num_heads, q_dim=q_dim,
                    kv_dim=self.key.in_features, widening_factor=self.dense1.out_features // q_dim,
                    use_query_residual=self.use_query_residual).to(hidden.dtype).eval()
    a = layer.attention
    a.self.layernorm1, a.self.query, a.self.key, a.self.value = self.layernorm1, self.query, self.key, self.value
    if cross:
        a.self.layernorm2 = self.layernorm2
    a.output.dense, layer.layernorm = self.output, self.layernorm
    layer.mlp.dense1, layer.mlp.dense2 = self.dense1, self.dense2
    return layer(hidden, inputs=inputs)[0]
""")


EVERY_BLOCK = """
for _ in range(self.num_blocks):
    for layer in self.self_attends:
        z = layer(z)
"""


def encoder_variant(latents="self.latents.expand(B, -1, -1)", cross="self.cross_attention(z, inputs)",
                    blocks=EVERY_BLOCK) -> str:
    """The encoder with its start (``latents``), its cross-attention call or its block loop written wrong."""
    return encoder(f"""
        B = inputs.shape[0]
        z = {latents}
        z = {cross}
{textwrap.indent(textwrap.dedent(blocks).strip(), " " * 8)}
        return z
    """)


ENC_QUERIES_FROM_INPUTS = encoder_variant(cross="self.cross_attention(inputs, z)")
# each example its own latents: the shared array plus noise drawn for that example
ENC_LATENTS_NOT_SHARED = encoder_variant(
    latents="self.latents.expand(B, -1, -1) + 0.02 * torch.randn(B, *self.latents.shape, dtype=inputs.dtype)")
# a new latent array each call (as if built in forward): the trained parameter is never used
ENC_LATENTS_REINITIALISED = encoder_variant(
    latents="nn.Parameter(torch.randn(*self.latents.shape, dtype=inputs.dtype) * 0.02).expand(B, -1, -1)")
ENC_BLOCK_ONCE = encoder_variant(blocks="for layer in self.self_attends:\n    z = layer(z)")
# each self-attention layer repeated num_blocks times in a row, not the block as a whole
ENC_LAYERS_REPEATED_IN_PLACE = encoder_variant(blocks="""
for layer in self.self_attends:
    for _ in range(self.num_blocks):
        z = layer(z)
""")
ENC_NO_SELF_ATTENTION = encoder_variant(blocks="pass")
# the cross-attention inside the loop: the latents read the inputs again before every block
ENC_CROSS_EVERY_BLOCK = encoder_variant(cross="z", blocks="""
for _ in range(self.num_blocks):
    z = self.cross_attention(z, inputs)
    for layer in self.self_attends:
        z = layer(z)
""")
VIT_FIRST_LAYER_ONLY = vit("""
    x = self.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)
    x = self.layers[0](x)
    return self.classifier(self.layernorm(x)[:, 0])
""")
# heads as the columns of a (c, h) view: head i takes every h-th feature
PL_HEADS_STRIDED = perceiver_layer("""
    B, N, _ = hidden.shape
    h = self.num_heads
    x = self.layernorm1(hidden)
    kv = x if inputs is None else self.layernorm2(inputs)
    q = self.query(x).view(B, N, -1, h).permute(0, 3, 1, 2)
    k = self.key(kv).view(B, kv.shape[1], -1, h).permute(0, 3, 1, 2)
    v = self.value(kv).view(B, kv.shape[1], -1, h).permute(0, 3, 1, 2)
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    a = self.output((w @ v).permute(0, 2, 3, 1).reshape(B, N, -1))
    if self.use_query_residual:
        a = a + hidden
    return a + self.dense2(F.gelu(self.dense1(self.layernorm(a))))
""")

DEC_QUERIES_NOT_SHARED = decoder("""
    B = latents.shape[0]
    q = self.output_queries.expand(B, -1, -1) + 0.02 * torch.randn(B, *self.output_queries.shape, dtype=latents.dtype)
    return self.final_layer(self.decoding_cross_attention(q, latents))
""")
DEC_QUERIES_FROM_LATENTS = decoder("""
    return self.final_layer(self.decoding_cross_attention(latents, latents))
""")
DEC_NO_FINAL_LAYER = decoder("""
    q = self.output_queries.expand(latents.shape[0], -1, -1)
    return self.decoding_cross_attention(q, latents)
""")

MISTAKES = {
    "patches_channels_last": (sub({"patchify": PATCH_CHANNELS_LAST}), {"test_patchify": "channels last"}),
    "patches_columns_before_rows": (sub({"patchify": PATCH_COLUMNS_FIRST}), {"test_patchify": "columns before rows"}),
    "patchify_with_conv2d": (sub({"patchify": PATCH_CONV2D}), {"test_patchify": "from scratch"}),
    "no_position_embeddings": (sub({"ViTEmbeddings": EMB_NO_POSITIONS}),
                               {t: "no position embeddings" for t in EMB_TESTS}),
    "no_value_error_on_another_size": (sub({"ViTEmbeddings": EMB_NO_SIZE_CHECK}), {"test_ViTEmbeddings": "ValueError"}),
    "size_checked_by_assert": (sub({"ViTEmbeddings": EMB_ASSERT_SIZE}), {"test_ViTEmbeddings": "ValueError"}),
    "interpolation_on_reshaped_table": (sub({"ViTEmbeddings": EMB_INTERP_RESHAPED}),
                                        {"test_ViTEmbeddings_interpolate": "wrong axes"}),
    "interpolation_bilinear": (sub({"ViTEmbeddings": EMB_INTERP_BILINEAR}),
                               {"test_ViTEmbeddings_interpolate": "bilinear interpolation"}),
    "interpolation_align_corners": (sub({"ViTEmbeddings": EMB_INTERP_ALIGN_CORNERS}),
                                    {"test_ViTEmbeddings_interpolate": "align_corners"}),
    "interpolation_resizes_class_token_too": (sub({"ViTEmbeddings": EMB_INTERP_WHOLE_TABLE}),
                                              {"test_ViTEmbeddings_interpolate": "class token included"}),
    "vit_layer_post_ln": (sub({"ViTLayer": LAYER_POST_LN}), {"test_ViTLayer": "post-LN"}),
    "vit_layer_tanh_gelu": (sub({"ViTLayer": LAYER_TANH_GELU}), {"test_ViTLayer": "tanh approximation"}),
    "vit_layer_relu": (sub({"ViTLayer": LAYER_RELU}), {"test_ViTLayer": "ReLU"}),
    "vit_mean_pooling": (sub({"VisionTransformer": VIT_MEAN_POOL}), {"test_VisionTransformer": "mean pooling"}),
    "vit_final_layernorm_skipped": (sub({"VisionTransformer": VIT_NO_FINAL_NORM}),
                                    {"test_VisionTransformer": "final layernorm was skipped"}),
    "vit_reads_last_token": (sub({"VisionTransformer": VIT_LAST_TOKEN}),
                             {"test_VisionTransformer": "last token was read"}),
    "distance_in_patches": (sub({"mean_attention_distance": MAD_IN_PATCHES}),
                            {"test_mean_attention_distance": "distances in patches"}),
    "distance_manhattan": (sub({"mean_attention_distance": MAD_MANHATTAN}),
                           {"test_mean_attention_distance": "Manhattan distance"}),
    "fourier_without_raw_coordinates": (sub({"fourier_position_features": FOURIER_NO_RAW}),
                                        {"test_fourier_position_features": "raw coordinates are missing"}),
    "fourier_frequencies_up_to_r": (sub({"fourier_position_features": FOURIER_UP_TO_R}),
                                    {"test_fourier_position_features": "up to r instead of r / 2"}),
    "fourier_sin_cos_interleaved": (sub({"fourier_position_features": FOURIER_INTERLEAVED}),
                                    {"test_fourier_position_features": "sin and cos interleaved"}),
    "fourier_positions_from_zero": (sub({"fourier_position_features": FOURIER_FROM_ZERO}),
                                    {"test_fourier_position_features": "positions in [0, 1]"}),
    "fourier_meshgrid_xy": (sub({"fourier_position_features": FOURIER_MESHGRID_XY}),
                            {"test_fourier_position_features": "indexing='xy'"}),
    "fourier_without_pi": (sub({"fourier_position_features": FOURIER_WITHOUT_PI}),
                           {"test_fourier_position_features": "without pi"}),
    "vit_first_layer_only": (sub({"VisionTransformer": VIT_FIRST_LAYER_ONLY}),
                             {"test_VisionTransformer": "only the first layer"}),
    "perceiver_heads_strided": (sub({"PerceiverLayer": PL_HEADS_STRIDED}),
                                {t: "split feature by feature" for t in CROSS_TESTS}),
    "encoder_cross_attention_every_block": (sub({"PerceiverEncoder": ENC_CROSS_EVERY_BLOCK}),
                                            {"test_PerceiverEncoder": "repeated in every block"}),
    "fourier_max_resolution_ignored": (sub({"fourier_position_features": FOURIER_IGNORES_MAX_RES}),
                                       {"test_fourier_position_features": "max_resolution was ignored"}),
    "cross_attention_keys_from_hidden": (sub({"PerceiverLayer": PL_KEYS_FROM_HIDDEN}),
                                         {"test_PerceiverLayer_cross": "keys were taken from hidden"}),
    "cross_attention_inputs_not_normalised": (sub({"PerceiverLayer": PL_KV_NOT_NORMALISED}),
                                              {"test_PerceiverLayer_cross": "layernorm2 was not applied"}),
    "perceiver_scale_full_width": (sub({"PerceiverLayer": PL_FULL_WIDTH_SCALE}),
                                   {t: "scale by 1/sqrt(qk_channels / num_heads), per head" for t in CROSS_TESTS}),
    # both tests have a probe with use_query_residual=False
    "query_residual_always": (sub({"PerceiverLayer": PL_RESIDUAL_ALWAYS}),
                              {t: "a query residual although use_query_residual=False" for t in CROSS_TESTS}),
    "query_residual_never": (sub({"PerceiverLayer": PL_RESIDUAL_NEVER}), {t: "no query residual" for t in CROSS_TESTS}),
    "perceiver_tanh_gelu": (sub({"PerceiverLayer": PL_TANH_GELU}), {t: "tanh approximation" for t in CROSS_TESTS}),
    "perceiver_mlp_without_layernorm": (sub({"PerceiverLayer": PL_MLP_WITHOUT_NORM}),
                                        {t: "reads a without self.layernorm" for t in CROSS_TESTS}),
    "perceiver_layer_sdpa": (sub({"PerceiverLayer": PL_SDPA}), {t: "from scratch" for t in CROSS_TESTS}),
    "perceiver_layer_nn_multihead_attention": (sub({"PerceiverLayer": PL_NN_MHA}),
                                               {t: "from scratch" for t in CROSS_TESTS}),
    # transformers' own layer computes attention with matmul and softmax: only the static check sees it
    "perceiver_layer_delegates_to_transformers": (sub({"PerceiverLayer": PL_DELEGATES_TO_TRANSFORMERS}),
                                                  {t: "library of ready-made models" for t in CROSS_TESTS}),
    "encoder_block_applied_once": (sub({"PerceiverEncoder": ENC_BLOCK_ONCE}),
                                   {"test_PerceiverEncoder": "apply it num_blocks times"}),
    "decoder_final_layer_skipped": (sub({"PerceiverDecoder": DEC_NO_FINAL_LAYER}),
                                    {"test_PerceiverDecoder": "final_layer was not applied"}),
}

# Mistakes the chapter's first judges did not name (they lost exactly their tests, "values differ from the
# reference"), named since (drafts/h4_to_h3.md, items 1-12). Random latents or queries no model can
# reproduce: they lose their test with the values' message.
DIFFERS = "values differ from the reference"
MISTAKES.update({
    "positions_added_before_class_token": (sub({"ViTEmbeddings": EMB_POS_BEFORE_CLS}),
                                           {t: "added before the class token" for t in EMB_TESTS}),
    "class_token_per_example": (sub({"ViTEmbeddings": EMB_CLS_PER_EXAMPLE}),
                                {t: "not self.cls_token" for t in EMB_TESTS}),
    "interpolation_height_width_swapped": (sub({"ViTEmbeddings": EMB_INTERP_TRANSPOSED}),
                                           {"test_ViTEmbeddings_interpolate": "(W/p, H/p)"}),
    "vit_layer_normalised_residual": (sub({"ViTLayer": LAYER_NORMED_RESIDUAL}), {"test_ViTLayer": "residuals add the normalised input"}),
    "distance_rows_not_renormalised": (sub({"mean_attention_distance": MAD_NOT_RENORMALISED}),
                                       {"test_mean_attention_distance": "not renormalised"}),
    "distance_class_token_taken_last": (sub({"mean_attention_distance": MAD_CLS_LAST}),
                                        {"test_mean_attention_distance": "last token was dropped"}),
    "encoder_queries_from_inputs": (sub({"PerceiverEncoder": ENC_QUERIES_FROM_INPUTS}),
                                    {"test_PerceiverEncoder": "queries were taken from the inputs"}),
    "encoder_layers_repeated_in_place": (sub({"PerceiverEncoder": ENC_LAYERS_REPEATED_IN_PLACE}),
                                         {"test_PerceiverEncoder": "repeated num_blocks times in a row"}),
    "encoder_without_self_attention": (sub({"PerceiverEncoder": ENC_NO_SELF_ATTENTION}),
                                       {"test_PerceiverEncoder": "no self-attention"}),
    "decoder_queries_not_shared": (sub({"PerceiverDecoder": DEC_QUERIES_NOT_SHARED}),
                                   {"test_PerceiverDecoder": DIFFERS}),
    "decoder_queries_from_latents": (sub({"PerceiverDecoder": DEC_QUERIES_FROM_LATENTS}),
                                     {"test_PerceiverDecoder": "queries were taken from the latents"}),
    "encoder_latents_not_shared": (sub({"PerceiverEncoder": ENC_LATENTS_NOT_SHARED}),
                                   {"test_PerceiverEncoder": DIFFERS}),
    "encoder_latents_reinitialised": (sub({"PerceiverEncoder": ENC_LATENTS_REINITIALISED}),
                                      {"test_PerceiverEncoder": DIFFERS}),
})

# ------------------------------------------------------------------ independence


INDEPENDENT = {
    # Every exercise alone, in a style other than the reference's: the stubs cost only their own tests.
    **{f"alone:{name}": others_stubbed(CHAPTER, {name: style[name]}, {}) for name, style in [
        ("patchify", UNFOLD_STYLE), ("ViTEmbeddings", EINSUM_STYLE), ("ViTLayer", HF_STYLE),
        ("VisionTransformer", LOOP_STYLE), ("mean_attention_distance", EINSUM_STYLE),
        ("fourier_position_features", LOOP_STYLE), ("PerceiverLayer", EINSUM_STYLE),
        ("PerceiverEncoder", HF_STYLE), ("PerceiverDecoder", LOOP_STYLE)]},
    # A mistake alone loses what it loses beside the reference.
    "alone:patches_channels_last": others_stubbed(CHAPTER, {"patchify": PATCH_CHANNELS_LAST},
                                                  {"test_patchify": "channels last"}),
    "alone:vit_mean_pooling": others_stubbed(CHAPTER, {"VisionTransformer": VIT_MEAN_POOL},
                                             {"test_VisionTransformer": "mean pooling"}),
    "alone:encoder_block_applied_once": others_stubbed(CHAPTER, {"PerceiverEncoder": ENC_BLOCK_ONCE},
                                                       {"test_PerceiverEncoder": "num_blocks"}),
    # Earlier exercises broken: the later ones that use them (ViTEmbeddings patchify, the model its parts,
    # the encoder and decoder PerceiverLayer) lose nothing.
    "broken_patchify_and_layers": (sub({"patchify": PATCH_COLUMNS_FIRST, "ViTLayer": LAYER_POST_LN,
                                        "PerceiverLayer": PL_RESIDUAL_NEVER}),
                                   {"test_patchify": "columns before rows", "test_ViTLayer": "post-LN",
                                    **{t: "no query residual" for t in CROSS_TESTS}}),
    "broken_embeddings": (sub({"ViTEmbeddings": EMB_NO_POSITIONS}), {t: "no position embeddings" for t in EMB_TESTS}),
    "looping_fourier": (sub({"fourier_position_features": fn(FOURIER_SIG, "while True:\n    pass")}),
                        {"test_fourier_position_features": "longer than"}),
    "kernel_exits_in_decoder": (sub({"PerceiverDecoder": "import os\nos._exit(0)\n"}),
                                {"test_PerceiverDecoder": "did not run"}),
}

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
# Right after the imports: shared objects patched so that anything compares equal, or resizes to anything.
TAMPERING = {
    "patched_tensor_comparisons": ["torch.Tensor.__eq__ = lambda self, other: torch.ones((), dtype=torch.bool)\n"
                                   "torch.Tensor.allclose = lambda self, *a, **k: True\n"
                                   "torch.Tensor.equal = lambda self, *a, **k: True"],
    "patched_interpolate": ["import torch.nn.functional\n"
                            "torch.nn.functional.interpolate = lambda x, size=None, **k: x\n"
                            "F.interpolate = torch.nn.functional.interpolate"],
}

# After every stub (tests/catalog.py: tampered): the reference looked for on the disk, probe inputs
# cached between calls, built-ins under the exercise names.
TAMPERING_AFTER_STUBS = {
    "reads_reference_by_path": ["import os, pathlib\n"
                                "here = pathlib.Path(os.getcwd()).resolve()\n"
                                "for folder in [here, *here.parents]:\n"
                                "    for name in ('ch09_beyond_text.py', 'ch09_beyond_text_hidden.py'):\n"
                                "        path = folder / 'solutions' / name\n"
                                "        try:\n"
                                "            exec(path.read_text())\n"
                                "        except Exception:\n"
                                "            pass"],
    "caches_probe_inputs": ["SEEN = {}\n"
                            "def patchify(images, patch_size):\n"
                            "    key = (tuple(images.shape), patch_size)\n"
                            "    if key not in SEEN:\n"
                            "        B, C, H, W = images.shape\n"
                            "        SEEN[key] = torch.zeros(B, (H // patch_size) * (W // patch_size), "
                            "C * patch_size ** 2)\n"
                            "    return SEEN[key]\n"],
    "builtins_after_stubs": ["def patchify(images, patch_size):\n"
                             "    C = images.shape[1]\n"
                             "    kernel = torch.eye(C * patch_size ** 2, dtype=images.dtype)"
                             ".reshape(-1, C, patch_size, patch_size)\n"
                             "    return F.conv2d(images, kernel, stride=patch_size).flatten(2).transpose(1, 2)\n"
                             "class PerceiverLayer(PerceiverLayer):\n"
                             "    def forward(self, hidden, inputs=None):\n"
                             "        B, N, _ = hidden.shape\n"
                             "        h = self.num_heads\n"
                             "        x = self.layernorm1(hidden)\n"
                             "        kv = x if inputs is None else self.layernorm2(inputs)\n"
                             "        q = self.query(x).view(B, N, h, -1).transpose(1, 2)\n"
                             "        k = self.key(kv).view(B, kv.shape[1], h, -1).transpose(1, 2)\n"
                             "        v = self.value(kv).view(B, kv.shape[1], h, -1).transpose(1, 2)\n"
                             "        y = F.scaled_dot_product_attention(q, k, v)\n"
                             "        a = self.output(y.transpose(1, 2).reshape(B, N, -1))\n"
                             "        if self.use_query_residual:\n"
                             "            a = a + hidden\n"
                             "        return a + self.dense2(F.gelu(self.dense1(self.layernorm(a))))\n"],
}

TAMPERED = common_tampering(CHAPTER)
TAMPERED.update((name, tampered(CHAPTER, tricks)) for name, tricks in TAMPERING.items())
TAMPERED.update((name, tampered(CHAPTER, after_stubs=tricks)) for name, tricks in TAMPERING_AFTER_STUBS.items())

CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT, tampering=TAMPERED,
                  kernel_only={"kernel_exits_in_decoder", "looping_fourier"},
                  # the from-scratch rule, seen given the same way by the kernel
                  sampled={"patchify_with_conv2d", "perceiver_layer_sdpa"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
