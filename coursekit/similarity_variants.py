"""Disguised copies and independent solutions of Chapter 2's answers, to measure the similarity report.

Instructor-only (the copies are made from the reference). A disguised copy is renamed
(every local name and parameter), reordered (adjacent statements that do not depend on
each other swapped) and recommented (comments and docstrings replaced), one at a time
and all together. The independent solutions are correct answers written differently,
as different learners would.
"""
from __future__ import annotations

import ast
import itertools

CHAPTER = "02_self_attention"

INDEPENDENT = {
    "scaled_dot_product_attention": [
        '''def scaled_dot_product_attention(query, key, value, mask=None):
    scale = 1.0 / query.shape[-1] ** 0.5
    logits = torch.matmul(query, key.transpose(-1, -2)) * scale
    if mask is not None:
        logits = torch.where(mask, logits, torch.full_like(logits, float("-inf")))
    attn = logits.softmax(dim=-1)
    return torch.matmul(attn, value), attn
''',
        '''def scaled_dot_product_attention(query, key, value, mask=None):
    d = query.shape[-1]
    s = torch.einsum("...qd,...kd->...qk", query, key) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(mask == 0, -1e9)
    p = F.softmax(s, dim=-1)
    out = torch.einsum("...qk,...kv->...qv", p, value)
    return out, p
''',
        '''def scaled_dot_product_attention(query, key, value, mask=None):
    kt = key.transpose(-2, -1)
    raw = torch.matmul(query / math.sqrt(query.size(-1)), kt)
    if mask is not None:
        raw = raw.masked_fill(mask.logical_not(), float("-inf"))
    raw = raw - raw.amax(dim=-1, keepdim=True)
    e = raw.exp()
    weights = e / e.sum(dim=-1, keepdim=True)
    return weights.matmul(value), weights
''',
    ],
    "causal_mask": [
        "def causal_mask(n):\n    idx = torch.arange(n)\n    return idx[:, None] >= idx[None, :]\n",
        "def causal_mask(n):\n    m = torch.ones(n, n).tril()\n    return m.bool()\n",
        "def causal_mask(n):\n    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)\n    return ~upper\n",
    ],
    "padding_mask": [
        '''def padding_mask(lengths, max_len):
    lengths = torch.as_tensor(lengths)
    return torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
''',
        '''def padding_mask(lengths, max_len):
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :int(n)] = True
    return mask
''',
        '''def padding_mask(lengths, max_len):
    lengths = torch.as_tensor(lengths).view(-1, 1)
    grid = torch.arange(max_len, device=lengths.device).expand(lengths.shape[0], max_len)
    return grid.lt(lengths)
''',
    ],
    "SelfAttention": [
        '''class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k)
        self.W_k = nn.Linear(d_model, d_k)
        self.W_v = nn.Linear(d_model, d_v)

    def forward(self, x, mask=None):
        return scaled_dot_product_attention(self.W_q(x), self.W_k(x), self.W_v(x), mask=mask)
''',
        '''class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        nn.Module.__init__(self)
        self.W_q, self.W_k, self.W_v = (nn.Linear(d_model, d) for d in (d_k, d_k, d_v))

    def forward(self, x, mask=None):
        out, attn = scaled_dot_product_attention(*(layer(x) for layer in (self.W_q, self.W_k, self.W_v)),
                                                 mask)
        return out, attn
''',
        '''class SelfAttention(torch.nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super(SelfAttention, self).__init__()
        layers = {"W_q": d_k, "W_k": d_k, "W_v": d_v}
        for name, size in layers.items():
            setattr(self, name, torch.nn.Linear(d_model, size))

    def forward(self, x, mask=None):
        projected = [getattr(self, name)(x) for name in ("W_q", "W_k", "W_v")]
        return scaled_dot_product_attention(projected[0], projected[1], projected[2], mask)
''',
    ],
}


class _Rename(ast.NodeTransformer):
    """Every parameter and every assigned local name gets a new name (names of defs kept)."""

    def __init__(self, local: set[str]):
        self.map = {name: f"{name[:1]}{i}_val" for i, name in enumerate(sorted(local))}

    def visit_Name(self, node):
        node.id = self.map.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.map.get(node.arg, node.arg)
        return node


def _locals(tree) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg != "self":
            found.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
    return found


def renamed(source: str) -> str:
    tree = ast.parse(source)
    return ast.unparse(_Rename(_locals(tree)).visit(tree)) + "\n"


def _names(node, ctx) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _independent(a, b) -> bool:
    if any(isinstance(s, (ast.Return, ast.Raise, ast.Expr)) for s in (a, b)):
        return False
    wa, wb = _names(a, ast.Store), _names(b, ast.Store)
    ra, rb = _names(a, ast.Load), _names(b, ast.Load)
    return not (wa & rb or wb & ra or wa & wb)


def reordered(source: str) -> str:
    """Swap every adjacent pair of statements that do not depend on each other (first come first)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        i = 0
        while i + 1 < len(body):
            if _independent(body[i], body[i + 1]) and not isinstance(body[i], ast.Expr):
                body[i], body[i + 1] = body[i + 1], body[i]
                i += 2
            else:
                i += 1
    return ast.unparse(tree) + "\n"


def recommented(source: str) -> str:
    """Docstrings dropped, every comment removed, a new comment before every other line."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    lines = []
    for i, line in enumerate(ast.unparse(tree).splitlines()):
        if i % 2 and line.strip():
            indent = line[:len(line) - len(line.lstrip())]
            lines.append(f"{indent}# my own step {i}: see the lecture notes")
        lines.append(line + ("  # checked" if i % 3 == 0 else ""))
    return "\n".join(lines) + "\n"


def padded(source: str) -> str:
    """A statement of no use added at the start of every function (what a copier adds to look different)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body.insert(0, ast.parse("debug_steps = []").body[0])
    return ast.unparse(tree) + "\n"


DISGUISES = {
    "renamed": renamed,
    "reordered": reordered,
    "recommented": recommented,
    "all three": lambda s: recommented(reordered(renamed(s))),
    "all three and a line added": lambda s: recommented(reordered(renamed(padded(s)))),
}


def disguised(answers: dict[str, str]) -> dict[str, dict[str, str]]:
    """disguise name -> answers with that disguise applied to every exercise."""
    return {name: {ex: how(src) for ex, src in answers.items()} for name, how in DISGUISES.items()}


def independent_sets() -> list[dict[str, str]]:
    """Independent learners: the i-th solution of every exercise."""
    count = min(len(v) for v in INDEPENDENT.values())
    return [{ex: sols[i] for ex, sols in INDEPENDENT.items()} for i in range(count)]


def pairs_of(names) -> list[tuple[str, str]]:
    return list(itertools.combinations(names, 2))
