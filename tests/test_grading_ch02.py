"""Hidden tests of Chapter 2 against a catalog of correct, wrong and hostile submissions.

Every notebook is graded by the real pipeline (nbgrader autograde in a guarded kernel,
judged in the grader's own process). Expectations are written per test cell:
``full`` means 10/10; otherwise the listed tests must fail with the given message
fragment and every other test must pass.
"""
from __future__ import annotations

import textwrap


from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, common_tampering, tampered, with_body
from support import ROOT, submission

CHAPTER = "02_self_attention"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
SDPA_TESTS = [t for t in ALL_TESTS if t.startswith("test_scaled_dot_product_attention")]
SA_TESTS = [t for t in ALL_TESTS if t.startswith("test_SelfAttention")]


def sdpa(body: str) -> str:
    return ("def scaled_dot_product_attention(query, key, value, mask=None):\n"
            + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n")


def self_attention(forward_body: str) -> str:
    """SelfAttention as the chapter gives it (its __init__), with ``forward_body`` as the learner's forward."""
    return with_body(CHAPTER, "SelfAttention", "SelfAttention.forward", forward_body)


# ------------------------------------------------------------------ correct, other styles
CORRECT = {
    "reference": submission(),
    "style_minus_1e9_matmul": submission({
        "scaled_dot_product_attention": sdpa("""
            d_k = key.shape[-1]
            scores = torch.matmul(query, key.transpose(-1, -2)) / d_k ** 0.5
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            weights = F.softmax(scores, dim=-1)
            return torch.matmul(weights, value), weights
        """),
        "causal_mask": "def causal_mask(n):\n    return torch.tril(torch.ones(n, n)).bool()\n",
        "padding_mask": "def padding_mask(lengths, max_len):\n"
                        "    return torch.arange(max_len)[None, :] < lengths[:, None]\n",
    }),
    "style_einsum_where_finfo": submission({
        "scaled_dot_product_attention": sdpa("""
            scores = torch.einsum('...qd,...kd->...qk', query, key) * query.size(-1) ** -0.5
            if mask is not None:
                scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
            weights = scores.softmax(-1)
            return torch.einsum('...qk,...kd->...qd', weights, value), weights
        """),
        "causal_mask": "def causal_mask(n):\n    i = torch.arange(n)\n    return i[:, None] >= i[None, :]\n",
        "padding_mask": "def padding_mask(lengths, max_len):\n"
                        "    return lengths.unsqueeze(-1) > torch.arange(max_len, device=lengths.device)\n",
        "SelfAttention": self_attention("""
            q = x @ self.W_q.weight.T + self.W_q.bias
            k = x @ self.W_k.weight.T + self.W_k.bias
            v = x @ self.W_v.weight.T + self.W_v.bias
            scores = q @ k.transpose(1, 2) / math.sqrt(self.d_k)
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = scores.softmax(dim=-1)
            return w @ v, w
        """),
    }),
    # Constant-name getattr is ordinary Python: the static built-in check must not reject it.
    "style_constant_getattr": submission({
        "scaled_dot_product_attention": sdpa("""
            scores = query @ getattr(key, "transpose")(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            weights = getattr(torch, "softmax")(scores, dim=-1)
            return weights @ value, weights
        """),
        "SelfAttention": self_attention("""
            q, k, v = (getattr(self, "W_q")(x), getattr(self, "W_k")(x), getattr(self, "W_v")(x))
            return scaled_dot_product_attention(q, k, v, mask)
        """),
    }),
    "style_additive_mask_and_helper_cell": submission({
        "scaled_dot_product_attention": sdpa("""
            scores = query @ key.mT / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores + (~mask).to(scores.dtype) * -1e9
            weights = my_softmax(scores)
            print("debug: scores", tuple(scores.shape))
            return weights @ value, weights
        """),
    }, prepend=["def my_softmax(s):\n    s = s - s.amax(-1, keepdim=True)\n    e = s.exp()\n"
                "    return e / e.sum(-1, keepdim=True)\n"]),
}

# ------------------------------------------------------------------ common mistakes
REF = "scaled_dot_product_attention(q, k, v, mask)"
MISTAKES = {
    "no_scale": (submission({"scaled_dot_product_attention": sdpa("""
            scores = query @ key.transpose(-2, -1)
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = torch.softmax(scores, -1)
            return w @ value, w
        """)}), {t: "not scaled by 1/sqrt(d_k)" for t in SDPA_TESTS}),
    "scale_by_d_k": (submission({"scaled_dot_product_attention": sdpa("""
            scores = query @ key.transpose(-2, -1) / query.shape[-1]
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = torch.softmax(scores, -1)
            return w @ value, w
        """)}), {t: "1/d_k instead of 1/sqrt(d_k)" for t in SDPA_TESTS}),
    "softmax_wrong_dim": (submission({"scaled_dot_product_attention": sdpa("""
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = torch.softmax(scores, dim=-2)
            return w @ value, w
        """)}), {t: "softmax taken over the queries" for t in SDPA_TESTS}),
    "mask_inverted": (submission({"scaled_dot_product_attention": sdpa("""
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(mask, -1e9)
            w = torch.softmax(scores, -1)
            return w @ value, w
        """)}), {"test_scaled_dot_product_attention_mask": "mask polarity inverted"}),
    "mask_after_softmax": (submission({"scaled_dot_product_attention": sdpa("""
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            w = torch.softmax(scores, -1)
            if mask is not None:
                w = w * mask
            return w @ value, w
        """)}), {"test_scaled_dot_product_attention_mask": "mask applied after the softmax"}),
    "in_place_scaling": (submission({"scaled_dot_product_attention": sdpa("""
            query /= math.sqrt(query.shape[-1])
            scores = query @ key.transpose(-2, -1)
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = torch.softmax(scores, -1)
            return w @ value, w
        """)}), {t: "in place" for t in SDPA_TESTS}),
    "detached_weights": (submission({"scaled_dot_product_attention": sdpa("""
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = torch.softmax(scores, -1).detach()
            return w @ value, w
        """)}), {t: "gradient" for t in SDPA_TESTS[2:]}),
    "float32_cast": (submission({"scaled_dot_product_attention": sdpa("""
            query, key, value = query.float(), key.float(), value.float()
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = torch.softmax(scores, -1)
            return w @ value, w
        """)}), {t: "dtype" for t in SDPA_TESTS[1:3]}),
    "causal_triu": (submission({"causal_mask": "def causal_mask(n):\n    return torch.ones(n, n, dtype=torch.bool).triu()\n"}),
                    {"test_causal_mask": "above the diagonal"}),
    "causal_float": (submission({"causal_mask": "def causal_mask(n):\n    return torch.ones(n, n).tril()\n"}),
                     {"test_causal_mask": "expected bool"}),
    "padding_off_by_one": (submission({"padding_mask": "def padding_mask(lengths, max_len):\n"
                                       "    return torch.arange(max_len)[None] <= lengths[:, None]\n"}),
                           {"test_padding_mask": "off by one"}),
    "padding_inverted": (submission({"padding_mask": "def padding_mask(lengths, max_len):\n"
                                     "    return torch.arange(max_len)[None] >= lengths[:, None]\n"}),
                         {"test_padding_mask": "polarity inverted"}),
    "padding_max_from_lengths": (submission({"padding_mask": "def padding_mask(lengths, max_len):\n"
                                             "    return torch.arange(int(lengths.max()))[None] < lengths[:, None]\n"}),
                                 {"test_padding_mask": "width taken from lengths.max()"}),
    "sa_scale_d_model": (submission({"SelfAttention": self_attention("""
            q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
            scores = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            w = scores.softmax(-1)
            return w @ v, w
        """)}), {t: "1/sqrt(d_model)" for t in SA_TESTS}),
    "sa_swapped_qk": (submission({"SelfAttention": self_attention("""
            return scaled_dot_product_attention(self.W_k(x), self.W_q(x), self.W_v(x), mask)
        """)}), {t: "swapped" for t in SA_TESTS}),
    "sa_no_value_projection": (submission({"SelfAttention": self_attention("""
            return scaled_dot_product_attention(self.W_q(x), self.W_k(x), x, mask)
        """)}), {t: "missing value projection" for t in SA_TESTS}),
    "sa_mask_dropped": (submission({"SelfAttention": self_attention("""
            return scaled_dot_product_attention(self.W_q(x), self.W_k(x), self.W_v(x))
        """)}), {"test_SelfAttention_mask": "mask ignored", "test_SelfAttention_gradients": "mask ignored"}),
    "builtin_sdpa": (submission({"scaled_dot_product_attention": sdpa("""
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            return out, scores.softmax(-1)
        """)}), {t: "build it from scratch" for t in SDPA_TESTS}),
    "builtin_sdpa_obfuscated": (submission({"scaled_dot_product_attention": sdpa("""
            fn = getattr(F, "scaled_dot_" + "product_attention")
            out = fn(query, key, value, attn_mask=mask)
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            return out, scores.softmax(-1)
        """)}), {t: "build it from scratch" for t in SDPA_TESTS}),
    # The built-in called with torch's function recording switched off, its name assembled at run time.
    "builtin_sdpa_disable_torch_function": (submission({"scaled_dot_product_attention": sdpa("""
            parts = ["scaled", "dot", "product", "attention"]
            with torch._C.DisableTorchFunction():
                out = getattr(F, "_".join(parts))(query, key, value, attn_mask=mask)
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            return out, scores.softmax(-1)
        """)}), {t: "from scratch" for t in SDPA_TESTS}),
    "builtin_in_self_attention": (submission({"SelfAttention": self_attention("""
            q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return out, scaled_dot_product_attention(q, k, v, mask)[1]
        """)}), {t: "build it from scratch" for t in SA_TESTS}),
    "builtin_multihead_module": (submission({"SelfAttention": self_attention("""
            attn = nn.MultiheadAttention(x.shape[-1], 1, batch_first=True)
            q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
            attn(x, x, x)
            return scaled_dot_product_attention(q, k, v, mask)
        """)}), {t: "build it from scratch" for t in SA_TESTS}),
}

# ------------------------------------------------------------------ independence
INDEPENDENT = {
    # A broken attention function must not cost points in SelfAttention, which calls it.
    "broken_sdpa_calls_from_self_attention": (
        submission({"scaled_dot_product_attention": sdpa("return value, None")}),
        {t: "returned a NoneType" if t.endswith(("worked_example", "mask")) else "returned shape"
         for t in SDPA_TESTS}),
    "looping_sdpa": (submission({"scaled_dot_product_attention": sdpa("while True:\n    pass")}),
                     {t: "longer than" for t in SDPA_TESTS}),
    "kernel_exits_before_self_attention": (
        submission(answers={"SelfAttention": "import os\nos._exit(0)\n"}),
        {t: "did not run" for t in SA_TESTS}),
    "stub_masks_only": (submission(base="reference", answers={
        "causal_mask": "def causal_mask(n):\n    raise NotImplementedError()\n",
        "padding_mask": "def padding_mask(lengths, max_len):\n    raise NotImplementedError()\n"}),
        {"test_causal_mask": "not implemented yet", "test_padding_mask": "not implemented yet"}),
}

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
TAMPERING = {
    "silence_tracebacks": ["ip = get_ipython()\nip.showtraceback = lambda *a, **k: None\n"
                           "ip.set_custom_exc((BaseException,), lambda *a, **k: None)"],
    "read_gradebook": ["import sqlite3, glob, os\n"
                       "for db in glob.glob('/tmp/attn-grader/*/course/gradebook.db') + glob.glob('../../../gradebook.db'):\n"
                       "    print(sqlite3.connect(db).execute('select source from source_cell').fetchall())"],
    "kill_grader": ["import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept Exception as e:\n    print(e)"],
    "overwrite_grader": [f"open({str(ROOT / 'autograder' / 'hidden.py')!r}, 'a').write('# pwned')"],
    "exit_kernel": ["import os\nos._exit(0)"],
}

# After every stub (tests/catalog.py: tampered): an answer whose output claims to equal anything.
TAMPERING_AFTER_STUBS = {
    "tensor_subclass": ["class Liar(torch.Tensor):\n"
                        "    def __eq__(self, other): return True\n"
                        "def scaled_dot_product_attention(query, key, value, mask=None):\n"
                        "    z = torch.zeros(*query.shape[:-1], value.shape[-1]).as_subclass(Liar)\n"
                        "    return z, torch.zeros(*query.shape[:-1], key.shape[-2]).as_subclass(Liar)"],
}


CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering={**common_tampering(CHAPTER), **{k: tampered(CHAPTER, v) for k, v in TAMPERING.items()},
                             **{k: tampered(CHAPTER, after_stubs=v) for k, v in TAMPERING_AFTER_STUBS.items()}},
                  kernel_only={"looping_sdpa", "kernel_exits_before_self_attention"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
