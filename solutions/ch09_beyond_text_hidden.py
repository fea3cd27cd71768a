"""Hidden tests (instructor-only) for chapter 09_beyond_text.

generated from course/09_beyond_text.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn.functional as F

import solutions.ch09_beyond_text as ref
from autograder.hidden import HiddenTests, Mistake, close

hidden = HiddenTests(ref, from_scratch={"patchify", "PerceiverLayer"})


def _patches_in_order(order):
    """patchify with the axes of (B, C, gh, p, gw, p) brought into ``order`` before flattening."""
    def compute(images, patch_size):
        B, C, H, W = images.shape
        p = patch_size
        x = images.reshape(B, C, H // p, p, W // p, p).permute(*order)
        return x.reshape(B, (H // p) * (W // p), C * p * p)
    return compute


PATCHIFY_MISTAKES = [
    Mistake("the features of a patch are channels last: the order is (channel, row in the patch, column in the "
            "patch), as a Conv2d weight (D, C, p, p) reads them", _patches_in_order((0, 2, 4, 3, 5, 1))),
    Mistake("the patches are numbered columns before rows: patch n = r * (W/p) + c, left to right along a row "
            "of patches, then the next row", _patches_in_order((0, 4, 2, 1, 3, 5))),
    Mistake("inside a patch, columns come before rows: the features are (channel, row, column)",
            _patches_in_order((0, 2, 4, 1, 5, 3))),
    Mistake("the patches are numbered columns before rows and their features are channels last",
            _patches_in_order((0, 4, 2, 3, 5, 1))),
]


@hidden.test("test_patchify")
def _(t):
    P = dict(mistakes=PATCHIFY_MISTAKES)
    t.function("patchify", t.randn(2, 3, 8, 8), 4, label="(2, 3, 8, 8), p=4", **P)
    t.function("patchify", t.randn(1, 2, 6, 10), 2, label="(1, 2, 6, 10), p=2: more columns than rows", **P)
    t.function("patchify", t.randn(3, 1, 9, 6), 3, label="(3, 1, 9, 6), p=3: one channel", **P)
    t.function("patchify", t.randn(2, 3, 4, 4), 1, label="p=1: every pixel a token", **P)
    t.function("patchify", t.randn(2, 2, 4, 8, dtype=torch.float64), 4, label="float64", **P)
    t.function("patchify", t.randn(2, 3, 4, 6), 2, grad=True, label="gradients", **P)


def _embed(m, images, interpolate_pos_encoding=False, cls=None, positions=None, refuse=True):
    """The reference forward of ViTEmbeddings, with its steps replaceable: ``cls(m, B)`` the class tokens,
    ``positions(m, gh, gw)`` the (1, 1 + N', d) table to add; ``refuse`` raise on other sizes."""
    B, _, H, W = images.shape
    p = m.patch_size
    if refuse and not interpolate_pos_encoding and (H, W) != (m.image_size, m.image_size):
        raise ValueError("image size differs")
    x = m.projection(ref.patchify(images, p))
    c = m.cls_token.expand(B, -1, -1) if cls is None else cls(m, B)
    x = torch.cat([c, x], dim=1)
    pos = (_bicubic_grid if positions is None else positions)(m, H // p, W // p)
    return x + pos


def _bicubic_grid(m, gh, gw, mode="bicubic", align_corners=False, swap=False, channels_as_grid=False):
    pos = m.position_embeddings
    g = m.image_size // m.patch_size
    if (gh, gw) == (g, g):
        return pos
    d = pos.size(-1)
    grid = pos[:, 1:].reshape(1, d, g, g) if channels_as_grid else pos[:, 1:].reshape(1, g, g, d).permute(0, 3, 1, 2)
    size = (gw, gh) if swap else (gh, gw)
    grid = F.interpolate(grid, size=size, mode=mode, align_corners=align_corners)
    return torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, d)], dim=1)


def _embed_with(**wrong):
    return lambda m, images, interpolate_pos_encoding=False: _embed(m, images, interpolate_pos_encoding, **wrong)


def _positions_before_cls(m, images, interpolate_pos_encoding=False):
    """Positions (interpolated where the size asks for it) added to the patches only, then the class token
    prepended (it gets no position)."""
    B, _, H, W = images.shape
    p = m.patch_size
    x = m.projection(ref.patchify(images, p)) + _bicubic_grid(m, H // p, W // p)[:, 1:]
    return torch.cat([m.cls_token.expand(B, -1, -1), x], dim=1)


def _positions_before_cls_shifted(m, images, interpolate_pos_encoding=False):
    """The first N rows of the table added to the patches, then the class token prepended."""
    B = images.shape[0]
    x = m.projection(ref.patchify(images, m.patch_size)) + m.position_embeddings[:, :-1]
    return torch.cat([m.cls_token.expand(B, -1, -1), x], dim=1)


def _no_positions(m, gh, gw):
    return torch.zeros_like(m.position_embeddings[:, :1])


def _cls_zeros(m, B):
    """A class token made in forward (zeros) instead of the parameter self.cls_token."""
    return torch.zeros(B, 1, m.cls_token.size(-1), dtype=m.cls_token.dtype)


def _same_rows_hint(what, fix):
    """A check for a batch of identical examples: their outputs must be identical too."""
    def check(probe, value):
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.size(0) > 1 and value.is_floating_point():
            if not torch.allclose(value, value[:1].expand_as(value), atol=1e-5, rtol=1e-4):
                return f"identical examples in the batch got different {what}: {fix}"
        return None
    return check


CLS_SHARED = _same_rows_hint("outputs", "one self.cls_token, the same for every image (expand it to (B, 1, d))")


def _cls_per_example(m, B):
    """A class token that differs from example to example (e.g. a fresh one per example)."""
    return m.cls_token + 0.5 * torch.arange(B, dtype=m.cls_token.dtype)[:, None, None]


def _resize_whole_table(m, gh, gw):
    """The whole table, class token included, resized as a sequence to 1 + N' rows."""
    pos = m.position_embeddings
    g = m.image_size // m.patch_size
    if (gh, gw) == (g, g):
        return pos
    return F.interpolate(pos.transpose(1, 2), size=1 + gh * gw, mode="linear", align_corners=False).transpose(1, 2)


def _resize_with_cls_in_grid(m, gh, gw):
    """The class token's embedding resized too: the first row of a (1 + N)-row table put into the grid."""
    pos = m.position_embeddings
    g = m.image_size // m.patch_size
    if (gh, gw) == (g, g):
        return pos
    d = pos.size(-1)
    grid = F.interpolate(pos[:, :-1].reshape(1, g, g, d).permute(0, 3, 1, 2), size=(gh, gw), mode="bicubic",
                         align_corners=False)
    return torch.cat([pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, d)], dim=1)


def _grid_with(**options):
    return lambda m, gh, gw: _bicubic_grid(m, gh, gw, **options)


EMBED_MISTAKES = [
    Mistake("the position embeddings were added before the class token was prepended: the class token gets "
            "none; prepend it first, then add all 1 + N rows (the class token takes position 0)",
            _positions_before_cls),
    Mistake("the position embeddings were added before the class token was prepended: add the table to all "
            "1 + N tokens after prepending it", _positions_before_cls_shifted),
    Mistake("no position embeddings were added: add self.position_embeddings to the 1 + N tokens",
            _embed_with(positions=_no_positions)),
    Mistake("the class token is not shared by the batch: every image gets the same self.cls_token "
            "(expand it to (B, 1, d))", _embed_with(cls=_cls_per_example)),
    Mistake("the class token is not self.cls_token: prepend the learned parameter (expanded to (B, 1, d)), not "
            "a tensor made in forward", _embed_with(cls=_cls_zeros)),
]
INTERPOLATE_MISTAKES = [
    Mistake("the position table was resized as a sequence, class token included: keep row 0 (the class token's) "
            "and resize the N patch rows as a (g, g) grid", _embed_with(positions=_resize_whole_table)),
    Mistake("the class token's embedding was resized with the grid: keep row 0 as it is and resize rows 1..N",
            _embed_with(positions=_resize_with_cls_in_grid)),
    Mistake("the interpolation ran over the wrong axes: reshape rows 1..N to (1, g, g, d) and permute to "
            "(1, d, g, g) before F.interpolate (a reshape straight to (1, d, g, g) mixes features and positions)",
            _embed_with(positions=_grid_with(channels_as_grid=True))),
    Mistake("the grid was resized to (W/p, H/p): the size is (rows, columns) = (H/p, W/p)",
            _embed_with(positions=_grid_with(swap=True))),
    Mistake("bilinear interpolation: the spec (and transformers) use mode=\"bicubic\"",
            _embed_with(positions=_grid_with(mode="bilinear"))),
    Mistake("align_corners=True: the spec (and transformers) use align_corners=False",
            _embed_with(positions=_grid_with(align_corners=True))),
]
EMB_INIT = dict(image_size=8, patch_size=2, in_channels=1, d_model=6)


@hidden.test("test_ViTEmbeddings")
def _(t):
    E = dict(mistakes=EMBED_MISTAKES, deps=("patchify",))
    t.module("ViTEmbeddings", EMB_INIT, t.randn(3, 1, 8, 8), label="(3, 1, 8, 8), p=2", **E)
    t.module("ViTEmbeddings", dict(image_size=12, patch_size=4, in_channels=3, d_model=5), t.randn(2, 3, 12, 12),
             label="3 channels, p=4", **E)
    t.module("ViTEmbeddings", dict(image_size=4, patch_size=1, in_channels=2, d_model=3), t.randn(1, 2, 4, 4),
             label="p=1, one image", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(2, 1, 8, 8, dtype=torch.float64), dtype=torch.float64,
             label="float64", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(2, 1, 8, 8), grad=True, label="gradients", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(1, 1, 8, 8).expand(3, 1, 8, 8).clone(), checks=(CLS_SHARED,),
             label="a batch of 3 identical images", **E)
    state = {n: t.randn(*p.shape) * 0.5 for n, p in ref.ViTEmbeddings(**EMB_INIT).named_parameters()}
    refuse = [Mistake("an image of another size was accepted without interpolate_pos_encoding=True: raise "
                      "ValueError", lambda init, state, images: torch.tensor(0.0))]
    for shape, what in [((1, 1, 12, 12), "12x12"), ((2, 1, 8, 16), "8x16"), ((1, 1, 4, 4), "4x4")]:
        t.function("refuses_other_sizes", EMB_INIT, state, t.randn(*shape), mistakes=refuse, deps=("patchify",),
                   label=f"a {what} image without interpolation must raise ValueError")


@hidden.test("test_ViTEmbeddings_interpolate")
def _(t):
    E = dict(mistakes=INTERPOLATE_MISTAKES + EMBED_MISTAKES, deps=("patchify",))
    t.module("ViTEmbeddings", EMB_INIT, t.randn(2, 1, 12, 12), interpolate_pos_encoding=True,
             label="12x12 on a model of 8x8, p=2", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(2, 1, 8, 16), interpolate_pos_encoding=True,
             label="8x16 on a model of 8x8 (a non-square grid)", **E)
    t.module("ViTEmbeddings", dict(image_size=12, patch_size=4, in_channels=2, d_model=4), t.randn(1, 2, 16, 8),
             interpolate_pos_encoding=True, label="16x8 on a model of 12x12, p=4", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(2, 1, 8, 8), interpolate_pos_encoding=True,
             label="the trained size with interpolate_pos_encoding=True: nothing is resized", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(2, 1, 4, 12, dtype=torch.float64), interpolate_pos_encoding=True,
             dtype=torch.float64, label="4x12, float64", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(1, 1, 12, 8), interpolate_pos_encoding=True, grad=True,
             label="12x8, gradients", **E)
    t.module("ViTEmbeddings", EMB_INIT, t.randn(1, 1, 12, 12).expand(2, 1, 12, 12).clone(),
             interpolate_pos_encoding=True, checks=(CLS_SHARED,), label="2 identical 12x12 images", **E)


def _layer(m, x, order="pre", act=F.gelu, residual=True, swap_norms=False):
    ln1, ln2 = (m.layernorm_after, m.layernorm_before) if swap_norms else (m.layernorm_before, m.layernorm_after)
    mlp = lambda z: m.fc2(act(m.fc1(z)))  # noqa: E731
    if order == "post":
        h = ln1(x + m.attention(x))
        return ln2(h + mlp(h))
    h = (x if residual else 0) + m.attention(ln1(x))
    return h + mlp(ln2(h))


def _layer_with(**wrong):
    return lambda m, x: _layer(m, x, **wrong)


def _layer_residual_of_normed(m, x):
    """Both residuals add the normalised input instead of the stream itself."""
    z = m.layernorm_before(x)
    h = z + m.attention(z)
    u = m.layernorm_after(h)
    return u + m.fc2(F.gelu(m.fc1(u)))


def _layer_attention_residual_of_normed(m, x):
    z = m.layernorm_before(x)
    h = z + m.attention(z)
    return h + m.fc2(F.gelu(m.fc1(m.layernorm_after(h))))


def _layer_mlp_on_x(m, x):
    """The MLP reads x instead of the attention's output h."""
    h = x + m.attention(m.layernorm_before(x))
    return h + m.fc2(F.gelu(m.fc1(m.layernorm_after(x))))


LAYER_MISTAKES = [
    Mistake("post-LN (normalise after adding each residual): ViT is pre-LN, h = x + attention(layernorm_before(x))",
            _layer_with(order="post")),
    Mistake("the tanh approximation of GELU: ViT uses the exact (erf) GELU, F.gelu(x) with approximate='none'",
            _layer_with(act=lambda z: F.gelu(z, approximate="tanh"))),
    Mistake("ReLU where ViT uses the exact GELU", _layer_with(act=F.relu)),
    Mistake("the residual around the attention is missing: h = x + attention(layernorm_before(x))",
            _layer_with(residual=False)),
    Mistake("layernorm_before and layernorm_after swapped: layernorm_before goes before the attention",
            _layer_with(swap_norms=True)),
    Mistake("the MLP reads x: it reads layernorm_after(h), h the output of the attention's residual",
            _layer_mlp_on_x),
    Mistake("the residuals add the normalised input: pre-LN adds the un-normalised stream, "
            "h = x + attention(layernorm_before(x))", _layer_attention_residual_of_normed),
    Mistake("the residuals add the normalised inputs: pre-LN adds the un-normalised stream, "
            "h = x + attention(layernorm_before(x)), then h + mlp(layernorm_after(h))", _layer_residual_of_normed),
]


@hidden.test("test_ViTLayer")
def _(t):
    L = dict(mistakes=LAYER_MISTAKES)
    t.module("ViTLayer", dict(d_model=8, num_heads=2, d_ff=16), t.randn(2, 5, 8) * 2, label="(2, 5, 8), 2 heads", **L)
    t.module("ViTLayer", dict(d_model=12, num_heads=3, d_ff=8), t.randn(1, 17, 12), label="17 tokens, 3 heads", **L)
    t.module("ViTLayer", dict(d_model=6, num_heads=1, d_ff=12, eps=0.5), t.randn(3, 4, 6), label="eps=0.5", **L)
    t.module("ViTLayer", dict(d_model=8, num_heads=4, d_ff=16), t.randn(2, 5, 8, dtype=torch.float64),
             dtype=torch.float64, label="float64", **L)
    t.module("ViTLayer", dict(d_model=8, num_heads=2, d_ff=8), t.randn(2, 3, 8), grad=True, label="gradients", **L)


def _vit(m, images, interpolate_pos_encoding=False, pool="cls", final_norm=True, layers=None, pass_flag=True):
    x = m.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding and pass_flag)
    for layer in (m.layers if layers is None else layers(m)):
        x = layer(x)
    if final_norm:
        x = m.layernorm(x)
    pooled = {"cls": lambda z: z[:, 0], "mean": lambda z: z.mean(1), "patch_mean": lambda z: z[:, 1:].mean(1),
              "last": lambda z: z[:, -1]}[pool](x)
    return m.classifier(pooled)


def _vit_with(**wrong):
    return lambda m, images, interpolate_pos_encoding=False: _vit(m, images, interpolate_pos_encoding, **wrong)


def _vit_norm_after_pool(m, images, interpolate_pos_encoding=False):
    """The final layernorm over the mean of the tokens."""
    x = m.embeddings(images, interpolate_pos_encoding=interpolate_pos_encoding)
    for layer in m.layers:
        x = layer(x)
    return m.classifier(m.layernorm(x.mean(1)))


VIT_MISTAKES = [
    Mistake("mean pooling over all tokens: ViT's classifier reads the class token's output (position 0) only",
            _vit_with(pool="mean")),
    Mistake("mean pooling over the patch tokens: ViT's classifier reads the class token's output (position 0)",
            _vit_with(pool="patch_mean")),
    Mistake("mean pooling: ViT's classifier reads the class token's output (position 0)", _vit_norm_after_pool),
    Mistake("the last token was read: the class token is token 0", _vit_with(pool="last")),
    Mistake("the final layernorm was skipped: pre-LN leaves the last layer's output un-normalised, "
            "apply self.layernorm before the classifier", _vit_with(final_norm=False)),
    Mistake("only the first layer was applied: run the tokens through every layer in order",
            _vit_with(layers=lambda m: m.layers[:1])),
    Mistake("the layers ran in reverse order", _vit_with(layers=lambda m: list(m.layers)[::-1])),
]
VIT_INIT = dict(image_size=8, patch_size=2, in_channels=1, num_classes=4, d_model=8, num_layers=2, num_heads=2,
                d_ff=16)


@hidden.test("test_VisionTransformer")
def _(t):
    V = dict(mistakes=VIT_MISTAKES, deps=("patchify", "ViTEmbeddings", "ViTLayer"))
    t.module("VisionTransformer", VIT_INIT, t.randn(3, 1, 8, 8), label="2 layers, p=2", **V)
    t.module("VisionTransformer", dict(VIT_INIT, num_layers=3, patch_size=4, in_channels=2, num_classes=5),
             t.randn(2, 2, 8, 8), label="3 layers, 2 channels, p=4", **V)
    t.module("VisionTransformer", dict(VIT_INIT, eps=0.3), t.randn(2, 1, 8, 8), label="eps=0.3", **V)
    t.module("VisionTransformer", VIT_INIT, t.randn(2, 1, 12, 8), interpolate_pos_encoding=True,
             mistakes=VIT_MISTAKES + [Mistake("interpolate_pos_encoding was not passed on to self.embeddings",
                                               _vit_with(pass_flag=False))],
             deps=V["deps"], label="a 12x8 image, interpolate_pos_encoding=True")
    t.module("VisionTransformer", VIT_INIT, t.randn(2, 1, 8, 8, dtype=torch.float64), dtype=torch.float64,
             label="float64", **V)
    t.module("VisionTransformer", dict(VIT_INIT, num_layers=1), t.randn(2, 1, 8, 8), grad=True,
             label="gradients", **V)


def _distance(attn, grid_size, patch_size, unit=True, drop="first", renorm=True, layout="rows", metric=2,
              reduce="mean"):
    gh, gw = grid_size
    w = attn[..., 1:, 1:] if drop == "first" else attn[..., :-1, :-1]
    if renorm:
        w = w / w.sum(-1, keepdim=True)
    if layout == "rows":
        rows, cols = torch.arange(gh).repeat_interleave(gw), torch.arange(gw).repeat(gh)
    else:                                          # columns first: patch n at row n % gh, column n // gh
        rows, cols = torch.arange(gh).repeat(gw), torch.arange(gw).repeat_interleave(gh)
    centres = torch.stack([rows, cols], -1).to(attn.dtype) * (patch_size if unit else 1)
    d = (w * torch.cdist(centres, centres, p=metric)).sum(-1)
    return d.mean(dim=(0, 2)) if reduce == "mean" else d.sum(dim=(0, 2))


def _distance_with(**wrong):
    return lambda attn, grid_size, patch_size: _distance(attn, grid_size, patch_size, **wrong)


DISTANCE_MISTAKES = [
    Mistake("distances in patches: the spec asks for pixels, patch_size pixels per patch step",
            _distance_with(unit=False)),
    Mistake("the rows were not renormalised after dropping the class token (or, the same numbers, its weight "
            "was kept at distance 0): drop its row and column, then divide each row by its sum over the N patches",
            _distance_with(renorm=False)),
    Mistake("the last token was dropped: the class token is token 0", _distance_with(drop="last")),
    Mistake("the patches were laid out column by column: patch n is at row n // gw, column n % gw",
            _distance_with(layout="columns")),
    Mistake("Manhattan distance: the spec asks for the Euclidean distance between patch centres",
            _distance_with(metric=1)),
    Mistake("summed over queries and images instead of averaged", _distance_with(reduce="sum")),
]


def _attention_weights(t, B, H, N, dtype=torch.float32, cls_heavy=False):
    scores = t.randn(B, H, 1 + N, 1 + N, dtype=torch.float64) * 2
    if cls_heavy:
        scores[..., 0] += 2.0
    return scores.softmax(-1).to(dtype)


@hidden.test("test_mean_attention_distance")
def _(t):
    D = dict(mistakes=DISTANCE_MISTAKES)
    t.function("mean_attention_distance", _attention_weights(t, 2, 3, 16), (4, 4), 2, label="a 4x4 grid, p=2", **D)
    t.function("mean_attention_distance", _attention_weights(t, 3, 2, 6, cls_heavy=True), (2, 3), 4,
               label="a 2x3 grid, much weight on the class token", **D)
    t.function("mean_attention_distance", _attention_weights(t, 1, 4, 12), (4, 3), 3, label="a 4x3 grid, p=3", **D)
    t.function("mean_attention_distance", _attention_weights(t, 2, 2, 9, torch.float64), (3, 3), 1,
               label="float64", **D)


def _fourier(index_dims, num_bands, max_resolution=None, raw=True, top=0.5, interleave=False, k_major=False,
             pi=True, grid=(-1.0, 1.0), indexing="ij"):
    index_dims = tuple(index_dims)
    resolution = index_dims if max_resolution is None else tuple(max_resolution)
    axes = [torch.linspace(grid[0], grid[1], n) for n in index_dims]
    pos = torch.stack(torch.meshgrid(*axes, indexing=indexing), dim=-1).reshape(-1, len(index_dims))
    freqs = torch.stack([torch.linspace(1.0, r * top, num_bands) for r in resolution])
    angles = pos[:, :, None] * freqs[None] * (math.pi if pi else 1.0)       # (M, D, K)
    if k_major:
        angles = angles.transpose(1, 2)
    angles = angles.reshape(pos.size(0), -1)
    if interleave:
        waves = torch.stack([torch.sin(angles), torch.cos(angles)], -1).reshape(pos.size(0), -1)
    else:
        waves = torch.cat([torch.sin(angles), torch.cos(angles)], -1)
    return torch.cat([pos, waves], -1) if raw else waves


def _fourier_with(**wrong):
    return lambda index_dims, num_bands, max_resolution=None: _fourier(index_dims, num_bands, max_resolution,
                                                                       **wrong)


FOURIER_MISTAKES = [
    Mistake("the raw coordinates are missing: the features start with x_1 .. x_D (concat_pos=True)",
            _fourier_with(raw=False)),
    Mistake("the frequencies go up to r instead of r / 2: linspace(1, r_d / 2, num_bands)", _fourier_with(top=1.0)),
    Mistake("sin and cos interleaved: all the sines (d then k), then all the cosines", _fourier_with(interleave=True)),
    Mistake("the frequencies are ordered k then d: d is the slower index (all bands of x_1, then of x_2)",
            _fourier_with(k_major=True)),
    Mistake("the angles are f x without pi: sin(pi f_{d,k} x_d)", _fourier_with(pi=False)),
    Mistake("positions in [0, 1]: the grid is linspace(-1, 1, n_d)", _fourier_with(grid=(0.0, 1.0))),
    Mistake("points in column-major order (indexing='xy'): use torch.meshgrid(..., indexing='ij')",
            _fourier_with(indexing="xy")),
    Mistake("max_resolution was ignored: the frequencies go up to max_resolution / 2 when it is given",
            lambda index_dims, num_bands, max_resolution=None: _fourier(index_dims, num_bands, None)),
]


@hidden.test("test_fourier_position_features")
def _(t):
    R = dict(mistakes=FOURIER_MISTAKES)
    t.function("fourier_position_features", (4, 6), 3, label="a 4x6 grid, 3 bands", **R)
    t.function("fourier_position_features", (5, 3), 4, label="a 5x3 grid, 4 bands", **R)
    t.function("fourier_position_features", (7,), 5, label="1-D, 7 points", **R)
    t.function("fourier_position_features", (3, 4), 2, max_resolution=(10, 6), label="max_resolution=(10, 6)", **R)
    t.function("fourier_position_features", (2, 3, 4), 2, label="3-D", **R)


def _perceiver(m, hidden, inputs=None, queries_from="hidden", keys_from="inputs", scale="head", residual="flag",
               act=F.gelu, heads="first", mlp_norm=True, kv_norm=True):
    B, N, _ = hidden.shape
    h = m.num_heads
    q_in = m.layernorm1(hidden)
    if inputs is None:
        kv_in = q_in
    else:
        kv_in = m.layernorm2(inputs) if kv_norm else inputs
    q_src = kv_in if (queries_from == "inputs" and inputs is not None) else q_in
    k_src = q_in if (keys_from == "hidden" and inputs is not None) else kv_in
    q, k, v = m.query(q_src), m.key(k_src), m.value(kv_in)

    def split(x):
        if heads == "first":
            return x.view(B, x.size(1), h, -1).transpose(1, 2)
        return x.view(B, x.size(1), -1, h).permute(0, 3, 1, 2)        # head i takes every h-th feature
    q, k, v = split(q), split(k), split(v)
    c = q.size(-1)
    s = q @ k.transpose(-2, -1) / {"head": math.sqrt(c), "full": math.sqrt(c * h), "none": 1.0}[scale]
    o = s.softmax(-1) @ v
    o = o.transpose(1, 2).reshape(B, o.size(2), -1) if heads == "first" else o.permute(0, 2, 3, 1).reshape(
        B, o.size(2), -1)
    a = m.output(o)
    if residual == "flag" and m.use_query_residual or residual == "always":
        a = a + hidden
    elif residual == "normed" and m.use_query_residual:
        a = a + q_in
    return a + m.dense2(act(m.dense1(m.layernorm(a) if mlp_norm else a)))


def _perceiver_with(**wrong):
    return lambda m, hidden, inputs=None: _perceiver(m, hidden, inputs, **wrong)


PERCEIVER_MISTAKES = [
    Mistake("the queries were taken from the inputs: in cross-attention the queries come from hidden (the "
            "latents), keys and values from the inputs", _perceiver_with(queries_from="inputs")),
    Mistake("the keys were taken from hidden in cross-attention: keys and values both come from "
            "layernorm2(inputs)", _perceiver_with(keys_from="hidden")),
    Mistake("scores scaled by 1/sqrt(qk_channels): scale by 1/sqrt(qk_channels / num_heads), per head",
            _perceiver_with(scale="full")),
    Mistake("scores not scaled: divide by sqrt(qk_channels / num_heads)", _perceiver_with(scale="none")),
    Mistake("no query residual: with use_query_residual=True, a = output(attention) + hidden",
            _perceiver_with(residual="never")),
    Mistake("a query residual although use_query_residual=False: add hidden only when self.use_query_residual",
            _perceiver_with(residual="always")),
    Mistake("the residual added the normalised queries: add hidden itself, before layernorm1",
            _perceiver_with(residual="normed")),
    Mistake("the tanh approximation of GELU: Perceiver's MLP uses the exact (erf) GELU",
            _perceiver_with(act=lambda z: F.gelu(z, approximate="tanh"))),
    Mistake("the heads were split feature by feature: head i uses features i*c:(i+1)*c of each projection",
            _perceiver_with(heads="strided")),
    Mistake("the MLP reads a without self.layernorm: a + dense2(gelu(dense1(layernorm(a))))",
            _perceiver_with(mlp_norm=False)),
    Mistake("layernorm2 was not applied to the inputs: keys and values come from layernorm2(inputs)",
            _perceiver_with(kv_norm=False)),
]
PL = dict(mistakes=PERCEIVER_MISTAKES)


@hidden.test("test_PerceiverLayer_cross")
def _(t):
    cross = dict(is_cross_attention=True)
    t.module("PerceiverLayer", dict(q_dim=8, kv_dim=6, num_heads=2, **cross), t.randn(2, 3, 8), t.randn(2, 7, 6),
             label="8 -> 6, 2 heads", **PL)
    t.module("PerceiverLayer", dict(q_dim=6, kv_dim=6, num_heads=3, qk_channels=12, v_channels=9, **cross),
             t.randn(2, 4, 6), t.randn(2, 5, 6), label="equal widths, qk_channels=12, v_channels=9, 3 heads", **PL)
    t.module("PerceiverLayer", dict(q_dim=8, kv_dim=8, num_heads=2, qk_channels=8, widening_factor=3, **cross),
             t.randn(1, 2, 8), inputs=t.randn(1, 9, 8), label="widening_factor=3, inputs as a keyword", **PL)
    t.module("PerceiverLayer", dict(q_dim=6, kv_dim=4, num_heads=1, use_query_residual=False, **cross),
             t.randn(3, 4, 6), t.randn(3, 6, 4), label="use_query_residual=False", **PL)
    t.module("PerceiverLayer", dict(q_dim=4, kv_dim=4, num_heads=2, eps=0.5, **cross), t.randn(2, 3, 4),
             t.randn(2, 5, 4), label="eps=0.5", **PL)
    t.module("PerceiverLayer", dict(q_dim=8, kv_dim=6, num_heads=2, **cross), t.randn(2, 3, 8, dtype=torch.float64),
             t.randn(2, 7, 6, dtype=torch.float64), dtype=torch.float64, label="float64", **PL)
    t.module("PerceiverLayer", dict(q_dim=6, kv_dim=4, num_heads=2, qk_channels=4, **cross), t.randn(2, 3, 6),
             t.randn(2, 5, 4), grad=True, label="gradients", **PL)


@hidden.test("test_PerceiverLayer_self")
def _(t):
    t.module("PerceiverLayer", dict(q_dim=8, kv_dim=8, num_heads=2), t.randn(2, 5, 8), label="8 wide, 2 heads", **PL)
    t.module("PerceiverLayer", dict(q_dim=6, kv_dim=6, num_heads=3, qk_channels=12, v_channels=6, widening_factor=2),
             t.randn(1, 4, 6), label="qk_channels=12, v_channels=6, widening_factor=2", **PL)
    t.module("PerceiverLayer", dict(q_dim=4, kv_dim=4, num_heads=1, use_query_residual=False, eps=0.3),
             t.randn(3, 3, 4), label="use_query_residual=False, eps=0.3", **PL)
    t.module("PerceiverLayer", dict(q_dim=8, kv_dim=8, num_heads=4), t.randn(2, 3, 8), grad=True,
             label="gradients", **PL)


def _encode(m, inputs, latents=None, blocks=None, order=1, cross=True):
    z = (m.latents.expand(inputs.size(0), -1, -1) if latents is None else latents(m, inputs))
    if cross:
        z = m.cross_attention(z, inputs)
    for _ in range(m.num_blocks if blocks is None else blocks(m)):
        for layer in list(m.self_attends)[::order]:
            z = layer(z)
    return z


def _encode_with(**wrong):
    return lambda m, inputs: _encode(m, inputs, **wrong)


def _latents_per_example(m, inputs):
    """A latent array that differs from example to example."""
    z = m.latents
    return z + 0.5 * torch.arange(inputs.size(0), dtype=z.dtype)[:, None, None] * torch.linspace(-1, 1, z.size(-1),
                                                                                               dtype=z.dtype)


def _encode_cross_every_block(m, inputs):
    z = m.latents.expand(inputs.size(0), -1, -1)
    for _ in range(m.num_blocks):
        z = m.cross_attention(z, inputs)
        for layer in m.self_attends:
            z = layer(z)
    return z


def _encode_each_layer_repeated(m, inputs):
    z = m.cross_attention(m.latents.expand(inputs.size(0), -1, -1), inputs)
    for layer in m.self_attends:
        for _ in range(m.num_blocks):
            z = layer(z)
    return z


def _encode_swapped(m, inputs):
    """cross_attention(inputs, latents): the inputs as queries."""
    z = m.cross_attention(inputs, m.latents.expand(inputs.size(0), -1, -1))
    for _ in range(m.num_blocks):
        for layer in m.self_attends:
            z = layer(z)
    return z


LATENTS_SHARED = _same_rows_hint("latents", "one self.latents array, the same for every example and every call "
                                 "(expand it to (B, N, d_latents); never make new values in forward)")
QUERIES_SHARED = _same_rows_hint("outputs", "one self.output_queries, the same for every example (expand it to "
                                 "(B, num_outputs, query_dim))")


ENCODER_MISTAKES = [
    Mistake("the latent array is not shared across the batch: every example starts from the same self.latents "
            "(expand it to (B, N, d_latents))", _encode_with(latents=_latents_per_example)),
    Mistake("the self-attention block was applied once: apply it num_blocks times", _encode_with(blocks=lambda m: 1)),
    Mistake("each layer was repeated num_blocks times in a row: the block as a whole repeats (layer 1, layer 2, "
            "layer 1, layer 2, ...)", _encode_each_layer_repeated),
    Mistake("no self-attention: after the cross-attention, apply the self_attends block num_blocks times",
            _encode_with(blocks=lambda m: 0)),
    Mistake("the queries were taken from the inputs: the latents are the queries of the cross-attention, "
            "cross_attention(latents, inputs)", _encode_swapped),
    Mistake("the self-attention layers ran in reverse order", _encode_with(order=-1)),
    Mistake("the cross-attention was skipped: the latents first cross-attend to the inputs",
            _encode_with(cross=False)),
    Mistake("the cross-attention was repeated in every block: it runs once, before the blocks",
            _encode_cross_every_block),
]
ENC = dict(mistakes=ENCODER_MISTAKES, deps=("PerceiverLayer",))


@hidden.test("test_PerceiverEncoder")
def _(t):
    t.module("PerceiverEncoder", dict(input_dim=6, num_latents=3, d_latents=6, num_blocks=2), t.randn(2, 7, 6),
             label="3 latents of the inputs' width, 7 inputs, num_blocks=2", **ENC)
    t.module("PerceiverEncoder", dict(input_dim=6, num_latents=4, d_latents=8), t.randn(2, 9, 6),
             label="4 latents, 9 inputs", **ENC)
    t.module("PerceiverEncoder", dict(input_dim=5, num_latents=3, d_latents=6, num_blocks=3,
                                      num_self_attends_per_block=2, num_cross_attention_heads=5,
                                      num_self_attention_heads=3), t.randn(2, 7, 5),
             label="num_blocks=3, 2 layers per block, 5 and 3 heads", **ENC)
    same = t.randn(1, 6, 4).expand(3, 6, 4).clone()
    t.module("PerceiverEncoder", dict(input_dim=4, num_latents=5, d_latents=4, num_blocks=2), same,
             label="a batch of 3 identical examples: the one latent array is shared by the batch",
             checks=(LATENTS_SHARED,), **ENC)
    t.module("PerceiverEncoder", dict(input_dim=4, num_latents=2, d_latents=4, num_blocks=2,
                                      num_self_attends_per_block=3), t.randn(1, 12, 4, dtype=torch.float64),
             dtype=torch.float64, label="float64, 3 layers per block", **ENC)
    t.module("PerceiverEncoder", dict(input_dim=4, num_latents=3, d_latents=4), t.randn(2, 5, 4), grad=True,
             label="gradients", **ENC)


def _decode(m, latents, queries=None, final=True, swap=False):
    q = m.output_queries.expand(latents.size(0), -1, -1) if queries is None else queries(m, latents)
    y = m.decoding_cross_attention(latents, q) if swap else m.decoding_cross_attention(q, latents)
    return m.final_layer(y) if final else y


def _decode_with(**wrong):
    return lambda m, latents: _decode(m, latents, **wrong)


def _queries_per_example(m, latents):
    q = m.output_queries
    return q + 0.5 * torch.arange(latents.size(0), dtype=q.dtype)[:, None, None] * torch.linspace(-1, 1, q.size(-1),
                                                                                                dtype=q.dtype)


DECODER_MISTAKES = [
    Mistake("the output queries are not shared by the batch: every example uses the same self.output_queries",
            _decode_with(queries=_queries_per_example)),
    Mistake("final_layer was not applied", _decode_with(final=False)),
    Mistake("the queries were taken from the latents: the output queries cross-attend to the latents, "
            "decoding_cross_attention(output_queries, latents)", _decode_with(queries=lambda m, z: z)),
]
DEC = dict(mistakes=DECODER_MISTAKES, deps=("PerceiverLayer",))


@hidden.test("test_PerceiverDecoder")
def _(t):
    t.module("PerceiverDecoder", dict(d_latents=6, num_outputs=2, query_dim=6, output_dim=3), t.randn(2, 5, 6),
             label="queries of the latents' width, 2 outputs from 5 latents", **DEC)
    t.module("PerceiverDecoder", dict(d_latents=8, num_outputs=3, query_dim=6, output_dim=5, num_heads=2),
             t.randn(2, 4, 8), label="3 outputs, 2 heads", **DEC)
    t.module("PerceiverDecoder", dict(d_latents=6, num_outputs=1, query_dim=6, output_dim=10), t.randn(3, 5, 6),
             label="one output query (classification)", **DEC)
    same = t.randn(1, 3, 4).expand(2, 3, 4).clone()
    t.module("PerceiverDecoder", dict(d_latents=4, num_outputs=4, query_dim=4, output_dim=2, num_heads=4), same,
             label="2 identical examples: the output queries are shared by the batch", checks=(QUERIES_SHARED,),
             **DEC)
    t.module("PerceiverDecoder", dict(d_latents=4, num_outputs=2, query_dim=8, output_dim=3),
             t.randn(2, 3, 4, dtype=torch.float64), dtype=torch.float64, label="float64", **DEC)
    t.module("PerceiverDecoder", dict(d_latents=4, num_outputs=2, query_dim=4, output_dim=3), t.randn(2, 3, 4),
             grad=True, label="gradients", **DEC)
