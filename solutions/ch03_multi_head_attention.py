"""Reference solution (instructor-only) for chapter 03_multi_head_attention.

generated from course/03_multi_head_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


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


def split_heads(x, num_heads):
    """Regroup the features of x into heads.

    Args:
        x: tensor of shape (B, N, h*d), with h = num_heads.
        num_heads: the number of heads h; the last dimension of x is a
            multiple of it.

    Returns a tensor of shape (B, h, N, d) whose [b, i, n] entry is head i's
    slice of token n, that is the features i*d : (i+1)*d of x[b, n]
    (consecutive blocks, head 0 first).
    """
    B, N, C = x.size()
    d = C // num_heads
    # reshape, not view: it also accepts an input that is not contiguous in memory
    return x.reshape(B, N, num_heads, d).transpose(1, 2)  # (B, h, N, d)


def merge_heads(x):
    """Concatenate the heads of x again (the inverse of split_heads).

    Args:
        x: tensor of shape (B, h, N, d).

    Returns a tensor of shape (B, N, h*d) whose [b, n] row is the
    concatenation x[b, 0, n], x[b, 1, n], ..., x[b, h-1, n] (head 0 first).
    """
    B, h, N, d = x.size()
    return x.transpose(1, 2).reshape(B, N, h * d)  # (B, N, h*d)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        """Attend from every position of query to every position of key/value.

        Args:
            query: (B, N_q, d_model).
            key:   (B, N_k, d_model).
            value: (B, N_k, d_model).
            mask:  optional bool tensor broadcastable to (B, h, N_q, N_k),
                   True = may attend.

        Project query, key and value with self.W_q, self.W_k, self.W_v, split
        each into self.num_heads heads (split_heads), attend in every head at
        once with scaled_dot_product_attention (scores scaled by 1/sqrt(d_k),
        d_k = d_model // num_heads), concatenate the heads in order
        (merge_heads) and apply self.W_o.

        Returns:
            (output, weights) with output (B, N_q, d_model) and weights
            (B, h, N_q, N_k), the attention weights of every head.
        """
        q = split_heads(self.W_q(query), self.num_heads)   # (B, h, N_q, d_k)
        k = split_heads(self.W_k(key), self.num_heads)     # (B, h, N_k, d_k)
        v = split_heads(self.W_v(value), self.num_heads)   # (B, h, N_k, d_k)
        out, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, h, N_q, d_k), (B, h, N_q, N_k)
        return self.W_o(merge_heads(out)), weights         # (B, N_q, d_model)


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\ndef scaled_dot_product_attention(query, key, value, mask=None):\n    """Given (Chapter 2): softmax(query @ key^T / sqrt(d_k)) @ value.\n\n    query (..., N_q, d_k), key (..., N_k, d_k), value (..., N_k, d_v); mask: bool,\n    broadcastable to (..., N_q, N_k), True = may attend.\n    Returns (output (..., N_q, d_v), weights (..., N_q, N_k)).\n    """\n    d_k = query.size(-1)\n    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, N_k)\n    if mask is not None:\n        scores = scores.masked_fill(~mask, float("-inf"))\n    weights = torch.softmax(scores, dim=-1)                   # (..., N_q, N_k)\n    return weights @ value, weights                           # (..., N_q, d_v)'
