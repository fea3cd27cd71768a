"""Reference solution (instructor-only) for chapter 05_transformer.

generated from course/05_transformer.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# Chapter 3's code, unchanged (copied from course/03_multi_head_attention.py when the course is generated)
def scaled_dot_product_attention(query, key, value, mask=None):
    """Given (Chapter 2): softmax(query @ key^T / sqrt(d_k)) @ value.

    query (..., N_q, d_k), key (..., N_k, d_k), value (..., N_k, d_v); mask: bool,
    broadcastable to (..., N_q, N_k), True = may attend.
    Returns (output (..., N_q, d_v), weights (..., N_q, N_k)).
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, N_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)                   # (..., N_q, N_k)
    return weights @ value, weights                           # (..., N_q, d_v)


class MultiHeadAttention(nn.Module):
    """Given (Chapter 3): multi-head attention; head i uses features i*d_k:(i+1)*d_k."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        self.last_weights = None   # (B, h, N_q, N_k) of the last call, for plots

    def forward(self, query, key, value, mask=None):
        """query (B, N_q, d_model), key and value (B, N_k, d_model); mask broadcastable
        to (B, h, N_q, N_k), True = may attend. Returns (output (B, N_q, d_model),
        weights (B, h, N_q, N_k))."""
        B, N_q, d_model = query.shape
        h, d_k = self.num_heads, self.d_k
        q = self.W_q(query).view(B, N_q, h, d_k).transpose(1, 2)   # (B, h, N_q, d_k)
        k = self.W_k(key).view(B, -1, h, d_k).transpose(1, 2)      # (B, h, N_k, d_k)
        v = self.W_v(value).view(B, -1, h, d_k).transpose(1, 2)    # (B, h, N_k, d_k)
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        self.last_weights = weights.detach()
        return self.W_o(out.transpose(1, 2).reshape(B, N_q, d_model)), weights


def sinusoidal_encoding(max_len, d_model):
    """Given (Chapter 4): the (max_len, d_model) sinusoidal table, sin and cos interleaved."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]          # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)           # (d_model / 2,)
    angle = pos / 10000 ** (two_i / d_model)                           # (max_len, d_model / 2)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe


class StandInEncoderLayer(nn.Module):
    """EncoderLayer's interface, a simpler computation: x -> tanh(x + self_attn(x, x, x, mask))."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)

    def forward(self, x, mask=None):
        return torch.tanh(x + self.self_attn(x, x, x, mask)[0])


class StandInDecoderLayer(nn.Module):
    """DecoderLayer's interface: masked self-attention, then cross-attention to memory, no norms."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = x + self.self_attn(x, x, x, tgt_mask)[0]
        return torch.tanh(x + self.cross_attn(x, memory, memory, memory_mask)[0])


def with_stand_in_layers(model):
    """The Transformer `model` with each of its layers replaced by a stand-in of the same width."""
    d_model, num_heads = model.d_model, model.encoder_layers[0].self_attn.num_heads
    model.encoder_layers = nn.ModuleList(StandInEncoderLayer(d_model, num_heads) for _ in model.encoder_layers)
    model.decoder_layers = nn.ModuleList(StandInDecoderLayer(d_model, num_heads) for _ in model.decoder_layers)
    return model


class FeedForward(nn.Module):
    """Position-wise feed-forward network: linear2(dropout(relu(linear1(x))))."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        """Apply the same two-layer network to every position.

        Args:
            x: float tensor (..., d_model), usually (B, N, d_model).

        Returns:
            a tensor of the same shape and dtype as x:
            linear2(dropout(relu(linear1(x)))). Dropout comes after the ReLU,
            inside the network; in eval() mode it does nothing.
        """
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each with a residual connection and a LayerNorm."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        """One encoder layer.

        Args:
            x: float tensor (B, N, d_model).
            mask: optional bool tensor broadcastable to (B, h, N, N), True = may
                attend; usually a padding mask of shape (B, 1, 1, N). Pass it to
                the self-attention.

        Returns:
            x after both sub-layers, (B, N, d_model), same dtype.
            Post-LN (norm_first False):
                x = norm1(x + dropout(attn(x))); x = norm2(x + dropout(ffn(x)))
            Pre-LN (norm_first True):
                x = x + dropout(attn(norm1(x))); x = x + dropout(ffn(norm2(x)))
            where attn(z) is the output (not the weights) of
            self.self_attn(z, z, z, mask).
        """
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, mask)[0])
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)[0]))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention and feed-forward, each with residual and LayerNorm."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        """One decoder layer.

        Args:
            x: float tensor (B, N_tgt, d_model), the decoder's sequence.
            memory: float tensor (B, N_src, d_model), the encoder's output.
            tgt_mask: optional bool mask for the self-attention, broadcastable to
                (B, h, N_tgt, N_tgt), True = may attend (usually causal).
            memory_mask: optional bool mask for the cross-attention,
                broadcastable to (B, h, N_tgt, N_src) (usually (B, 1, 1, N_src)).

        Returns:
            x after the three sub-layers, (B, N_tgt, d_model):
            self_attn(x, x, x, tgt_mask), then cross_attn(x, memory, memory,
            memory_mask) (queries from x, keys and values from memory), then
            ffn, each with dropout, residual and norm1 / norm2 / norm3, post-LN
            by default and pre-LN when self.norm_first (as in EncoderLayer;
            memory itself is never normalised here).
        """
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, tgt_mask)[0])
            x = x + self.dropout(self.cross_attn(self.norm2(x), memory, memory, memory_mask)[0])
            x = x + self.dropout(self.ffn(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, memory_mask)[0]))
            x = self.norm3(x + self.dropout(self.ffn(x)))
        return x


class Transformer(nn.Module):
    """Encoder-decoder Transformer (post-LN, as in the paper)."""

    def __init__(self, src_vocab, tgt_vocab, d_model, num_heads, num_layers, d_ff, max_len=512, dropout=0.0):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model))   # (max_len, d_model)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.out = nn.Linear(d_model, tgt_vocab)
        self.dropout = nn.Dropout(dropout)   # on embeddings + positions, as in the paper

    def encode(self, src, src_mask=None):
        """src: long (B, N_src) token ids; src_mask: optional bool, broadcastable to
        (B, h, N_src, N_src), True = may attend (usually (B, 1, 1, N_src)).

        Embed (src_embed), multiply by sqrt(d_model), add self.pe[:N_src], apply
        self.dropout, then every encoder layer in order with src_mask.
        Returns the memory (B, N_src, d_model). No LayerNorm after the stack.
        """
        x = self.src_embed(src) * math.sqrt(self.d_model) + self.pe[:src.size(1)]   # (B, N_src, d_model)
        x = self.dropout(x)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return x

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        """tgt: long (B, N_tgt); memory: (B, N_src, d_model); src_mask: the source mask
        (each decoder layer's memory_mask); tgt_mask: optional bool mask for the decoder
        self-attention, broadcastable to (B, h, N_tgt, N_tgt).

        Embed (tgt_embed), multiply by sqrt(d_model), add self.pe[:N_tgt], dropout, then
        every decoder layer in order: layer(x, memory, tgt_mask, src_mask).
        Returns the hidden states (B, N_tgt, d_model), not the logits.
        """
        x = self.tgt_embed(tgt) * math.sqrt(self.d_model) + self.pe[:tgt.size(1)]   # (B, N_tgt, d_model)
        x = self.dropout(x)
        for layer in self.decoder_layers:
            x = layer(x, memory, tgt_mask, src_mask)
        return x

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        """Logits (B, N_tgt, tgt_vocab) = self.out(decode(tgt, encode(src, src_mask),
        src_mask, tgt_mask)). No softmax."""
        memory = self.encode(src, src_mask)
        return self.out(self.decode(tgt, memory, src_mask, tgt_mask))


def greedy_decode(model, src, max_len, bos_id, eos_id, src_mask=None):
    """Greedy decoding with a trained Transformer, for a whole batch.

    Args:
        model: a Transformer; use only model.encode (once, before the loop: the
            memory does not change), model.decode and model.out.
        src: long (B, N_src) source ids.
        max_len: the largest number of tokens to generate after bos_id.
        bos_id, eos_id: the start and end token ids (ints).
        src_mask: optional bool source mask, as for model.encode.

    Returns:
        a long tensor (B, L) with L <= max_len + 1: column 0 is bos_id, and each
        next column holds, for every row, the argmax of the logits at the LAST
        position of model.out(model.decode(tokens so far, memory, src_mask,
        causal mask)). Stop as soon as every row has produced eos_id (then L is
        the number of steps taken + 1), else after max_len steps. What a row
        holds after its first eos_id is not graded.
    """
    memory = model.encode(src, src_mask)                                   # (B, N_src, d_model), once
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)   # (B, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        n = ys.size(1)
        causal = torch.ones(n, n, dtype=torch.bool, device=src.device).tril()
        logits = model.out(model.decode(ys, memory, src_mask, causal)[:, -1])   # (B, V): last position
        next_token = logits.argmax(dim=-1)                                 # (B,)
        ys = torch.cat([ys, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return ys


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n# Chapter 3\'s code, unchanged (copied from course/03_multi_head_attention.py when the course is generated)\ndef scaled_dot_product_attention(query, key, value, mask=None):\n    """Given (Chapter 2): softmax(query @ key^T / sqrt(d_k)) @ value.\n\n    query (..., N_q, d_k), key (..., N_k, d_k), value (..., N_k, d_v); mask: bool,\n    broadcastable to (..., N_q, N_k), True = may attend.\n    Returns (output (..., N_q, d_v), weights (..., N_q, N_k)).\n    """\n    d_k = query.size(-1)\n    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, N_k)\n    if mask is not None:\n        scores = scores.masked_fill(~mask, float("-inf"))\n    weights = torch.softmax(scores, dim=-1)                   # (..., N_q, N_k)\n    return weights @ value, weights                           # (..., N_q, d_v)\nclass MultiHeadAttention(nn.Module):\n    """Given (Chapter 3): multi-head attention; head i uses features i*d_k:(i+1)*d_k."""\n\n    def __init__(self, d_model, num_heads):\n        super().__init__()\n        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"\n        self.num_heads = num_heads\n        self.d_k = d_model // num_heads\n        self.W_q = nn.Linear(d_model, d_model)\n        self.W_k = nn.Linear(d_model, d_model)\n        self.W_v = nn.Linear(d_model, d_model)\n        self.W_o = nn.Linear(d_model, d_model)\n        self.last_weights = None   # (B, h, N_q, N_k) of the last call, for plots\n\n    def forward(self, query, key, value, mask=None):\n        """query (B, N_q, d_model), key and value (B, N_k, d_model); mask broadcastable\n        to (B, h, N_q, N_k), True = may attend. Returns (output (B, N_q, d_model),\n        weights (B, h, N_q, N_k))."""\n        B, N_q, d_model = query.shape\n        h, d_k = self.num_heads, self.d_k\n        q = self.W_q(query).view(B, N_q, h, d_k).transpose(1, 2)   # (B, h, N_q, d_k)\n        k = self.W_k(key).view(B, -1, h, d_k).transpose(1, 2)      # (B, h, N_k, d_k)\n        v = self.W_v(value).view(B, -1, h, d_k).transpose(1, 2)    # (B, h, N_k, d_k)\n        out, weights = scaled_dot_product_attention(q, k, v, mask)\n        self.last_weights = weights.detach()\n        return self.W_o(out.transpose(1, 2).reshape(B, N_q, d_model)), weights\n\n\ndef sinusoidal_encoding(max_len, d_model):\n    """Given (Chapter 4): the (max_len, d_model) sinusoidal table, sin and cos interleaved."""\n    pos = torch.arange(max_len, dtype=torch.float32)[:, None]          # (max_len, 1)\n    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)           # (d_model / 2,)\n    angle = pos / 10000 ** (two_i / d_model)                           # (max_len, d_model / 2)\n    pe = torch.zeros(max_len, d_model)\n    pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(angle)\n    return pe\nclass StandInEncoderLayer(nn.Module):\n    """EncoderLayer\'s interface, a simpler computation: x -> tanh(x + self_attn(x, x, x, mask))."""\n\n    def __init__(self, d_model, num_heads):\n        super().__init__()\n        self.self_attn = MultiHeadAttention(d_model, num_heads)\n\n    def forward(self, x, mask=None):\n        return torch.tanh(x + self.self_attn(x, x, x, mask)[0])\n\n\nclass StandInDecoderLayer(nn.Module):\n    """DecoderLayer\'s interface: masked self-attention, then cross-attention to memory, no norms."""\n\n    def __init__(self, d_model, num_heads):\n        super().__init__()\n        self.self_attn = MultiHeadAttention(d_model, num_heads)\n        self.cross_attn = MultiHeadAttention(d_model, num_heads)\n\n    def forward(self, x, memory, tgt_mask=None, memory_mask=None):\n        x = x + self.self_attn(x, x, x, tgt_mask)[0]\n        return torch.tanh(x + self.cross_attn(x, memory, memory, memory_mask)[0])\n\n\ndef with_stand_in_layers(model):\n    """The Transformer `model` with each of its layers replaced by a stand-in of the same width."""\n    d_model, num_heads = model.d_model, model.encoder_layers[0].self_attn.num_heads\n    model.encoder_layers = nn.ModuleList(StandInEncoderLayer(d_model, num_heads) for _ in model.encoder_layers)\n    model.decoder_layers = nn.ModuleList(StandInDecoderLayer(d_model, num_heads) for _ in model.decoder_layers)\n    return model'
