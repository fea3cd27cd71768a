"""Hidden tests of Chapter 5 against a catalog of correct, wrong and hostile submissions.

Every notebook is graded by the real pipeline (nbgrader autograde in a guarded kernel,
judged in the grader's own process). Expectations are written per test cell: a
correct style gets every point; a mistake loses exactly the listed tests, each with
the given message fragment, and passes every other test.
"""
from __future__ import annotations

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, body, common_tampering, others_stubbed, submitter, tampered, with_body, with_methods

CHAPTER = "05_transformer"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
ENC_TESTS = [t for t in ALL_TESTS if t.startswith("test_EncoderLayer")]
DEC_TESTS = [t for t in ALL_TESTS if t.startswith("test_DecoderLayer")]
TR_TESTS = [t for t in ALL_TESTS if t.startswith("test_Transformer")]


sub = submitter(CHAPTER)


def ffn(forward: str, extra: str = "") -> str:
    return with_body(CHAPTER, "FeedForward", "FeedForward.forward", forward, extra)


def encoder(forward: str, extra: str = "") -> str:
    return with_body(CHAPTER, "EncoderLayer", "EncoderLayer.forward", forward, extra)


def decoder(forward: str, extra: str = "") -> str:
    return with_body(CHAPTER, "DecoderLayer", "DecoderLayer.forward", forward, extra)


def transformer(methods: str) -> str:
    return with_methods(CHAPTER, "Transformer", methods)


def greedy(text: str) -> str:
    return "def greedy_decode(model, src, max_len, bos_id, eos_id, src_mask=None):\n" + body(text, 4)


STANDARD_TRANSFORMER = """
    def encode(self, src, src_mask=None):
        x = self.dropout(self.src_embed(src) * math.sqrt(self.d_model) + self.pe[:src.size(1)])
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return x

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        x = self.dropout(self.tgt_embed(tgt) * math.sqrt(self.d_model) + self.pe[:tgt.size(1)])
        for layer in self.decoder_layers:
            x = layer(x, memory, tgt_mask, src_mask)
        return x

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.out(self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask))
"""

STANDARD_GREEDY = """
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        n = ys.size(1)
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
        logits = model.out(model.decode(ys, memory, src_mask, mask))
        nxt = logits[:, -1].argmax(-1)
        ys = torch.cat([ys, nxt.unsqueeze(1)], dim=1)
        done = done | (nxt == eos_id)
        if done.all():
            break
    return ys
"""

# ------------------------------------------------------------------ correct, other styles
CORRECT = {
    "reference": sub(),
    # PyTorch's own layout: _sa_block / _ff_block helpers, F.relu, separate residual lines.
    "torch_style_blocks": sub({
        "FeedForward": ffn("return self.linear2(self.dropout(F.relu(self.linear1(x))))"),
        "EncoderLayer": encoder("""
            if self.norm_first:
                x = x + self._sa_block(self.norm1(x), mask)
                x = x + self._ff_block(self.norm2(x))
            else:
                x = self.norm1(x + self._sa_block(x, mask))
                x = self.norm2(x + self._ff_block(x))
            return x
        """, """
            def _sa_block(self, x, mask):
                x = self.self_attn(x, x, x, mask=mask)[0]
                return self.dropout(x)

            def _ff_block(self, x):
                return self.dropout(self.ffn(x))
        """),
        "DecoderLayer": decoder("""
            if self.norm_first:
                x = x + self._sa_block(self.norm1(x), tgt_mask)
                x = x + self._mha_block(self.norm2(x), memory, memory_mask)
                x = x + self.dropout(self.ffn(self.norm3(x)))
            else:
                x = self.norm1(x + self._sa_block(x, tgt_mask))
                x = self.norm2(x + self._mha_block(x, memory, memory_mask))
                x = self.norm3(x + self.dropout(self.ffn(x)))
            return x
        """, """
            def _sa_block(self, x, mask):
                return self.dropout(self.self_attn(x, x, x, mask)[0])

            def _mha_block(self, x, mem, mask):
                return self.dropout(self.cross_attn(x, mem, mem, mask)[0])
        """),
        "Transformer": transformer("""
            def _embed(self, emb, tokens):
                pos = self.pe[: tokens.shape[1]].unsqueeze(0)
                return self.dropout(emb(tokens) * self.d_model ** 0.5 + pos)

            def encode(self, src, src_mask=None):
                x = self._embed(self.src_embed, src)
                for layer in self.encoder_layers:
                    x = layer(x, mask=src_mask)
                return x

            def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
                x = self._embed(self.tgt_embed, tgt)
                for layer in self.decoder_layers:
                    x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=src_mask)
                return x

            def forward(self, src, tgt, src_mask=None, tgt_mask=None):
                memory = self.encode(src, src_mask)
                out = self.decode(tgt, memory, src_mask, tgt_mask)
                return self.out(out)
        """),
        # writes eos_id after a row's end, as many batch decoders do
        "greedy_decode": greedy("""
            B = src.shape[0]
            memory = model.encode(src, src_mask)
            out = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
            finished = torch.zeros(B, dtype=torch.bool, device=src.device)
            for step in range(max_len):
                L = out.shape[1]
                causal = torch.ones(L, L, dtype=torch.bool).tril()
                h = model.decode(out, memory, src_mask=src_mask, tgt_mask=causal)
                next_tok = model.out(h[:, -1, :]).argmax(dim=-1)
                next_tok = torch.where(finished, torch.full_like(next_tok, eos_id), next_tok)
                out = torch.cat([out, next_tok[:, None]], dim=1)
                finished |= next_tok.eq(eos_id)
                if bool(finished.all()):
                    break
            return out
        """),
    }),
    # The Annotated Transformer's style: a sublayer-connection helper and a lambda per sub-layer.
    "annotated_sublayers": sub({
        "FeedForward": ffn("return self.linear2(self.dropout(self.linear1(x).clamp(min=0)))"),
        "EncoderLayer": encoder("""
            x = self.sublayer(x, self.norm1, lambda z: self.self_attn(z, z, z, mask)[0])
            return self.sublayer(x, self.norm2, self.ffn)
        """, """
            def sublayer(self, x, norm, fn):
                if self.norm_first:
                    return x + self.dropout(fn(norm(x)))
                return norm(x + self.dropout(fn(x)))
        """),
        "DecoderLayer": decoder("""
            m = memory
            steps = [(self.norm1, lambda z: self.self_attn(z, z, z, tgt_mask)[0]),
                     (self.norm2, lambda z: self.cross_attn(z, m, m, memory_mask)[0]),
                     (self.norm3, self.ffn)]
            for norm, fn in steps:
                x = x + self.dropout(fn(norm(x))) if self.norm_first else norm(x + self.dropout(fn(x)))
            return x
        """),
        "Transformer": transformer(STANDARD_TRANSFORMER),
        # a Python list per row; pads finished rows with 0 (the seed tutorial's <pad>)
        "greedy_decode": greedy("""
            memory = model.encode(src, src_mask)
            rows = [[bos_id] for _ in range(src.size(0))]
            ended = [False] * src.size(0)
            for _ in range(max_len):
                ys = torch.tensor(rows)
                n = ys.size(1)
                causal = torch.triu(torch.ones(n, n), diagonal=1) == 0
                prob = model.out(model.decode(ys, memory, src_mask, causal)[:, n - 1])
                for b, tok in enumerate(prob.argmax(dim=1).tolist()):
                    rows[b].append(0 if ended[b] else tok)
                    ended[b] = ended[b] or tok == eos_id
                if all(ended):
                    break
            return torch.tensor(rows)
        """),
    }),
    # Functional style: F.linear, a final-norm-free loop with enumerate, a preallocated output.
    "functional_preallocated": sub({
        "FeedForward": ffn("""
            h = F.linear(x, self.linear1.weight, self.linear1.bias)
            return F.linear(self.dropout(torch.relu(h)), self.linear2.weight, self.linear2.bias)
        """),
        "EncoderLayer": encoder("""
            def attn(z):
                out, _ = self.self_attn(z, z, z, mask)
                return self.dropout(out)
            if not self.norm_first:
                h = self.norm1(x + attn(x))
                return self.norm2(h + self.dropout(self.ffn(h)))
            h = x + attn(self.norm1(x))
            return h + self.dropout(self.ffn(self.norm2(h)))
        """),
        "DecoderLayer": decoder("""
            pre = self.norm_first
            h = self.norm1(x) if pre else x
            a, _ = self.self_attn(h, h, h, mask=tgt_mask)
            x = x + self.dropout(a) if pre else self.norm1(x + self.dropout(a))
            h = self.norm2(x) if pre else x
            c, _ = self.cross_attn(h, memory, memory, mask=memory_mask)
            x = x + self.dropout(c) if pre else self.norm2(x + self.dropout(c))
            h = self.norm3(x) if pre else x
            f = self.ffn(h)
            return x + self.dropout(f) if pre else self.norm3(x + self.dropout(f))
        """),
        "Transformer": transformer("""
            def encode(self, src, src_mask=None):
                B, N = src.shape
                x = self.src_embed(src) * math.sqrt(self.d_model)
                x = self.dropout(x + self.pe[:N][None, :, :])
                for i, layer in enumerate(self.encoder_layers):
                    x = layer(x, src_mask)
                return x

            def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
                B, N = tgt.shape
                x = self.dropout(self.tgt_embed(tgt) * math.sqrt(self.d_model) + self.pe[:N])
                for layer in self.decoder_layers:
                    x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=src_mask)
                return x

            def forward(self, src, tgt, src_mask=None, tgt_mask=None):
                memory = self.encode(src, src_mask)
                return self.out(self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask))
        """),
        "greedy_decode": greedy("""
            B = src.shape[0]
            memory = model.encode(src, src_mask=src_mask)
            out = torch.zeros(B, max_len + 1, dtype=torch.long)
            out[:, 0] = bos_id
            seen = torch.zeros(B, dtype=torch.bool)
            length = max_len + 1
            for t in range(1, max_len + 1):
                mask = torch.ones(t, t).tril().bool()
                logits = model.out(model.decode(out[:, :t], memory, src_mask, mask))[:, t - 1]
                out[:, t] = torch.argmax(logits, dim=-1)
                seen = seen | (out[:, t] == eos_id)
                if seen.all():
                    length = t + 1
                    break
            return out[:, :length]
        """),
    }),
}

# ------------------------------------------------------------------ common mistakes
# The pre-LN branch of a layer, indented as the post-LN code appended to it in each case.
STD_ENC_PRE = """
            if self.norm_first:
                h = self.norm1(x)
                x = x + self.dropout(self.self_attn(h, h, h, mask)[0])
                return x + self.dropout(self.ffn(self.norm2(x)))
"""
STD_DEC_PRE = """
            if self.norm_first:
                h = self.norm1(x)
                x = x + self.dropout(self.self_attn(h, h, h, tgt_mask)[0])
                x = x + self.dropout(self.cross_attn(self.norm2(x), memory, memory, memory_mask)[0])
                return x + self.dropout(self.ffn(self.norm3(x)))
"""

MISTAKES = {
    "ffn_no_relu": (sub({"FeedForward": ffn("return self.linear2(self.dropout(self.linear1(x)))")}),
                    {"test_FeedForward": "ReLU missing"}),
    "enc_norm_before_residual_sum": (sub({"EncoderLayer": encoder(STD_ENC_PRE + """
            x = x + self.norm1(self.dropout(self.self_attn(x, x, x, mask)[0]))
            return x + self.norm2(self.dropout(self.ffn(x)))
        """)}), {"test_EncoderLayer_post_ln": "norm before the residual sum",
                 "test_EncoderLayer_mask": "norm before the residual sum"}),
    "enc_norm_first_ignored": (sub({"EncoderLayer": encoder("""
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)[0]))
            return self.norm2(x + self.dropout(self.ffn(x)))
        """)}), {"test_EncoderLayer_pre_ln": "norm_first ignored", "test_EncoderLayer_mask": "norm_first ignored"}),
    "enc_mask_not_passed": (sub({"EncoderLayer": encoder(STD_ENC_PRE.replace("h, h, h, mask", "h, h, h") + """
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x)[0]))
            return self.norm2(x + self.dropout(self.ffn(x)))
        """)}), {"test_EncoderLayer_mask": "mask not passed down", "test_EncoderLayer_pre_ln": "mask not passed down"}),
    "dec_cross_attention_kv_from_decoder": (sub({"DecoderLayer": decoder(STD_DEC_PRE.replace(
        "self.norm2(x), memory, memory, memory_mask", "self.norm2(x), self.norm2(x), self.norm2(x), memory_mask") + """
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, x, x, memory_mask)[0]))
            return self.norm3(x + self.dropout(self.ffn(x)))
        """)}), {t: "keys and values taken from the decoder input" for t in DEC_TESTS}),
    "dec_norm_first_ignored": (sub({"DecoderLayer": decoder("""
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, memory_mask)[0]))
            return self.norm3(x + self.dropout(self.ffn(x)))
        """)}), {"test_DecoderLayer_pre_ln": "norm_first ignored", "test_DecoderLayer_masks": "norm_first ignored"}),
    "dec_norm_before_residual_sum": (sub({"DecoderLayer": decoder(STD_DEC_PRE + """
            x = x + self.norm1(self.self_attn(x, x, x, tgt_mask)[0])
            x = x + self.norm2(self.cross_attn(x, memory, memory, memory_mask)[0])
            return x + self.norm3(self.ffn(x))
        """)}), {"test_DecoderLayer_post_ln": "norm before the residual sum",
                 "test_DecoderLayer_masks": "norm before the residual sum"}),
    "dec_tgt_mask_not_passed": (sub({"DecoderLayer": decoder(STD_DEC_PRE.replace("h, h, h, tgt_mask", "h, h, h") + """
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, memory_mask)[0]))
            return self.norm3(x + self.dropout(self.ffn(x)))
        """)}), {"test_DecoderLayer_masks": "tgt_mask not passed down"}),
    "tr_embeddings_not_scaled": (sub({"Transformer": transformer(
        STANDARD_TRANSFORMER.replace(" * math.sqrt(self.d_model)", ""))}),
        {t: "not scaled by sqrt(d_model)" for t in TR_TESTS}),
    "tr_extra_final_norm": (sub({"Transformer": transformer(STANDARD_TRANSFORMER.replace(
        "        return x\n", "        return F.layer_norm(x, (self.d_model,))\n"))}),
        {t: "extra final norm" for t in TR_TESTS}),
    "tr_src_mask_not_passed_to_encoder": (sub({"Transformer": transformer(STANDARD_TRANSFORMER.replace(
        "x = layer(x, src_mask)", "x = layer(x)"))}),
        {"test_Transformer_encode": "src_mask not passed down", "test_Transformer_forward": "src_mask not passed down"}),
    "greedy_stops_when_any_row_ends": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "if done.all():", "if done.any():"))}), {"test_greedy_decode": "stops when any row ends"}),
    "greedy_drops_start_token": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "    return ys", "    return ys[:, 1:]"))}), {"test_greedy_decode": "start token dropped"}),
    "greedy_argmax_at_first_position": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "logits[:, -1].argmax(-1)", "logits[:, 0].argmax(-1)"))}), {"test_greedy_decode": "wrong position"}),
    "ffn_gelu": (sub({"FeedForward": ffn("return self.linear2(self.dropout(F.gelu(self.linear1(x))))")}),
                 {"test_FeedForward": "GELU instead of ReLU"}),
    "dec_cross_attention_queries_from_memory": (sub({"DecoderLayer": decoder(STD_DEC_PRE.replace(
        "self.norm2(x), memory, memory, memory_mask", "memory, self.norm2(x), self.norm2(x), memory_mask") + """
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(memory, x, x, memory_mask)[0]))
            return self.norm3(x + self.dropout(self.ffn(x)))
        """)}), {t: "queries taken from memory" for t in DEC_TESTS}),   # named even where N_src != N_tgt fails
    "dec_masks_swapped": (sub({"DecoderLayer": decoder(STD_DEC_PRE.replace("h, h, h, tgt_mask", "h, h, h, memory_mask")
                                                       .replace("memory, memory, memory_mask", "memory, memory, tgt_mask") + """
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, memory_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, tgt_mask)[0]))
            return self.norm3(x + self.dropout(self.ffn(x)))
        """)}), {"test_DecoderLayer_masks": "masks swapped"}),
    "tr_forward_softmax": (sub({"Transformer": transformer(STANDARD_TRANSFORMER.replace(
        "return self.out(self.decode(", "return torch.softmax(self.out(self.decode(").replace(
        "src_mask, tgt_mask))\n", "src_mask, tgt_mask)), dim=-1)\n"))}),
        {"test_Transformer_forward": "returns probabilities"}),
    "tr_decode_uses_src_embed": (sub({"Transformer": transformer(STANDARD_TRANSFORMER.replace(
        "self.tgt_embed(tgt)", "self.src_embed(tgt)"))}),
        {"test_Transformer_decode": "not src_embed", "test_Transformer_forward": "not src_embed"}),
    "greedy_never_stops": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "        if done.all():\n            break\n", ""))}), {"test_greedy_decode": "never stops early"}),
    "greedy_without_causal_mask": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "model.decode(ys, memory, src_mask, mask)", "model.decode(ys, memory, src_mask)"))}),
        {"test_greedy_decode": "no causal tgt_mask"}),
    "greedy_one_short": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "range(max_len)", "range(max_len - 1)"))}), {"test_greedy_decode": "one token short"}),
    "greedy_src_mask_dropped": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "model.encode(src, src_mask)", "model.encode(src)").replace(
        "model.decode(ys, memory, src_mask, mask)", "model.decode(ys, memory, None, mask)"))}),
        {"test_greedy_decode": "src_mask not passed"}),
    "builtin_multihead_attention_in_decoder": (sub({"DecoderLayer": decoder("""
            B, N, d = x.shape
            mha = nn.MultiheadAttention(d, self.self_attn.num_heads, batch_first=True).to(x.dtype)
            x = self.norm1(x + self.self_attn(x, x, x, tgt_mask)[0])
            x = self.norm2(x + mha(x, memory, memory, need_weights=False)[0])
            return self.norm3(x + self.ffn(x))
        """)}), {t: "build it from scratch" for t in DEC_TESTS}),
    "builtin_encoder_layer": (sub({"EncoderLayer": encoder("""
            d = x.shape[-1]
            layer = nn.TransformerEncoderLayer(d, self.self_attn.num_heads, self.ffn.linear1.out_features,
                                               dropout=0.0, batch_first=True, norm_first=self.norm_first)
            with torch.no_grad():
                a = self.self_attn
                layer.self_attn.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
                layer.self_attn.in_proj_bias.copy_(torch.cat([a.W_q.bias, a.W_k.bias, a.W_v.bias]))
                layer.self_attn.out_proj.load_state_dict(a.W_o.state_dict())
                layer.linear1.load_state_dict(self.ffn.linear1.state_dict())
                layer.linear2.load_state_dict(self.ffn.linear2.state_dict())
                layer.norm1.load_state_dict(self.norm1.state_dict())
                layer.norm2.load_state_dict(self.norm2.state_dict())
            m = None if mask is None else ~mask.expand(x.shape[0], a.num_heads, x.shape[1], x.shape[1]).reshape(-1, x.shape[1], x.shape[1])
            return layer.to(x.dtype)(x, src_mask=m)
        """)}), {t: "build it from scratch" for t in ENC_TESTS}),
}

# Two more decoding styles: padding after a row's end, and one row at a time.
CORRECT["greedy_pads_after_end"] = sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
    "        nxt = logits[:, -1].argmax(-1)\n",
    "        nxt = logits[:, -1].argmax(-1)\n        nxt = nxt.masked_fill(done, 0)\n"))})
CORRECT["greedy_row_by_row"] = sub({"greedy_decode": greedy("""
    rows = []
    for b in range(src.size(0)):
        s = src[b:b + 1]
        m = None if src_mask is None else src_mask[b:b + 1]
        memory = model.encode(s, m)
        tokens = [bos_id]
        while len(tokens) <= max_len:
            n = len(tokens)
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            logits = model.out(model.decode(torch.tensor([tokens]), memory, m, causal))
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == eos_id:
                break
        rows.append(tokens)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [eos_id] * (width - len(r)) for r in rows])
""")})

# More styles by a different hand: nn.Sequential and einsum for the network, a loop over sub-layers,
# (1, 1, n, n) masks passed by keyword, and a while loop that fills a preallocated batch.
CORRECT["sequential_einsum_while"] = sub({
    "FeedForward": ffn("""
        net = nn.Sequential(self.linear1, nn.ReLU(), self.dropout, self.linear2)
        return net(x)
    """),
    "EncoderLayer": encoder("""
        subs = [(self.norm1, lambda z: self.self_attn(z, z, z, mask=mask)[0]), (self.norm2, self.ffn)]
        for norm, fn in subs:
            x = x + self.dropout(fn(norm(x))) if self.norm_first else norm(x + self.dropout(fn(x)))
        return x
    """),
    "DecoderLayer": decoder("""
        subs = [(self.norm1, lambda z: self.self_attn(z, z, z, mask=tgt_mask)[0]),
                (self.norm2, lambda z: self.cross_attn(z, memory, memory, mask=memory_mask)[0]),
                (self.norm3, self.ffn)]
        for norm, fn in subs:
            if self.norm_first:
                x = x + self.dropout(fn(norm(x)))
            else:
                x = norm(x + self.dropout(fn(x)))
        return x
    """),
    "Transformer": transformer("""
        def _embed(self, table, ids):
            e = torch.einsum("bnd,->bnd", table(ids), torch.tensor(self.d_model, dtype=torch.float32).sqrt())
            return self.dropout(e + self.pe[None, : ids.shape[-1], :])

        def encode(self, src, src_mask=None):
            h = self._embed(self.src_embed, src)
            for enc in self.encoder_layers:
                h = enc(h, mask=src_mask)
            return h

        def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
            h = self._embed(self.tgt_embed, tgt)
            for dec in self.decoder_layers:
                h = dec(h, memory, memory_mask=src_mask, tgt_mask=tgt_mask)
            return h

        def forward(self, src, tgt, src_mask=None, tgt_mask=None):
            return self.out(self.decode(tgt, self.encode(src, src_mask=src_mask), src_mask=src_mask,
                                        tgt_mask=tgt_mask))
    """),
    "greedy_decode": greedy("""
        B = src.size(0)
        memory = model.encode(src, src_mask=src_mask)
        ys = torch.full((B, max_len + 1), bos_id, dtype=torch.long)
        ended = torch.zeros(B, dtype=torch.bool)
        t = 1
        while t <= max_len and not ended.all():
            causal = torch.tril(torch.ones(1, 1, t, t)).bool()
            hidden = model.decode(ys[:, :t], memory, src_mask=src_mask, tgt_mask=causal)
            ys[:, t] = model.out(hidden[:, t - 1]).argmax(-1)
            ended = ended | ys[:, t].eq(eos_id)
            t += 1
        return ys[:, :t]
    """),
})
# Dropout written with F.dropout, passing the module's mode: correct in eval() mode too.
CORRECT["functional_dropout_with_training_flag"] = sub({"FeedForward": ffn(
    "return self.linear2(F.dropout(F.relu(self.linear1(x)), self.dropout.p, self.training))")})

MISTAKES.update({
    "ffn_dropout_always_on": (sub({"FeedForward": ffn(
        "return self.linear2(F.dropout(F.relu(self.linear1(x)), self.dropout.p))")}),
        {"test_FeedForward": "dropout active in eval() mode"}),
    "enc_no_residual": (sub({"EncoderLayer": encoder("""
            if self.norm_first:
                x = self.dropout(self.self_attn(self.norm1(x), self.norm1(x), self.norm1(x), mask)[0])
                return self.dropout(self.ffn(self.norm2(x)))
            x = self.norm1(self.dropout(self.self_attn(x, x, x, mask)[0]))
            return self.norm2(self.dropout(self.ffn(x)))
        """)}), {t: "residual connection missing" for t in ENC_TESTS}),
    "dec_no_residual": (sub({"DecoderLayer": decoder(STD_DEC_PRE + """
            x = self.norm1(self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(self.dropout(self.cross_attn(x, memory, memory, memory_mask)[0]))
            return self.norm3(self.dropout(self.ffn(x)))
        """)}), {"test_DecoderLayer_post_ln": "residual connection missing",
                 "test_DecoderLayer_masks": "residual connection missing"}),
    "dec_memory_mask_not_passed": (sub({"DecoderLayer": decoder(STD_DEC_PRE.replace(
        "memory, memory, memory_mask", "memory, memory") + """
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory)[0]))
            return self.norm3(x + self.dropout(self.ffn(x)))
        """)}), {"test_DecoderLayer_masks": "memory_mask not passed down"}),
    "enc_pre_ln_normalised_residual": (sub({"EncoderLayer": encoder("""
            if self.norm_first:
                h = self.norm1(x)
                x = h + self.dropout(self.self_attn(h, h, h, mask)[0])
                h = self.norm2(x)
                return h + self.dropout(self.ffn(h))
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)[0]))
            return self.norm2(x + self.dropout(self.ffn(x)))
        """)}), {"test_EncoderLayer_pre_ln": "pre-LN residual adds the normalised input",
                 "test_EncoderLayer_mask": "pre-LN residual adds the normalised input"}),
    "greedy_runs_the_model_every_step": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "model.out(model.decode(ys, memory, src_mask, mask))", "model(src, ys, src_mask, mask)"))}),
        {"test_greedy_decode": "calls the model itself"}),
    "greedy_encodes_every_step": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "model.decode(ys, memory, src_mask, mask)", "model.decode(ys, model.encode(src, src_mask), src_mask, mask)"))}),
        {"test_greedy_decode": "the encoder runs at every step"}),
    "greedy_causal_mask_triu": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace("torch.tril(", "torch.triu("))}),
                                {"test_greedy_decode": "causal mask upside down"}),
    "greedy_causal_mask_inverted": (sub({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "mask = torch.tril(", "mask = ~torch.tril("))}), {"test_greedy_decode": "causal mask polarity inverted"}),
})

# ------------------------------------------------------------------ independence
INDEPENDENT = {
    # Broken earlier exercises cost nothing in the later ones that use them.
    "broken_feed_forward": (sub({"FeedForward": ffn("return x")}), {"test_FeedForward": "values differ from the reference"}),
    "broken_layers": (sub({"EncoderLayer": encoder("return x"), "DecoderLayer": decoder("return x")}),
                      {t: "values differ from the reference" for t in ENC_TESTS + DEC_TESTS}),
    "stub_transformer_only": (sub({"Transformer": transformer(
        "def encode(self, src, src_mask=None):\n    raise NotImplementedError()")}),
        {"test_Transformer_encode": "not implemented yet", "test_Transformer_decode": "has no attribute 'decode'",
         "test_Transformer_forward": "not implemented yet"}),
    "looping_greedy": (sub({"greedy_decode": greedy("while True:\n    pass")}), {"test_greedy_decode": "longer than"}),
    "kernel_exits_in_greedy_decode": (sub({"greedy_decode": "import os\nos._exit(0)\n"}),
                                      {"test_greedy_decode": "did not run"}),
}


def alone(case: str) -> tuple:
    """A catalog case's answers with every other exercise left as its stub: the same losses, plus the stubs'."""
    return others_stubbed(CHAPTER, *ALONE_ANSWERS[case])


ALONE_ANSWERS = {
    "ffn_dropout_always_on": ({"FeedForward": ffn(
        "return self.linear2(F.dropout(F.relu(self.linear1(x)), self.dropout.p))")},
        {"test_FeedForward": "dropout active in eval() mode"}),
    "enc_no_residual": ({"EncoderLayer": encoder("""
            if self.norm_first:
                x = self.dropout(self.self_attn(self.norm1(x), self.norm1(x), self.norm1(x), mask)[0])
                return self.dropout(self.ffn(self.norm2(x)))
            x = self.norm1(self.dropout(self.self_attn(x, x, x, mask)[0]))
            return self.norm2(self.dropout(self.ffn(x)))
        """)}, {t: "residual connection missing" for t in ENC_TESTS}),
    "dec_memory_mask_not_passed": ({"DecoderLayer": decoder(STD_DEC_PRE.replace(
        "memory, memory, memory_mask", "memory, memory") + """
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory)[0]))
            return self.norm3(x + self.dropout(self.ffn(x)))
        """)}, {"test_DecoderLayer_masks": "memory_mask not passed down"}),
    "tr_embeddings_not_scaled": ({"Transformer": transformer(
        STANDARD_TRANSFORMER.replace(" * math.sqrt(self.d_model)", ""))},
        {t: "not scaled by sqrt(d_model)" for t in TR_TESTS}),
    "greedy_runs_the_model_every_step": ({"greedy_decode": greedy(STANDARD_GREEDY.replace(
        "model.out(model.decode(ys, memory, src_mask, mask))", "model(src, ys, src_mask, mask)"))},
        {"test_greedy_decode": "calls the model itself"}),
    "greedy_correct": ({"greedy_decode": greedy(STANDARD_GREEDY)}, {}),
}
INDEPENDENT.update({f"alone:{case}": alone(case) for case in ALONE_ANSWERS})

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
# After every stub (tests/catalog.py: tampered): layers that hand the work to PyTorch's own, under the given names.
TAMPERING_AFTER_STUBS = {
    "builtin_after_stubs": ["class EncoderLayer(nn.TransformerEncoderLayer):\n"
                            "    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):\n"
                            "        super().__init__(d_model, num_heads, d_ff, dropout, batch_first=True, norm_first=norm_first)\n"
                            "    def forward(self, x, mask=None):\n"
                            "        return super().forward(x, src_mask=None if mask is None else ~mask.squeeze())\n"
                            "def greedy_decode(model, src, max_len, bos_id, eos_id, src_mask=None):\n"
                            "    return torch.full((src.shape[0], max_len + 1), bos_id)\n"],
}

CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering={**common_tampering(CHAPTER),
                             **{k: tampered(CHAPTER, after_stubs=v) for k, v in TAMPERING_AFTER_STUBS.items()}},
                  kernel_only={"kernel_exits_in_greedy_decode", "looping_greedy"},
                  # messages about memory, seen given the same way by the kernel
                  sampled={"alone:dec_memory_mask_not_passed", "dec_cross_attention_queries_from_memory",
                           "dec_memory_mask_not_passed"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
