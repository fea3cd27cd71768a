"""Hidden tests of Chapter 3 against a catalog of correct, wrong and hostile submissions.

Every notebook is graded by the real pipeline (nbgrader autograde in a guarded kernel,
judged in the grader's own process). Expectations are written per test cell: a
correct style gets every point; a mistake loses exactly the listed tests, each with
the given message fragment, and passes every other test.
"""
from __future__ import annotations

import textwrap

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, common_tampering, submitter, tampered, with_body

CHAPTER = "03_multi_head_attention"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
MHA_TESTS = [t for t in ALL_TESTS if t.startswith("test_MultiHeadAttention")]


def split(body: str) -> str:
    return "def split_heads(x, num_heads):\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"


def merge(body: str) -> str:
    return "def merge_heads(x):\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"


def mha(forward_body: str) -> str:
    """MultiHeadAttention as the chapter gives it (its __init__), with ``forward_body`` as the learner's forward."""
    return with_body(CHAPTER, "MultiHeadAttention", "MultiHeadAttention.forward", forward_body)


sub = submitter(CHAPTER)


# The seed article's style: view + transpose inline, -1e9 fill with mask == 0, contiguous().view.
SEED_STYLE_MHA = mha("""
    batch_size = query.size(0)
    Q = self.W_q(query).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
    K = self.W_k(key).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
    V = self.W_v(value).view(batch_size, -1, self.num_heads, self.d_k).transpose(1, 2)
    scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    attn = torch.softmax(scores, dim=-1)
    context = torch.matmul(attn, V).transpose(1, 2).contiguous().view(batch_size, -1, self.num_heads * self.d_k)
    return self.W_o(context), attn
""")

# ------------------------------------------------------------------ correct, other styles
CORRECT = {
    "reference": sub(),
    "seed_style_view_permute": sub({
        "split_heads": split("""
            B, N, C = x.shape
            return x.view(B, N, num_heads, C // num_heads).permute(0, 2, 1, 3)
        """),
        "merge_heads": merge("""
            B, h, N, d = x.shape
            return x.permute(0, 2, 1, 3).contiguous().view(B, N, h * d)
        """),
        "MultiHeadAttention": SEED_STYLE_MHA,
    }),
    "chunk_cat_and_head_loop": sub({
        "split_heads": split("return torch.stack(x.chunk(num_heads, dim=-1), dim=1)"),
        "merge_heads": merge("return torch.cat(x.unbind(dim=1), dim=-1)"),
        "MultiHeadAttention": mha("""
            q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)
            if mask is not None:
                mask = mask.expand(q.shape[0], self.num_heads, q.shape[1], k.shape[1])
            outs, ws = [], []
            for i in range(self.num_heads):
                sl = slice(i * self.d_k, (i + 1) * self.d_k)
                o, w = scaled_dot_product_attention(q[..., sl], k[..., sl], v[..., sl],
                                                    None if mask is None else mask[:, i])
                outs.append(o)
                ws.append(w)
            return self.W_o(torch.cat(outs, dim=-1)), torch.stack(ws, dim=1)
        """),
    }),
    "unflatten_einsum_where": sub({
        "split_heads": split("return x.unflatten(-1, (num_heads, -1)).movedim(-2, 1)"),
        "merge_heads": merge("return x.movedim(1, -2).flatten(-2)"),
        "MultiHeadAttention": mha("""
            q = split_heads(query @ self.W_q.weight.T + self.W_q.bias, self.num_heads)
            k = split_heads(F.linear(key, self.W_k.weight, self.W_k.bias), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            s = torch.einsum('bhqd,bhkd->bhqk', q, k) * self.d_k ** -0.5
            if mask is not None:
                s = torch.where(mask, s, torch.finfo(s.dtype).min)
            w = s.softmax(-1)
            print("debug", tuple(w.shape))
            return self.W_o(merge_heads(torch.einsum('bhqk,bhkd->bhqd', w, v))), w
        """),
    }, prepend=["def helper_unused(x):\n    return x * 2\n"]),
    # Constant-name getattr is ordinary Python: the static built-in check must not reject it.
    "style_constant_getattr": sub({"MultiHeadAttention": mha("""
            q, k, v = (split_heads(getattr(self, "W_q")(query), self.num_heads),
                       split_heads(getattr(self, "W_k")(key), self.num_heads),
                       split_heads(getattr(self, "W_v")(value), self.num_heads))
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = getattr(torch, "softmax")(scores, dim=-1)
            return getattr(self, "W_o")(merge_heads(weights @ v)), weights
        """)}),
}

# A student helper: this course's mask as nn.MultiheadAttention wants it (True = masked, (B*h, N_q, N_k)).
TORCH_MASK = textwrap.dedent("""
    def torch_mask(mask, query, key, h):
        if mask is None:
            return None
        B, Nq, Nk = query.shape[0], query.shape[1], key.shape[1]
        return (~mask).expand(B, h, Nq, Nk).reshape(B * h, Nq, Nk)
""")

# ------------------------------------------------------------------ common mistakes
MISTAKES = {
    "split_view_without_transpose": (sub({"split_heads": split("""
            B, N, C = x.shape
            return x.view(B, num_heads, N, C // num_heads)
        """)}), {"test_split_heads": "without a transpose"}),
    "split_interleaved": (sub({"split_heads": split("""
            B, N, C = x.shape
            return x.view(B, N, C // num_heads, num_heads).permute(0, 3, 1, 2)
        """)}), {"test_split_heads": "interleaved"}),
    "merge_without_transpose": (sub({"merge_heads": merge("""
            B, h, N, d = x.shape
            return x.reshape(B, N, h * d)
        """)}), {"test_merge_heads": "wrong order"}),
    "merge_interleaved": (sub({"merge_heads": merge("""
            B, h, N, d = x.shape
            return x.permute(0, 2, 3, 1).reshape(B, N, h * d)
        """)}), {"test_merge_heads": "interleaved"}),
    "mha_W_o_forgotten": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            out, w = scaled_dot_product_attention(q, k, v, mask)
            return merge_heads(out), w
        """)}), {t: "W_o forgotten" for t in MHA_TESTS}),
    "mha_scale_sqrt_d_model": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            s = q @ k.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                s = s.masked_fill(~mask, float('-inf'))
            w = s.softmax(-1)
            return self.W_o(merge_heads(w @ v)), w
        """)}), {t: "1/sqrt(d_model)" for t in MHA_TESTS}),
    "mha_views_without_transpose": (sub({"MultiHeadAttention": mha("""
            B, Nq, C = query.shape
            Nk = key.shape[1]
            q = self.W_q(query).view(B, self.num_heads, Nq, self.d_k)
            k = self.W_k(key).view(B, self.num_heads, Nk, self.d_k)
            v = self.W_v(value).view(B, self.num_heads, Nk, self.d_k)
            out, w = scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(out.reshape(B, Nq, C)), w
        """)}), {t: "without a transpose" for t in MHA_TESTS}),
    "mha_merged_in_wrong_order": (sub({"MultiHeadAttention": mha("""
            B, Nq, C = query.shape
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            out, w = scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(out.reshape(B, Nq, C)), w
        """)}), {t: "wrong order" for t in MHA_TESTS}),
    "mha_mask_ignored": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            out, w = scaled_dot_product_attention(q, k, v)
            return self.W_o(merge_heads(out)), w
        """)}), {t: "mask ignored" for t in ["test_MultiHeadAttention_causal_mask",
                                             "test_MultiHeadAttention_padding_mask",
                                             "test_MultiHeadAttention_gradients"]}),
    "mha_mask_inverted": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            s = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
            if mask is not None:
                s = s.masked_fill(mask, -1e9)
            w = s.softmax(-1)
            return self.W_o(merge_heads(w @ v)), w
        """)}), {t: "polarity inverted" for t in ["test_MultiHeadAttention_causal_mask",
                                                  "test_MultiHeadAttention_padding_mask",
                                                  "test_MultiHeadAttention_gradients"]}),
    "mha_key_value_swapped": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(value), self.num_heads)
            v = split_heads(self.W_v(key), self.num_heads)
            out, w = scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(merge_heads(out)), w
        """)}), {"test_MultiHeadAttention_shapes": "swapped", "test_MultiHeadAttention_cross_attention": "swapped",
                 "test_MultiHeadAttention_padding_mask": "swapped",
                 # self-attention values agree (key is value there), but the gradients go to the wrong inputs
                 "test_MultiHeadAttention_gradients": "gradient with respect to `key`"}),
    "mha_weights_averaged": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            out, w = scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(merge_heads(out)), w.mean(dim=1)
        """)}), {t: "averaged over the heads" for t in MHA_TESTS}),
    # The layer scales the queries and then calls the attention, which scales again: 1/d_k. Every
    # test has a probe with d_k > 1 (at d_model=16, 4 heads, 1/d_k is also 1/sqrt(d_model): the message says both).
    "mha_scaled_twice": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads) / math.sqrt(self.d_k)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            out, w = scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(merge_heads(out)), w
        """)}), {t: "scaled twice" for t in MHA_TESTS}),
    # Self-attention (key is value) cannot tell; every test with key != value must.
    "mha_values_from_keys": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(key), self.num_heads)
            out, w = scaled_dot_product_attention(q, k, v, mask)
            return self.W_o(merge_heads(out)), w
        """)}), {"test_MultiHeadAttention_shapes": "values projected from the keys",
                 "test_MultiHeadAttention_cross_attention": "values projected from the keys",
                 "test_MultiHeadAttention_padding_mask": "values projected from the keys",
                 # self-attention values agree, the gradients go to `key` instead of `value`
                 "test_MultiHeadAttention_gradients": "gradient with respect to `key`"}),
    "builtin_multihead_attention": (sub({"MultiHeadAttention": mha("""
            m = nn.MultiheadAttention(query.shape[-1], self.num_heads, batch_first=True)
            with torch.no_grad():
                m.in_proj_weight.copy_(torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight]))
                m.in_proj_bias.copy_(torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))
                m.out_proj.weight.copy_(self.W_o.weight)
                m.out_proj.bias.copy_(self.W_o.bias)
            return m(query, key, value, attn_mask=torch_mask(mask, query, key, self.num_heads),
                     average_attn_weights=False)
        """)}, prepend=[TORCH_MASK]), {t: "build it from scratch" for t in MHA_TESTS}),
    "builtin_multihead_attention_obfuscated": (sub({"MultiHeadAttention": mha("""
            cls = getattr(torch.nn, "Multihead" + "Attention")
            m = cls(query.shape[-1], self.num_heads, batch_first=True)
            m.in_proj_weight = nn.Parameter(torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight]))
            m.in_proj_bias = nn.Parameter(torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))
            m.out_proj = self.W_o
            return m(query, key, value, attn_mask=torch_mask(mask, query, key, self.num_heads),
                     average_attn_weights=False)
        """)}, prepend=[TORCH_MASK]), {t: "build it from scratch" for t in MHA_TESTS}),
    "builtin_sdpa_in_mha": (sub({"MultiHeadAttention": mha("""
            q = split_heads(self.W_q(query), self.num_heads)
            k = split_heads(self.W_k(key), self.num_heads)
            v = split_heads(self.W_v(value), self.num_heads)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.W_o(merge_heads(out)), scaled_dot_product_attention(q, k, v, mask)[1]
        """)}), {t: "build it from scratch" for t in MHA_TESTS}),
}

# ------------------------------------------------------------------ independence
INDEPENDENT = {
    # Broken split/merge must not cost points in MultiHeadAttention, which calls them.
    "broken_split_and_merge": (sub({"split_heads": split("return x"), "merge_heads": merge("return x")}),
                               {"test_split_heads": "returned shape", "test_merge_heads": "returned shape"}),
    "looping_split": (sub({"split_heads": split("while True:\n    pass")}), {"test_split_heads": "longer than"}),
    "stub_mha_only": (sub({"MultiHeadAttention": mha("raise NotImplementedError()")}),
                      {t: "not implemented yet" for t in MHA_TESTS}),
}

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)


# After every stub (tests/catalog.py: tampered): a class that hands the work to PyTorch's own layer, under the given names.
TAMPERING_AFTER_STUBS = {
    "builtin_after_stubs": ["class MultiHeadAttention(nn.Module):\n"
                            "    def __init__(self, d_model, num_heads):\n"
                            "        super().__init__()\n"
                            "        self.num_heads = num_heads\n"
                            "        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))\n"
                            "    def forward(self, query, key, value, mask=None):\n"
                            "        w = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])\n"
                            "        b = torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias])\n"
                            "        return F.multi_head_attention_forward(query.transpose(0, 1), key.transpose(0, 1),\n"
                            "            value.transpose(0, 1), query.shape[-1], self.num_heads, w, b, None, None, False, 0.0,\n"
                            "            self.W_o.weight, self.W_o.bias, need_weights=True, average_attn_weights=False,\n"
                            "            attn_mask=None if mask is None else ~mask)\n"],
}


CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering={**common_tampering(CHAPTER),
                             **{k: tampered(CHAPTER, after_stubs=v) for k, v in TAMPERING_AFTER_STUBS.items()}},
                  kernel_only={"looping_split"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
