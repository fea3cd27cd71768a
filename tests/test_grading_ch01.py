"""Hidden tests of Chapter 1 against a catalog of correct, wrong and hostile submissions.

Every notebook is graded by the real pipeline (nbgrader autograde in a guarded kernel,
judged in the grader's own process). Expectations are written per test cell: a correct
submission gets 11/11; a mistake must fail exactly the listed tests, each with the given
message fragment, and pass every other test.
"""
from __future__ import annotations

import textwrap

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, common_tampering, submitter, tampered, with_body

CHAPTER = "01_bahdanau_attention"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
MS_TESTS = [t for t in ALL_TESTS if t.startswith("test_masked_softmax")]
DOT_TESTS = [t for t in ALL_TESTS if t.startswith("test_dot_score")]
AA_TESTS = [t for t in ALL_TESTS if t.startswith("test_AdditiveAttention")]
BD_TESTS = [t for t in ALL_TESTS if t.startswith("test_BahdanauDecoder")]


sub = submitter(CHAPTER)


def masked_softmax(body: str) -> str:
    return "def masked_softmax(scores, mask=None):\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"


def dot_score(body: str) -> str:
    return "def dot_score(query, keys):\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"


def additive(forward_body: str) -> str:
    """AdditiveAttention as the chapter gives it (its __init__), with ``forward_body`` as the learner's forward."""
    return with_body(CHAPTER, "AdditiveAttention", "AdditiveAttention.forward", forward_body)


def decoder(step_body: str) -> str:
    """BahdanauDecoder as the chapter gives it (its __init__), with ``step_body`` as the learner's forward_step."""
    return with_body(CHAPTER, "BahdanauDecoder", "BahdanauDecoder.forward_step", step_body)


def additive_with(score_line: str, softmax_line="weights = masked_softmax(scores, mask)",
                  context_line="context = (weights.unsqueeze(1) @ values).squeeze(1)") -> str:
    return additive(f"""
        q = self.W_a(query).unsqueeze(1)
        k = self.U_a(keys)
        {score_line}
        {softmax_line}
        {context_line}
        return context, weights
    """)


def decoder_with(lines: str) -> str:
    return decoder(lines)


STANDARD_STEP = """
    embedded = self.embedding(token)
    context, weights = self.attention(state, enc_outputs, enc_outputs, enc_mask)
    new_state = self.gru(torch.cat([embedded, context], dim=-1), state)
    logits = self.out(torch.cat([new_state, context], dim=-1))
    return logits, new_state, weights
"""

# ------------------------------------------------------------------ correct, other styles
CORRECT = {
    "reference": sub(),
    "style_minus_1e9_einsum_bmm": sub({
        "masked_softmax": masked_softmax("""
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            return F.softmax(scores, dim=-1)
        """),
        "dot_score": dot_score("return torch.einsum('bd,btd->bt', query, keys)"),
        "AdditiveAttention": additive("""
            B, T, _ = keys.shape
            energy = torch.tanh(self.W_a(query)[:, None, :].expand(B, T, -1) + self.U_a(keys))
            scores = self.v_a(energy)[..., 0]
            weights = masked_softmax(scores, mask)
            context = torch.bmm(weights.unsqueeze(1), values).squeeze(1)
            return context, weights
        """),
        "BahdanauDecoder": decoder("""
            context, weights = self.attention(query=state, keys=enc_outputs, values=enc_outputs, mask=enc_mask)
            rnn_input = torch.cat((self.embedding(token), context), 1)
            hidden = self.gru(rnn_input, state)
            return self.out(torch.cat((hidden, context), 1)), hidden, weights
        """),
    }),
    "style_where_finfo_broadcast_inline": sub({
        "masked_softmax": masked_softmax("""
            if mask is not None:
                scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
            return scores.softmax(-1)
        """),
        "dot_score": dot_score("return (query.unsqueeze(1) * keys).sum(dim=-1)"),
        "AdditiveAttention": additive("""
            scores = (torch.tanh(self.W_a(query).unsqueeze(1) + self.U_a(keys)) @ self.v_a.weight.T).squeeze(-1)
            if mask is not None:
                scores = scores + (~mask).to(scores.dtype) * -1e9
            weights = torch.softmax(scores, dim=1)
            context = (weights.unsqueeze(-1) * values).sum(dim=1)
            return context, weights
        """),
        # Attention written out inline with the module's own layers.
        "BahdanauDecoder": decoder("""
            att = self.attention
            e = att.v_a(torch.tanh(att.W_a(state)[:, None] + att.U_a(enc_outputs))).squeeze(2)
            if enc_mask is not None:
                e = e.masked_fill(~enc_mask, float('-inf'))
            a = F.softmax(e, dim=1)
            c = torch.einsum('bt,bth->bh', a, enc_outputs)
            s = self.gru(torch.cat([self.embedding(token), c], -1), state)
            return self.out(torch.cat([s, c], -1)), s, a
        """),
    }),
    "style_renormalised_helper_cell": sub({
        "masked_softmax": masked_softmax("""
            weights = my_softmax(scores)
            if mask is not None:
                weights = weights * mask
                weights = weights / weights.sum(-1, keepdim=True)
            print("debug:", tuple(weights.shape))
            return weights
        """),
        "dot_score": dot_score("return torch.bmm(keys, query[:, :, None])[:, :, 0]"),
        "BahdanauDecoder": decoder("""
            context, weights = self.attention(state, enc_outputs, enc_outputs, mask=enc_mask)
            self.last_weights = weights          # a learner's own attribute
            new_state = self.gru(torch.cat([self.embedding(token), context], dim=-1), state)
            return self.out(torch.cat([new_state, context], dim=-1)), new_state, weights
        """),
    }, prepend=["def my_softmax(s):\n    s = s - s.amax(-1, keepdim=True)\n    e = s.exp()\n"
                "    return e / e.sum(-1, keepdim=True)\n"]),
    # Constant-name getattr is ordinary Python (the static built-in check must not mind it).
    "style_constant_getattr": sub({"masked_softmax": masked_softmax("""
            if mask is not None:
                scores = getattr(scores, "masked_fill")(~mask, float("-inf"))
            return getattr(torch, "softmax")(scores, dim=-1)
        """)}),
}

# ------------------------------------------------------------------ common mistakes
MISTAKES = {
    # masked_softmax
    "softmax_over_batch": (sub({"masked_softmax": masked_softmax("""
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            return torch.softmax(scores, dim=0)
        """)}), {t: "dimension 0 (the batch)" for t in MS_TESTS}),
    "softmax_dim_1": (sub({"masked_softmax": masked_softmax("""
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            return torch.softmax(scores, dim=1)
        """)}), {t: "dimension 1" for t in MS_TESTS}),
    "mask_inverted": (sub({"masked_softmax": masked_softmax("""
            if mask is not None:
                scores = scores.masked_fill(mask, -1e9)
            return torch.softmax(scores, dim=-1)
        """)}), {t: "polarity inverted" for t in MS_TESTS[1:]}),
    "mask_after_softmax": (sub({"masked_softmax": masked_softmax("""
            weights = torch.softmax(scores, dim=-1)
            return weights * mask if mask is not None else weights
        """)}), {t: "after the softmax" for t in MS_TESTS[1:]}),
    "mask_zero_fill": (sub({"masked_softmax": masked_softmax("""
            if mask is not None:
                scores = scores * mask
            return torch.softmax(scores, dim=-1)
        """)}), {t: "set to 0 instead of -inf" for t in MS_TESTS[1:]}),
    "mask_in_place": (sub({"masked_softmax": masked_softmax("""
            if mask is not None:
                scores.masked_fill_(~mask, float('-inf'))
            return torch.softmax(scores, dim=-1)
        """)}), {t: "in place" for t in MS_TESTS[1:]}),
    "softmax_float32": (sub({"masked_softmax": masked_softmax("""
            scores = scores.float()
            if mask is not None:
                scores = scores.masked_fill(~mask, float('-inf'))
            return torch.softmax(scores, dim=-1)
        """)}), {t: "dtype" for t in MS_TESTS}),
    # dot_score
    "dot_scaled": (sub({"dot_score": dot_score("return (keys @ query.unsqueeze(-1)).squeeze(-1) / math.sqrt(query.shape[-1])")}),
                   {t: "divided by sqrt(d)" for t in DOT_TESTS}),
    "dot_softmaxed": (sub({"dot_score": dot_score("return torch.softmax((keys @ query.unsqueeze(-1)).squeeze(-1), dim=-1)")}),
                      {t: "went through a softmax" for t in DOT_TESTS}),
    "dot_pairing": (sub({"dot_score": dot_score("return (query * keys).sum(-1)")}),
                    {"test_dot_score_values": "must match the size", "test_dot_score_batch": "paired with key t"}),
    "dot_transposed": (sub({"dot_score": dot_score("return keys @ query.T")}),
                       {t: "returned shape" for t in DOT_TESTS}),
    # AdditiveAttention
    # A wrong score costs the values and the mask tests; the shapes test judges shapes, distributions
    # and the context's average of the values, which such a score leaves right.
    "additive_no_tanh": (sub({"AdditiveAttention": additive_with("scores = self.v_a(q + k).squeeze(-1)")}),
                         {t: "tanh missing" for t in AA_TESTS[1:]}),
    "additive_no_v_a": (sub({"AdditiveAttention": additive_with("scores = torch.tanh(q + k).sum(-1)")}),
                        {t: "v_a missing" for t in AA_TESTS[1:]}),
    "additive_v_a_first": (sub({"AdditiveAttention": additive_with("scores = torch.tanh(self.v_a(q + k)).squeeze(-1)")}),
                           {t: "wrong order" for t in AA_TESTS[1:]}),
    "additive_swapped": (sub({"AdditiveAttention": additive("""
            scores = self.v_a(torch.tanh(self.W_a(keys) + self.U_a(query).unsqueeze(1))).squeeze(-1)
            weights = masked_softmax(scores, mask)
            return (weights.unsqueeze(1) @ values).squeeze(1), weights
        """)}), {"test_AdditiveAttention_shapes": "mat1 and mat2", "test_AdditiveAttention_values": "swapped",
                 "test_AdditiveAttention_mask": "swapped"}),
    "additive_softmax_over_batch": (sub({"AdditiveAttention": additive_with(
        "scores = self.v_a(torch.tanh(q + k)).squeeze(-1)",
        softmax_line="weights = torch.softmax(scores if mask is None else scores.masked_fill(~mask, -1e9), dim=0)")}),
        {t: "over the batch" for t in AA_TESTS}),
    "additive_context_from_keys": (sub({"AdditiveAttention": additive_with(
        "scores = self.v_a(torch.tanh(q + k)).squeeze(-1)",
        context_line="context = (weights.unsqueeze(1) @ keys).squeeze(1)")}),
        {"test_AdditiveAttention_shapes": "VALUES", "test_AdditiveAttention_values": "VALUES",
         "test_AdditiveAttention_mask": "VALUES"}),
    "additive_mask_ignored": (sub({"AdditiveAttention": additive_with(
        "scores = self.v_a(torch.tanh(q + k)).squeeze(-1)", softmax_line="weights = masked_softmax(scores)")}),
        {"test_AdditiveAttention_mask": "mask ignored"}),
    "additive_mask_inverted": (sub({"AdditiveAttention": additive_with(
        "scores = self.v_a(torch.tanh(q + k)).squeeze(-1)",
        softmax_line="weights = masked_softmax(scores, ~mask if mask is not None else None)")}),
        {"test_AdditiveAttention_mask": "polarity inverted"}),
    # BahdanauDecoder
    "decoder_attends_new_state": (sub({"BahdanauDecoder": decoder("""
            embedded = self.embedding(token)
            old_context, _ = self.attention(state, enc_outputs, enc_outputs, enc_mask)
            new_state = self.gru(torch.cat([embedded, old_context], dim=-1), state)
            context, weights = self.attention(new_state, enc_outputs, enc_outputs, enc_mask)
            return self.out(torch.cat([new_state, context], dim=-1)), new_state, weights
        """)}), {t: "NEW state" for t in BD_TESTS}),
    "decoder_gru_input_order": (sub({"BahdanauDecoder": decoder(STANDARD_STEP.replace(
        "torch.cat([embedded, context], dim=-1)", "torch.cat([context, embedded], dim=-1)"))}),
        {t: "GRU input in the wrong order" for t in BD_TESTS}),
    "decoder_output_order": (sub({"BahdanauDecoder": decoder(STANDARD_STEP.replace(
        "torch.cat([new_state, context], dim=-1)", "torch.cat([context, new_state], dim=-1)"))}),
        {t: "output layer input in the wrong order" for t in BD_TESTS}),
    "decoder_gru_from_zeros": (sub({"BahdanauDecoder": decoder(STANDARD_STEP.replace(
        "torch.cat([embedded, context], dim=-1), state)", "torch.cat([embedded, context], dim=-1))"))}),
        {t: "started from zeros" for t in BD_TESTS}),
    "decoder_logits_from_old_state": (sub({"BahdanauDecoder": decoder(STANDARD_STEP.replace(
        "torch.cat([new_state, context], dim=-1)", "torch.cat([state, context], dim=-1)"))}),
        {t: "logits computed from the previous state" for t in BD_TESTS}),
    "decoder_returns_old_state": (sub({"BahdanauDecoder": decoder(STANDARD_STEP.replace(
        "return logits, new_state, weights", "return logits, state, weights"))}),
        {t: "returned the previous state" for t in BD_TESTS}),
    "decoder_mask_dropped": (sub({"BahdanauDecoder": decoder(STANDARD_STEP.replace(
        "enc_outputs, enc_outputs, enc_mask)", "enc_outputs, enc_outputs)"))}),
        {"test_BahdanauDecoder_mask": "enc_mask ignored"}),
    "decoder_logits_from_state_only": (sub({"BahdanauDecoder": decoder(STANDARD_STEP.replace(
        "self.out(torch.cat([new_state, context], dim=-1))", "self.out(new_state)"))}),
        {t: "logits = self.out(new_state)" for t in BD_TESTS}),
    # The kernel dies in the last exercise's cell: only the tests that could not run after it lose.
    "kernel_exits_in_decoder": (sub({"BahdanauDecoder": "import os\nos._exit(0)\n"}),
                                {t: "did not run" for t in BD_TESTS}),
}

# ------------------------------------------------------------------ independence
INDEPENDENT = {
    # A broken masked_softmax must not cost points in AdditiveAttention or the decoder.
    "broken_masked_softmax": (sub({"masked_softmax": masked_softmax("return scores")}),
                              {t: "values differ from the reference" for t in MS_TESTS}),
    # A broken AdditiveAttention must not cost points in the decoder, which constructs it.
    "broken_additive": (sub({"AdditiveAttention": additive("""
            weights = torch.full(keys.shape[:2], 1.0 / keys.shape[1])
            return values.mean(dim=1), weights
        """)}), {t: "output and weights differ from the reference" for t in AA_TESTS[1:]}),  # its shapes are right
    "stub_additive_and_masked_softmax": (sub({
        "AdditiveAttention": additive("raise NotImplementedError()"),
        "masked_softmax": masked_softmax("raise NotImplementedError()")}),
        {t: "not implemented yet" for t in MS_TESTS + AA_TESTS}),
    "stub_decoder_only": (sub({"BahdanauDecoder": decoder("raise NotImplementedError()")}),
                          {t: "not implemented yet" for t in BD_TESTS}),
}

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
# After every stub (tests/catalog.py: tampered): an answer whose output claims to equal anything.
TAMPERING_AFTER_STUBS = {
    "module_returning_liar": ["class Liar(torch.Tensor):\n"
                              "    def __eq__(self, other): return True\n"
                              "def masked_softmax(scores, mask=None):\n"
                              "    return torch.zeros_like(scores).as_subclass(Liar)"],
}


CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering={**common_tampering(CHAPTER),
                             **{k: tampered(CHAPTER, after_stubs=v) for k, v in TAMPERING_AFTER_STUBS.items()}},
                  kernel_only={"kernel_exits_in_decoder"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
