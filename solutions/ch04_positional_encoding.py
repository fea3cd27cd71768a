"""Reference solution (instructor-only) for chapter 04_positional_encoding.

generated from course/04_positional_encoding.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def sinusoidal_encoding(max_len, d_model):
    """Sinusoidal positional encoding of the original Transformer.

    Args:
        max_len: number of positions, pos = 0, 1, ..., max_len - 1.
        d_model: number of features (even).

    Returns a tensor PE of shape (max_len, d_model), in torch's default dtype
    (float32), with, for i = 0, 1, ..., d_model/2 - 1,
        PE[pos, 2i]     = sin(pos / 10000 ** (2i / d_model))
        PE[pos, 2i + 1] = cos(pos / 10000 ** (2i / d_model))
    (sine on the even features, cosine on the odd ones, interleaved).
    """
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]                 # (max_len, 1)
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    angles = pos * omega                                                      # (max_len, d_model/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.to(torch.get_default_dtype())                                   # (max_len, d_model)


def relative_position_matrix(k, d_model):
    """The matrix M_k with sinusoidal_encoding(...)[pos + k] == sinusoidal_encoding(...)[pos] @ M_k.

    Args:
        k: the offset (an int).
        d_model: number of features (even).

    Returns a (d_model, d_model) tensor in torch's default dtype (float32),
    block diagonal: for each pair i = 0, ..., d_model/2 - 1, with
    b = k * omega_i and omega_i = 10000 ** (-2i / d_model),
        M[2i, 2i]     = cos(b)    M[2i, 2i + 1]     = -sin(b)
        M[2i + 1, 2i] = sin(b)    M[2i + 1, 2i + 1] =  cos(b)
    and zeros everywhere else.
    """
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    cos, sin = torch.cos(k * omega), torch.sin(k * omega)                    # (d_model/2,)
    blocks = torch.stack([torch.stack([cos, -sin], dim=-1),
                          torch.stack([sin, cos], dim=-1)], dim=-2)          # (d_model/2, 2, 2)
    return torch.block_diag(*blocks).to(torch.get_default_dtype())          # (d_model, d_model)


def apply_rope(x, base=10000.0):
    """Rotary position embedding (RoFormer), interleaved pairs.

    Args:
        x: tensor of shape (..., N, d), d even. The position of x[..., p, :]
           is its index p = 0, 1, ..., N-1 along dimension -2.
        base: the base of the frequencies theta_i = base ** (-2i / d).

    For each position p and pair i = 0, ..., d/2 - 1, rotate the pair
    (x[..., p, 2i], x[..., p, 2i+1]) by the angle p * theta_i:
        out[..., p, 2i]     = x[..., p, 2i] * cos - x[..., p, 2i+1] * sin
        out[..., p, 2i + 1] = x[..., p, 2i] * sin + x[..., p, 2i+1] * cos
    Returns a new tensor of the same shape and dtype as x (x is unchanged).
    """
    N, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(N, dtype=torch.float64)[:, None]                       # (N, 1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)         # (d/2,)
    angles = pos * theta                                                      # (N, d/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]                                # (..., N, d/2) each
    rotated = torch.stack([x_even * cos - x_odd * sin,
                           x_even * sin + x_odd * cos], dim=-1)               # (..., N, d/2, 2)
    return rotated.flatten(-2)                                                # (..., N, d)


def alibi_bias(num_heads, n):
    """ALiBi attention bias.

    Returns a tensor of shape (num_heads, n, n), in torch's default dtype
    (float32), with
        bias[h, i, j] = -m_h * |i - j|,   m_h = 2 ** (-8 * (h + 1) / num_heads)
    for heads h = 0, ..., num_heads - 1 (so head 0 has the largest slope).
    It is added to the scores q.k / sqrt(d_k) of head h before the softmax.
    """
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads)  # (H,)
    pos = torch.arange(n, dtype=torch.float64)
    distance = (pos[:, None] - pos[None, :]).abs()                            # (n, n)
    return (-slopes[:, None, None] * distance).to(torch.get_default_dtype())  # (H, n, n)


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F'
