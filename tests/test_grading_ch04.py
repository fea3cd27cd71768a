"""Hidden tests of Chapter 4 against a catalog of correct, wrong and hostile submissions.

Every notebook is graded by the real pipeline (nbgrader autograde in a guarded kernel,
judged in the grader's own process). Expectations are written per test cell: a
correct style gets every point; a mistake loses exactly the listed tests, each with
the given message fragment, and passes every other test.
"""
from __future__ import annotations

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, common_tampering, fn, submitter, tampered
from support import ROOT

CHAPTER = "04_positional_encoding"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
PE_TESTS = [t for t in ALL_TESTS if t.startswith("test_sinusoidal_encoding")]
REL_TESTS = [t for t in ALL_TESTS if t.startswith("test_relative_position_matrix")]
ROPE_TESTS = [t for t in ALL_TESTS if t.startswith("test_apply_rope")]
ALIBI_TESTS = [t for t in ALL_TESTS if t.startswith("test_alibi_bias")]


def pe(body):
    return fn("sinusoidal_encoding(max_len, d_model)", body)


def rel(body):
    return fn("relative_position_matrix(k, d_model)", body)


def rope(body):
    return fn("apply_rope(x, base=10000.0)", body)


def alibi(body):
    return fn("alibi_bias(num_heads, n)", body)



sub = submitter(CHAPTER)


# relative_position_matrix from the learner's own sinusoidal_encoding: PE[1] = (sin w_i, cos w_i).
REL_FROM_ENCODING = rel("""
    pe1 = sinusoidal_encoding(2, d_model)[1].double()
    w = torch.atan2(pe1[0::2], pe1[1::2])
    c, s = torch.cos(k * w), torch.sin(k * w)
    blocks = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)
    return torch.block_diag(*blocks).float()
""")

# ------------------------------------------------------------------ correct, other styles
CORRECT = {
    "reference": sub(),
    # The seed article's float32 div_term; block matrix by index assignment; RoPE with the
    # "rotate pairs" trick and angles in x's dtype; ALiBi by broadcasting in float32.
    "seed_style_float32": sub({
        "sinusoidal_encoding": pe("""
            pe = torch.zeros(max_len, d_model)
            position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
            pe[:, 0::2] = torch.sin(position * div_term)
            pe[:, 1::2] = torch.cos(position * div_term)
            return pe
        """),
        "relative_position_matrix": rel("""
            M = torch.zeros(d_model, d_model)
            for i in range(d_model // 2):
                b = k / 10000 ** (2 * i / d_model)
                M[2 * i, 2 * i] = math.cos(b)
                M[2 * i, 2 * i + 1] = -math.sin(b)
                M[2 * i + 1, 2 * i] = math.sin(b)
                M[2 * i + 1, 2 * i + 1] = math.cos(b)
            return M
        """),
        "apply_rope": rope("""
            N, d = x.shape[-2:]
            inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=x.dtype) / d))
            ang = torch.arange(N, dtype=x.dtype)[:, None] * inv_freq[None, :]
            cos = ang.cos().repeat_interleave(2, dim=-1)
            sin = ang.sin().repeat_interleave(2, dim=-1)
            rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
            return x * cos + rotated * sin
        """),
        "alibi_bias": alibi("""
            slopes = torch.tensor([2 ** (-8 * (h + 1) / num_heads) for h in range(num_heads)])
            pos = torch.arange(n)
            return -slopes.view(-1, 1, 1) * (pos.view(1, -1, 1) - pos.view(1, 1, -1)).abs()
        """),
    }),
    # Plain Python loops with math, complex-number RoPE (as in Meta's LLaMA code),
    # ALiBi with cdist.
    "loops_and_complex_numbers": sub({
        "sinusoidal_encoding": pe("""
            rows = []
            for pos in range(max_len):
                row = []
                for i in range(d_model // 2):
                    angle = pos / 10000 ** (2 * i / d_model)
                    row += [math.sin(angle), math.cos(angle)]
                rows.append(row)
            return torch.tensor(rows).reshape(max_len, d_model)
        """),
        "relative_position_matrix": rel("""
            blocks = []
            for i in range(d_model // 2):
                b = k * 10000 ** (-2 * i / d_model)
                blocks.append(torch.tensor([[math.cos(b), -math.sin(b)], [math.sin(b), math.cos(b)]]))
            return torch.block_diag(*blocks)
        """),
        "apply_rope": rope("""
            N, d = x.shape[-2:]
            real = torch.float64 if x.dtype == torch.float64 else torch.float32
            theta = base ** (-torch.arange(0, d, 2, dtype=real) / d)
            angles = torch.outer(torch.arange(N, dtype=real), theta)
            rot = torch.polar(torch.ones_like(angles), angles)
            xc = torch.view_as_complex(x.to(real).reshape(*x.shape[:-1], d // 2, 2).contiguous())
            return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)
        """),
        "alibi_bias": alibi("""
            pos = torch.arange(n, dtype=torch.float32)[:, None]
            dist = torch.cdist(pos, pos, p=1)
            out = torch.empty(num_heads, n, n)
            for h in range(num_heads):
                out[h] = -(2.0 ** (-8.0 * (h + 1) / num_heads)) * dist
            return out
        """),
    }),
    # Built on the learner's own encoding: the frequencies read off position 1 with atan2;
    # RoPE through einsum with per-position 2x2 rotation matrices.
    "derived_and_einsum": sub({
        "relative_position_matrix": REL_FROM_ENCODING,
        "apply_rope": rope("""
            *lead, N, d = x.shape
            theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            ang = torch.arange(N, dtype=torch.float64)[:, None] * theta
            c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
            R = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)   # (N, d/2, 2, 2)
            pairs = x.reshape(*lead, N, d // 2, 2)
            return torch.einsum('...npi,npij->...npj', pairs, R).reshape(x.shape)
        """),
    }, prepend=["print('my notes: PE(pos+k) = PE(pos) M_k')"]),
    # Angles in float32 applied to a float64 x, as most public implementations write it: the
    # spec keeps x's dtype but does not ask for float64 angles, so this is right (float32-level
    # agreement is accepted, see autograder.hidden.tolerance).
    "rope_float32_angles": sub({"apply_rope": rope("""
            N, d = x.shape[-2:]
            theta = base ** (-torch.arange(0, d, 2).float() / d)
            ang = torch.arange(N).float()[:, None] * theta
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], -1).flatten(-2)
        """)}),
    # Constant-name getattr is ordinary Python (the static built-in check must not mind it).
    "style_constant_getattr": sub({"alibi_bias": alibi("""
            arange = getattr(torch, "arange")
            slopes = 2.0 ** (-8.0 * arange(1, num_heads + 1) / num_heads)
            pos = arange(n)
            return -slopes[:, None, None] * getattr(pos[:, None] - pos[None, :], "abs")()
        """)}),
}

# ------------------------------------------------------------------ common mistakes
PE_CONCAT = pe("""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    ang = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.cat([ang.sin(), ang.cos()], dim=-1).float()
""")
MISTAKES = {
    "pe_sin_cos_concatenated": (sub({"sinusoidal_encoding": PE_CONCAT}),
                                {t: "concatenated" for t in PE_TESTS}),
    "pe_sin_cos_swapped": (sub({"sinusoidal_encoding": pe("""
            pe = torch.zeros(max_len, d_model)
            pos = torch.arange(max_len).float()[:, None]
            w = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2).float() / d_model)
            pe[:, 0::2] = torch.cos(pos * w)
            pe[:, 1::2] = torch.sin(pos * w)
            return pe
        """)}), {t: "swapped" for t in PE_TESTS}),
    "pe_odd_feature_own_frequency": (sub({"sinusoidal_encoding": pe("""
            pos = torch.arange(max_len, dtype=torch.float64)[:, None]
            div = 10000 ** (torch.arange(d_model, dtype=torch.float64) / d_model)
            pe = torch.zeros(max_len, d_model, dtype=torch.float64)
            pe[:, 0::2] = torch.sin(pos / div[0::2])
            pe[:, 1::2] = torch.cos(pos / div[1::2])
            return pe.float()
        """)}), {t: "same frequency" for t in PE_TESTS}),
    "pe_returns_float64": (sub({"sinusoidal_encoding": pe("""
            pos = torch.arange(max_len, dtype=torch.float64)[:, None]
            ang = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
            return torch.stack([ang.sin(), ang.cos()], dim=-1).flatten(1)
        """)}), {t: "dtype" for t in PE_TESTS}),
    "rel_blocks_transposed": (sub({"relative_position_matrix": rel("""
            w = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
            c, s = torch.cos(k * w), torch.sin(k * w)
            blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)
            return torch.block_diag(*blocks).float()
        """)}), {t: "transposed" for t in REL_TESTS}),
    "rel_concatenated_layout": (sub({"relative_position_matrix": rel("""
            h = d_model // 2
            w = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
            M = torch.zeros(d_model, d_model, dtype=torch.float64)
            i = torch.arange(h)
            M[i, i] = torch.cos(k * w)
            M[i, i + h] = -torch.sin(k * w)
            M[i + h, i] = torch.sin(k * w)
            M[i + h, i + h] = torch.cos(k * w)
            return M.float()
        """)}), {"test_relative_position_matrix_values": "concatenated",
                 "test_relative_position_matrix_every_pos": "concatenated"}),
    "rope_half_split_pairs": (sub({"apply_rope": rope("""
            N, d = x.shape[-2:]
            theta = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
            ang = torch.arange(N, dtype=x.dtype)[:, None] * theta
            cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            return x * cos + torch.cat([-x2, x1], dim=-1) * sin
        """)}), {t: "half-split" for t in ROPE_TESTS}),
    "rope_wrong_direction": (sub({"apply_rope": rope("""
            N, d = x.shape[-2:]
            theta = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
            ang = torch.arange(N, dtype=x.dtype)[:, None] * theta
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * ang.cos() + b * ang.sin(), -a * ang.sin() + b * ang.cos()], -1).flatten(-2)
        """)}), {t: "wrong way" for t in ROPE_TESTS}),
    "alibi_slopes_reversed": (sub({"alibi_bias": alibi("""
            slopes = 2.0 ** (-8.0 * torch.arange(num_heads, 0, -1) / num_heads)
            i = torch.arange(n)
            return -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()
        """)}), {t: "wrong slope order" for t in ALIBI_TESTS}),
    "alibi_slopes_for_8_heads_only": (sub({"alibi_bias": alibi("""
            slopes = 2.0 ** -torch.arange(1, num_heads + 1).float()
            i = torch.arange(n)
            return -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()
        """)}), {t: "only for 8 heads" for t in ALIBI_TESTS}),
    "alibi_signed_distance": (sub({"alibi_bias": alibi("""
            slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1) / num_heads)
            i = torch.arange(n)
            return -slopes[:, None, None] * (i[:, None] - i[None, :])
        """)}), {t: "absolute distance" for t in ALIBI_TESTS}),
}

# ------------------------------------------------------------------ independence
INDEPENDENT = {
    # relative_position_matrix built from the learner's own (broken) sinusoidal_encoding:
    # the reference encoding stands in while it is graded, so only the encoding loses points.
    "broken_encoding_used_by_relative": (sub({
        "sinusoidal_encoding": PE_CONCAT,
        "relative_position_matrix": REL_FROM_ENCODING}), {t: "concatenated" for t in PE_TESTS}),
    "stub_alibi_only": (sub({"alibi_bias": alibi("raise NotImplementedError()")}),
                        {t: "not implemented yet" for t in ALIBI_TESTS}),
    "looping_rope": (sub({"apply_rope": rope("while True:\n    pass")}), {t: "longer than" for t in ROPE_TESTS}),
}

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
TAMPERING = {
    "read_hidden_tests": [f"print(open({str(ROOT / 'solutions' / f'ch{CHAPTER}_hidden.py')!r}).read()[:500])"],
}


CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering={**common_tampering(CHAPTER), **{k: tampered(CHAPTER, v) for k, v in TAMPERING.items()}},
                  kernel_only={"looping_rope"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
