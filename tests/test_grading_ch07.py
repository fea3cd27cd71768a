"""Hidden tests of Chapter 7 against a catalog of correct, wrong and hostile submissions.

Every notebook is graded by the real pipeline (nbgrader autograde in the sandboxed kernel,
judged in the grader's own process). A correct style gets every point; a mistake loses
exactly the listed tests, each with the given message fragment, and passes every other test.
"""
from __future__ import annotations

import textwrap

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, body, common_tampering, fn, others_stubbed, submitter, with_body

CHAPTER = "07_gpt"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
CSA_TESTS = [t for t in ALL_TESTS if t.startswith("test_CausalSelfAttention")]
CSA_VALUES = ["test_CausalSelfAttention_no_cache", "test_CausalSelfAttention_cache"]  # the shapes test: shapes only
GPT_TESTS = ["test_GPT_no_cache", "test_GPT_cache"]
FILTER_TESTS = ["test_filter_logits_top_k", "test_filter_logits_top_p"]


def csa(forward_body: str, extra_init: str = "") -> str:
    """CausalSelfAttention as the chapter gives it (its __init__, plus the ``extra_init`` lines a learner
    added at its end), with ``forward_body`` as the learner's forward."""
    source = with_body(CHAPTER, "CausalSelfAttention", "CausalSelfAttention.forward", forward_body)
    if not extra_init:
        return source
    last_given = source.index("\n", source.index("self.c_proj = nn.Linear(d_model, d_model)")) + 1
    return source[:last_given] + body(extra_init) + source[last_given:]


def block(forward_body: str) -> str:
    """Block as the chapter gives it (its __init__), with ``forward_body`` as the learner's forward."""
    return with_body(CHAPTER, "Block", "Block.forward", forward_body)


def gpt(forward_body: str) -> str:
    """GPT as the chapter gives it (its __init__), with ``forward_body`` as the learner's forward."""
    return with_body(CHAPTER, "GPT", "GPT.forward", forward_body)


sub = submitter(CHAPTER)


FILTER_SIG = "filter_logits(logits, top_k=None, top_p=None)"
GEN_SIG = "generate(model, idx, max_new_tokens, use_cache=True)"
LOAD_SIG = "load_gpt2_weights(model, state_dict)"

# ------------------------------------------------------------------ correct, other styles
NANOGPT = {
    "CausalSelfAttention": csa("""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)
        q = q.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)
        v = v.view(B, T, self.num_heads, C // self.num_heads).transpose(1, 2)
        if past is not None:
            k = torch.cat((past[0], k), dim=-2)
            v = torch.cat((past[1], v), dim=-2)
        S = k.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        bias = torch.tril(torch.ones(S, S)).view(1, 1, S, S)[:, :, S - T:, :]
        att = att.masked_fill(bias == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y), (k, v)
    """),
    "Block": block("""
        attn_out, present = self.attn(self.ln_1(x), past=past)
        x = x + attn_out
        x = x + self.mlp(self.ln_2(x))
        return x, present
    """),
    "GPT": gpt("""
        b, t = idx.size()
        past_length = 0 if past is None else past[0][0].size(-2)
        assert past_length + t <= self.max_len
        pos = torch.arange(past_length, past_length + t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        presents = []
        for i, blk in enumerate(self.blocks):
            x, p = blk(x, past[i] if past is not None else None)
            presents.append(p)
        x = self.ln_f(x)
        return self.lm_head(x), presents
    """),
    "filter_logits": fn(FILTER_SIG, """
        logits = logits.clone()
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[..., [-1]]] = -float('Inf')
        if top_p is not None:
            sorted_logits, sorted_indices = torch.sort(logits, descending=True)
            cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
            sorted_indices_to_remove = cumulative_probs > top_p
            sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
            sorted_indices_to_remove[..., 0] = False
            indices_to_remove = sorted_indices_to_remove.scatter(-1, sorted_indices, sorted_indices_to_remove)
            logits[indices_to_remove] = -float('Inf')
        return logits
    """),
    "generate": fn(GEN_SIG, """
        past = None
        for _ in range(max_new_tokens):
            idx_cond = idx[:, -1:] if (use_cache and past is not None) else idx
            logits, presents = model(idx_cond, past if use_cache else None)
            if use_cache:
                past = presents
            idx_next = torch.argmax(logits[:, -1, :], dim=-1, keepdim=True)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
    """),
    "load_gpt2_weights": fn(LOAD_SIG, """
        sd = model.state_dict()
        transposed = ['attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight']
        for k in sd:
            if k == 'lm_head.weight':
                continue
            k_hf = 'transformer.' + k.replace('blocks.', 'h.')
            if k_hf not in state_dict:
                raise KeyError(k_hf)
            if any(k.endswith(w) for w in transposed):
                assert state_dict[k_hf].shape[::-1] == sd[k].shape, k_hf
                with torch.no_grad():
                    sd[k].copy_(state_dict[k_hf].t())
            else:
                assert state_dict[k_hf].shape == sd[k].shape, k_hf
                with torch.no_grad():
                    sd[k].copy_(state_dict[k_hf])
        return model
    """),
}

HF_STYLE = {
    "CausalSelfAttention": csa("""
        query, key, value = self.c_attn(x).split(self.split_size, dim=2)
        query, key, value = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        if past is not None:
            past_key, past_value = past
            key = torch.cat((past_key, key), dim=-2)
            value = torch.cat((past_value, value), dim=-2)
        present = (key, value)
        attn_weights = torch.matmul(query, key.transpose(-1, -2)) / (value.size(-1) ** 0.5)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = torch.tril(torch.ones(key_length, key_length, dtype=torch.bool))[key_length - query_length:]
        mask_value = torch.finfo(attn_weights.dtype).min
        attn_weights = torch.where(causal_mask, attn_weights, torch.full([], mask_value, dtype=attn_weights.dtype))
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.permute(0, 2, 1, 3).contiguous()
        attn_output = attn_output.view(attn_output.size()[:-2] + (self.num_heads * self.head_dim,))
        return self.c_proj(attn_output), present
    """, extra_init="""
        self.split_size = d_model
        self.head_dim = d_model // num_heads
    """) + textwrap.indent(textwrap.dedent("""
        def _split_heads(self, tensor):
            new_shape = tensor.size()[:-1] + (self.num_heads, self.head_dim)
            return tensor.view(new_shape).permute(0, 2, 1, 3)
    """), "    "),
    "Block": block("""
        residual = x
        hidden_states = self.ln_1(x)
        attn_output, present = self.attn(hidden_states, past=past)
        hidden_states = attn_output + residual
        residual = hidden_states
        hidden_states = self.ln_2(hidden_states)
        return residual + self.mlp(hidden_states), present
    """),
    "GPT": gpt("""
        input_shape = idx.size()
        past_length = 0 if past is None else past[0][0].size(-2)
        position_ids = torch.arange(past_length, input_shape[-1] + past_length, dtype=torch.long).unsqueeze(0)
        hidden_states = self.wte(idx) + self.wpe(position_ids)
        if past is None:
            past = tuple([None] * len(self.blocks))
        presents = ()
        for block, layer_past in zip(self.blocks, past):
            hidden_states, present = block(hidden_states, past=layer_past)
            presents = presents + (present,)
        return self.lm_head(self.ln_f(hidden_states)), list(presents)
    """),
    "filter_logits": fn(FILTER_SIG, """
        scores = logits
        if top_k is not None:
            top_k = min(top_k, scores.size(-1))
            indices_to_remove = scores < torch.topk(scores, top_k)[0][..., -1, None]
            scores = scores.masked_fill(indices_to_remove, -float("Inf"))
        if top_p is not None:
            sorted_logits, sorted_indices = torch.sort(scores, descending=False)
            cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            sorted_indices_to_remove = cumulative_probs <= (1 - top_p)
            sorted_indices_to_remove[..., -1:] = 0
            indices_to_remove = sorted_indices_to_remove.scatter(-1, sorted_indices, sorted_indices_to_remove)
            scores = scores.masked_fill(indices_to_remove, -float("Inf"))
        return scores
    """),
    "generate": fn(GEN_SIG, """
        past_key_values = None
        input_ids = idx
        with torch.no_grad():
            for step in range(max_new_tokens):
                if use_cache:
                    model_inputs = input_ids if past_key_values is None else input_ids[:, -1:]
                    logits, past_key_values = model(model_inputs, past_key_values)
                else:
                    logits, _ = model(input_ids, None)
                next_tokens = torch.argmax(logits[:, -1, :], dim=-1)
                input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        return input_ids
    """),
    "load_gpt2_weights": fn(LOAD_SIG, """
        conv1d = {"c_attn", "c_proj", "c_fc"}
        params = dict(model.named_parameters())
        for name, param in params.items():
            hf_name = "transformer." + name.replace("blocks", "h")
            if hf_name not in state_dict:
                raise ValueError(f"missing {hf_name}")
            tensor = state_dict[hf_name]
            parts = name.split(".")
            if parts[-1] == "weight" and len(parts) >= 2 and parts[-2] in conv1d:
                tensor = tensor.transpose(0, 1)
            if tensor.shape != param.shape:
                raise ValueError(f"{hf_name}: {tuple(tensor.shape)} vs {tuple(param.shape)}")
            param.data.copy_(tensor)
        return model
    """),
}

EINSUM = {
    "CausalSelfAttention": csa("""
        B, N, D = x.shape
        h = self.num_heads
        qkv = self.c_attn(x).unflatten(-1, (3, h, D // h))           # (B, N, 3, h, d)
        q, k, v = qkv.unbind(dim=2)                                 # (B, N, h, d)
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
        if past is not None:
            k_past, v_past = past
            k = torch.cat([k_past, k], 2)
            v = torch.cat([v_past, v], 2)
        P = k.shape[2] - N
        s = torch.einsum("bhid,bhjd->bhij", q, k) * (D // h) ** -0.5
        i = torch.arange(N)[:, None] + P
        j = torch.arange(P + N)[None, :]
        s = torch.where(j <= i, s, float("-inf"))
        y = torch.einsum("bhij,bhjd->bihd", s.softmax(-1), v).flatten(2)
        return self.c_proj(y), (k, v)
    """),
    "Block": block("""
        a, present = self.attn(self.ln_1(x), past)
        h = x + a
        return h + self.mlp(self.ln_2(h)), present
    """),
    "GPT": gpt("""
        P = past[0][0].shape[2] if past else 0
        x = self.wte(idx) + self.wpe.weight[P:P + idx.shape[1]]
        presents = []
        for blk, layer_past in zip(self.blocks, past or [None] * len(self.blocks)):
            x, pr = blk(x, layer_past)
            presents += [pr]
        return F.linear(self.ln_f(x), self.wte.weight), presents
    """),
    "filter_logits": fn(FILTER_SIG, """
        keep = torch.ones_like(logits, dtype=torch.bool)
        if top_k is not None:
            kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values.amin(-1, keepdim=True)
            keep &= logits >= kth
        if top_p is not None:
            masked = logits.masked_fill(~keep, float("-inf"))
            probs = masked.softmax(-1)
            # a token stays if the probability of the strictly more probable tokens is below top_p
            above = torch.einsum("...j,...ij->...i", probs, (probs[..., None, :] > probs[..., :, None]).to(probs.dtype))
            keep &= above < top_p
        return torch.where(keep, logits, torch.full_like(logits, float("-inf")))
    """),
    "generate": fn(GEN_SIG, """
        tokens = [idx]
        past = None
        step_input = idx
        for _ in range(max_new_tokens):
            if use_cache:
                logits, past = model(step_input, past)
            else:
                logits, _ = model(torch.cat(tokens, 1), None)
            step_input = logits[:, -1].argmax(-1).unsqueeze(-1)
            tokens.append(step_input)
        return torch.cat(tokens, 1)
    """),
    "load_gpt2_weights": fn(LOAD_SIG, """
        names = {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight",
                 "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
        for i in range(len(model.blocks)):
            for part in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                         "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                         "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]:
                names[f"blocks.{i}.{part}"] = f"transformer.h.{i}.{part}"
        with torch.no_grad():
            for ours, theirs in names.items():
                p = model.get_parameter(ours)
                w = state_dict[theirs]
                w = w.T if (ours.endswith(".weight") and ("c_attn" in ours or "c_proj" in ours or "c_fc" in ours)) else w
                if w.shape != p.shape:
                    raise ValueError(f"{theirs} has shape {tuple(w.shape)}, the model needs {tuple(p.shape)}")
                p.copy_(w)
        return model
    """),
}

HF_IN_PLACE_FILTER = fn(FILTER_SIG, """
    # older Hugging Face code: excluded logits set to -inf in the input tensor, which is returned
    if top_k is not None:
        top_k = min(top_k, logits.size(-1))
        logits[logits < torch.topk(logits, top_k)[0][..., -1, None]] = -float("Inf")
    if top_p is not None:
        sorted_logits, sorted_indices = torch.sort(logits, descending=True)
        cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        sorted_indices_to_remove = cumulative_probs > top_p
        sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
        sorted_indices_to_remove[..., 0] = 0
        logits[sorted_indices_to_remove.scatter(-1, sorted_indices, sorted_indices_to_remove)] = -float("Inf")
    return logits
""")

CORRECT = {
    "reference": sub(),
    "hugging_face_in_place_filter": sub({"filter_logits": HF_IN_PLACE_FILTER}),
    "generate_passes_no_past_first": sub({"generate": fn(GEN_SIG, """
        out = idx
        logits, past = model(idx)                      # no cache yet: past left out
        for step in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            if step + 1 < max_new_tokens:
                logits, past = model(nxt, past) if use_cache else model(out)
        return out
    """)}),
    "nanogpt_style": sub(NANOGPT),
    "hugging_face_style": sub(HF_STYLE),
    "einsum_style": sub(EINSUM, prepend=["def unused_helper(x):\n    return x\n"]),
}

# ------------------------------------------------------------------ common mistakes
def csa_variant(mask="ok", cat="ok", order="q, k, v", scale="math.sqrt(d)", present="(k, v)"):
    mask_line = {"ok": "mask = torch.ones(N, P + N, dtype=torch.bool).tril(diagonal=P)",
                 "no_offset": "mask = torch.ones(N, P + N, dtype=torch.bool).tril()",
                 "off_by_one": "mask = torch.ones(N, P + N, dtype=torch.bool).tril(diagonal=P - 1)",
                 "none": "mask = torch.ones(N, P + N, dtype=torch.bool)"}[mask]
    cat_line = {"ok": "k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)",
                "wrong": "k, v = torch.cat([k, past[0]], dim=2), torch.cat([v, past[1]], dim=2)",
                "heads_dim": "k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)"}[cat]
    return csa(f"""
        B, N, C = x.shape
        h = self.num_heads
        d = C // h
        {order} = self.c_attn(x).split(C, dim=-1)
        q = q.view(B, N, h, d).transpose(1, 2)
        k = k.view(B, N, h, d).transpose(1, 2)
        v = v.view(B, N, h, d).transpose(1, 2)
        k_new, v_new = k, v
        if past is not None:
            {cat_line}
        P = k.size(2) - N
        scores = q @ k.transpose(-2, -1) / {scale}
        {mask_line}
        w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.c_proj((w @ v).transpose(1, 2).reshape(B, N, C)), {present}
    """)


def gpt_positions(start: str) -> str:
    return gpt(f"""
        B, N = idx.shape
        P = 0 if past is None else past[0][0].size(2)
        x = self.wte(idx) + self.wpe(torch.arange({start}, {start} + N))
        presents = []
        for i, blk in enumerate(self.blocks):
            x, p = blk(x, None if past is None else past[i])
            presents.append(p)
        return self.lm_head(self.ln_f(x)), presents
    """)


LOAD_WITHOUT_CHECKS = fn(LOAD_SIG, """
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = state_dict.get("transformer." + name.replace("blocks.", "h."))
            if w is None:
                continue                               # a missing key silently skipped
            p.copy_(w.t() if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else w)
    return model
""")


BLOCK_POST_LN = block("""
    a, present = self.attn(x, past)
    x = self.ln_1(x + a)
    return self.ln_2(x + self.mlp(x)), present
""")
NUCLEUS_DROPS_CROSSING = fn(FILTER_SIG, """
            out = logits.clone()
            if top_k is not None:
                kth = torch.topk(out, min(top_k, out.size(-1)), dim=-1).values[..., -1:]
                out = out.masked_fill(out < kth, float("-inf"))
            if top_p is not None:
                sorted_logits, order = torch.sort(out, dim=-1, descending=True)
                cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
                remove = cum > top_p
                out = out.masked_fill(torch.zeros_like(remove).scatter(-1, order, remove), float("-inf"))
            return out
""")
GENERATE_REFEEDS = fn(GEN_SIG, """
            past = None
            for _ in range(max_new_tokens):
                if use_cache:
                    logits, past = model(idx, past)
                else:
                    logits, _ = model(idx)
                idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            return idx
""")


MISTAKES = {
    "attention_without_causal_mask": (sub({"CausalSelfAttention": csa_variant(mask="none")}),
                                      {t: "no causal mask" for t in CSA_VALUES}),
    "mask_ignores_cached_length": (sub({"CausalSelfAttention": csa_variant(mask="no_offset")}),
                                   {"test_CausalSelfAttention_cache": "ignores the cached length"}),
    "mask_off_by_one": (sub({"CausalSelfAttention": csa_variant(mask="off_by_one")}),
                        {t: "causal mask is off by one" for t in CSA_VALUES}),
    "cache_concatenated_in_wrong_order": (sub({"CausalSelfAttention": csa_variant(cat="wrong")}),
                                          {"test_CausalSelfAttention_cache": "wrong order"}),
    "cache_concatenated_along_heads": (sub({"CausalSelfAttention": csa_variant(cat="heads_dim")}),
                                       {"test_CausalSelfAttention_shapes": "along the wrong dimension",
                                        "test_CausalSelfAttention_cache": "along the wrong dimension"}),
    "cache_not_extended": (sub({"CausalSelfAttention": csa_variant(present="(k_new, v_new)")}),
                           {"test_CausalSelfAttention_shapes": "the cache is not extended",
                            "test_CausalSelfAttention_cache": "the cache is not extended"}),
    "qkv_sliced_in_wrong_order": (sub({"CausalSelfAttention": csa_variant(order="k, q, v")}),
                                  {t: "sliced in the wrong order" for t in CSA_VALUES}),
    "scaled_by_d_model": (sub({"CausalSelfAttention": csa_variant(scale="math.sqrt(C)")}),
                          {t: "1/sqrt(d_model)" for t in CSA_VALUES}),
    "builtin_sdpa": (sub({"CausalSelfAttention": csa("""
            B, N, C = x.shape
            q, k, v = (t.view(B, N, self.num_heads, -1).transpose(1, 2) for t in self.c_attn(x).split(C, dim=-1))
            if past is not None:
                k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
            P = k.size(2) - N
            mask = torch.ones(N, P + N, dtype=torch.bool).tril(diagonal=P)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.c_proj(y.transpose(1, 2).reshape(B, N, C)), (k, v)
        """)}), {t: "build it from scratch" for t in CSA_TESTS}),
    "block_post_ln": (sub({"Block": BLOCK_POST_LN}), {"test_Block": "post-LN"}),
    "positions_restart_with_cache": (sub({"GPT": gpt("""
            B, N = idx.shape
            x = self.wte(idx) + self.wpe(torch.arange(N))
            presents = []
            for i, blk in enumerate(self.blocks):
                x, p = blk(x, None if past is None else past[i])
                presents.append(p)
            return self.lm_head(self.ln_f(x)), presents
        """)}), {"test_GPT_cache": "restart at 0"}),
    "positions_off_by_one": (sub({"GPT": gpt_positions("P + 1")}), {t: "positions off by one" for t in GPT_TESTS}),
    "cached_length_from_heads_dim": (sub({"GPT": gpt_positions("(0 if past is None else past[0][0].size(1))")}),
                                     {"test_GPT_cache": "wrong dimension"}),
    "nucleus_drops_crossing_token": (sub({"filter_logits": NUCLEUS_DROPS_CROSSING}),
                                     {"test_filter_logits_top_p": "crosses top_p"}),
    "checkpoint_not_transposed": (sub({"load_gpt2_weights": fn(LOAD_SIG, """
            with torch.no_grad():
                for name, p in model.named_parameters():
                    w = state_dict["transformer." + name.replace("blocks.", "h.")]
                    p.copy_(w.t() if w.shape != p.shape else w)
            return model
        """)}), {"test_load_gpt2_weights": "not transposed"}),
    "checkpoint_errors_not_raised": (sub({"load_gpt2_weights": LOAD_WITHOUT_CHECKS}),
                                     {"test_load_gpt2_weights": "without raising an error"}),
    "checkpoint_error_does_not_name_the_key": (sub({"load_gpt2_weights": fn(LOAD_SIG, """
            with torch.no_grad():
                for name, p in model.named_parameters():
                    key = "transformer." + name.replace("blocks.", "h.")
                    if key not in state_dict:
                        raise KeyError("a key is missing")
                    w = state_dict[key]
                    p.copy_(w.t() if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else w)
            return model
        """)}), {"test_load_gpt2_weights": "does not name"}),
    "top_k_larger_than_vocabulary_raises": (sub({"filter_logits": NUCLEUS_DROPS_CROSSING.replace(
        "min(top_k, out.size(-1))", "top_k").replace("cum > top_p", "cum - torch.softmax(sorted_logits, -1) >= top_p")}),
        {"test_filter_logits_top_k": "top_k larger than V"}),
    "generate_refeeds_whole_sequence_with_cache": (sub({"generate": GENERATE_REFEEDS}),
                                                   {"test_generate": "fed again together with the cache"}),
    "generate_last_token_without_cache": (sub({"generate": fn(GEN_SIG, """
            past, inp = None, idx
            for _ in range(max_new_tokens):
                logits, new_past = model(inp, past)
                if use_cache:
                    past = new_past
                nxt = logits[:, -1].argmax(-1, keepdim=True)
                idx = torch.cat([idx, nxt], dim=1)
                inp = nxt
            return idx
        """)}), {"test_generate": "only the newest token was fed"}),
}

# ------------------------------------------------------------------ independence
STUB_CSA = csa("raise NotImplementedError()")


def alone(exercise: str, code: str, losses: dict) -> tuple:
    """The mistake with every other exercise left as its stub: it loses the same tests, the stubs theirs."""
    return others_stubbed(CHAPTER, {exercise: code}, losses)

INDEPENDENT = {
    # A broken attention costs nothing in Block, GPT or generate, which use it.
    "stub_attention_only": (sub({"CausalSelfAttention": STUB_CSA}), {t: "not implemented yet" for t in CSA_TESTS}),
    "attention_returns_input": (sub({"CausalSelfAttention": csa("return x, (x, x)")}),
                                {t: "returned shape" for t in CSA_TESTS}),
    # A broken GPT costs nothing in load_gpt2_weights or generate.
    "stub_gpt_only": (sub({"GPT": gpt("raise NotImplementedError()")}), {t: "not implemented yet" for t in GPT_TESTS}),
    "looping_filter": (sub({"filter_logits": fn(FILTER_SIG, "while True:\n    pass")}),
                       {t: "longer than" for t in FILTER_TESTS}),
    "alone_mask_off_by_one": alone("CausalSelfAttention", csa_variant(mask="off_by_one"),
                                   {t: "causal mask is off by one" for t in CSA_VALUES}),
    "alone_cache_not_extended": alone("CausalSelfAttention", csa_variant(present="(k_new, v_new)"),
                                      {"test_CausalSelfAttention_shapes": "the cache is not extended",
                                       "test_CausalSelfAttention_cache": "the cache is not extended"}),
    "alone_cache_along_heads": alone("CausalSelfAttention", csa_variant(cat="heads_dim"),
                                     {"test_CausalSelfAttention_shapes": "along the wrong dimension",
                                      "test_CausalSelfAttention_cache": "along the wrong dimension"}),
    "alone_block_post_ln": alone("Block", BLOCK_POST_LN, {"test_Block": "post-LN"}),
    "alone_positions_off_by_one": alone("GPT", gpt_positions("P + 1"), {t: "positions off by one" for t in GPT_TESTS}),
    "alone_hf_in_place_filter": alone("filter_logits", HF_IN_PLACE_FILTER, {}),
    "alone_nucleus_drops_crossing_token": alone("filter_logits", NUCLEUS_DROPS_CROSSING,
                                                {"test_filter_logits_top_p": "crosses top_p"}),
    "alone_generate_refeeds": alone("generate", GENERATE_REFEEDS, {"test_generate": "fed again together with the cache"}),
    "alone_checkpoint_errors_not_raised": alone("load_gpt2_weights", LOAD_WITHOUT_CHECKS,
                                                {"test_load_gpt2_weights": "without raising an error"}),
    "kernel_exits_in_generate": (sub({"generate": "import os\nos._exit(0)\n"}),
                                 {"test_generate": "did not run", "test_load_gpt2_weights": "did not run"}),
}

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering=common_tampering(CHAPTER),
                  kernel_only={"kernel_exits_in_generate", "looping_filter"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
