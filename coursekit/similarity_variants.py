"""Independent correct solutions, and Chapter 2's first disguised copies, to measure the similarity report.

Instructor-only (the copies are made from the reference). ``INDEPENDENT`` (Chapter 2) and ``MORE``
(chapters 1, 4 and 8, where the catalogs' correct styles are fewest) are answers written as
other learners would; benchmarks/similarity_accuracy.py adds the catalogs' correct styles and
disguises every one of them with coursekit.disguises. The disguises kept below (``DISGUISES``)
are the first three, on Chapter 2 only, which benchmarks/class_report_scale.py still uses.
A disguised copy here is renamed
(every local name and parameter), reordered (adjacent statements that do not depend on
each other swapped) and recommented (comments and docstrings replaced), one at a time
and all together. The independent solutions are correct answers written differently,
as different learners would.
"""
from __future__ import annotations

import ast
import itertools
import textwrap

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

# Other chapters: correct answers in other authors' styles (loops, einsum, complex numbers, index
# arithmetic; a class's forward only, in its released stub), for the exercises the catalogs (tests/test_grading_chNN.py CORRECT) cover least.
# Each is graded in process at full marks before it is used (benchmarks/similarity_accuracy.py --verify).
MORE = {
    "01_bahdanau_attention": {
        "AdditiveAttention": [
            '''    def forward(self, query, keys, values, mask=None):
        projected_keys = self.U_a(keys)
        projected_query = self.W_a(query)
        energies = []
        for t in range(keys.shape[1]):
            e = self.v_a(torch.tanh(projected_query + projected_keys[:, t]))
            energies.append(e[:, 0])
        energy = torch.stack(energies, dim=1)
        alpha = masked_softmax(energy, mask)
        ctx = torch.einsum("bt,btd->bd", alpha, values)
        return ctx, alpha
''',
            '''    def forward(self, query, keys, values, mask=None):
        e = torch.tanh(self.U_a(keys) + self.W_a(query).unsqueeze(-2)) @ self.v_a.weight.t()
        w = masked_softmax(e.squeeze(2), mask)
        return torch.bmm(w.unsqueeze(1), values).squeeze(1), w
''',
        ],
    },
    "04_positional_encoding": {
        "sinusoidal_encoding": [
            '''def sinusoidal_encoding(max_len, d_model):
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            angle = pos / (10000 ** (i / d_model))
            pe[pos, i] = math.sin(angle)
            if i + 1 < d_model:
                pe[pos, i + 1] = math.cos(angle)
    return pe.to(torch.get_default_dtype())
''',
            '''def sinusoidal_encoding(max_len, d_model):
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angles = position * div_term
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)
    return pe[:, :d_model].to(torch.get_default_dtype())
''',
        ],
    },
    "08_modern_attention": {
        "RMSNorm": [
            '''    def forward(self, x):
        inv = torch.rsqrt(torch.mean(x * x, -1, keepdim=True) + self.eps)
        return x * inv * self.weight
''',
            '''    def forward(self, x):
        mean_square = (x ** 2).sum(-1, keepdim=True) / x.shape[-1]
        return self.weight * x / (mean_square + self.eps) ** 0.5
''',
        ],
        "apply_rope_halves": [
            '''def apply_rope_halves(x, positions, base=10000.0):
    half = x.size(-1) // 2
    freqs = 1.0 / base ** (torch.arange(half, dtype=torch.float64, device=x.device) * 2 / x.size(-1))
    ang = torch.outer(positions.to(torch.float64), freqs)
    ang = torch.cat((ang, ang), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * ang.cos().to(x.dtype) + rotated * ang.sin().to(x.dtype)
''',
            '''def apply_rope_halves(x, positions, base=10000.0):
    h = x.shape[-1] // 2
    inv = base ** (-torch.arange(h, dtype=torch.float64) / h)
    rot = torch.polar(torch.ones(len(positions), h, dtype=torch.float64),
                      positions.to(torch.float64).cpu()[:, None] * inv)
    z = torch.complex(x[..., :h].double(), x[..., h:].double()) * rot.to(x.device)
    return torch.cat([z.real, z.imag], -1).to(x.dtype)
''',
        ],
        "SwiGLU": [
            '''    def forward(self, x):
        g = self.gate_proj(x)
        return self.down_proj(g * torch.sigmoid(g) * self.up_proj(x))
''',
            '''    def forward(self, x):
        h = x @ self.gate_proj.weight.T
        h = h * h.sigmoid()
        h = h * (x @ self.up_proj.weight.T)
        return h @ self.down_proj.weight.T
''',
        ],
        "sliding_window_mask": [
            '''def sliding_window_mask(n, window, num_sinks=0):
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        mask[i, max(0, i - window + 1):i + 1] = True
        mask[i, :min(num_sinks, i + 1)] = True
    return mask
''',
            '''def sliding_window_mask(n, window, num_sinks=0):
    ones = torch.ones(n, n, dtype=torch.bool)
    band = torch.tril(ones) & torch.triu(ones, diagonal=-(window - 1))
    sinks = torch.zeros(n, n, dtype=torch.bool)
    sinks[:, :num_sinks] = True
    return band | (sinks & torch.tril(ones))
''',
        ],
        "evict_to_sinks": [
            '''def evict_to_sinks(k, v, num_sinks, window):
    length = k.shape[2]
    if length > num_sinks + window:
        k = torch.cat((k[:, :, :num_sinks], k[:, :, length - window:]), dim=2)
        v = torch.cat((v[:, :, :num_sinks], v[:, :, length - window:]), dim=2)
    return k, v
''',
            '''def evict_to_sinks(k, v, num_sinks, window):
    T = k.size(-2)
    if T > num_sinks + window:
        keep = [t for t in range(T) if t < num_sinks or t >= T - window]
    else:
        keep = list(range(T))
    idx = torch.tensor(keep, dtype=torch.long, device=k.device)
    return k.index_select(2, idx), v.index_select(2, idx)
''',
        ],
        "paged_attention": [
            '''def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    B, H, d = query.shape
    bs = k_cache.shape[2]
    out = query.new_zeros(B, H, v_cache.shape[-1])
    for b in range(B):
        n = int(seq_lens[b])
        keys = torch.stack([k_cache[block_table[b, t // bs], :, t % bs] for t in range(n)], dim=1)
        vals = torch.stack([v_cache[block_table[b, t // bs], :, t % bs] for t in range(n)], dim=1)
        s = torch.einsum("hd,hnd->hn", query[b], keys) / d ** 0.5
        out[b] = torch.einsum("hn,hnd->hd", s.softmax(-1), vals)
    return out
''',
            '''def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    num_blocks, H, bs, d = k_cache.shape
    B, max_blocks = block_table.shape
    table = block_table.long().clamp(0, num_blocks - 1)
    k = k_cache[table].permute(0, 2, 1, 3, 4).reshape(B, H, max_blocks * bs, d)
    v = v_cache[table].permute(0, 2, 1, 3, 4).reshape(B, H, max_blocks * bs, -1)
    scores = (query.unsqueeze(2) @ k.transpose(-1, -2)).squeeze(2) * d ** -0.5
    valid = torch.arange(max_blocks * bs, device=query.device)[None, :] < seq_lens.to(query.device)[:, None]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return (scores.softmax(dim=-1).unsqueeze(2) @ v).squeeze(2)
''',
        ],
    },
}


def _in_stub(chapter: str, exercise: str, method: str) -> str:
    """A class exercise's released stub with its forward replaced by method (the given __init__ kept)."""
    from .sample_submissions import learner_notebook
    stub = next(c.source for c in learner_notebook(chapter).cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == exercise)
    tree = ast.parse(stub)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    cls.body = [n for n in cls.body if getattr(n, "name", None) != "forward"] + \
        ast.parse(textwrap.dedent(method)).body
    return ast.unparse(tree) + "\n"


def independent_solutions(chapter: str) -> dict[str, list[str]]:
    """exercise -> the independent correct answers kept here for chapter (Chapter 2's and MORE)."""
    found: dict[str, list[str]] = {}
    for ex, sols in [*(INDEPENDENT.items() if chapter == CHAPTER else ()), *MORE.get(chapter, {}).items()]:
        found.setdefault(ex, []).extend(_in_stub(chapter, ex, s) if s.lstrip().startswith("def forward") else s
                                        for s in sols)
    return found


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
    """Independent learners: the i-th solution of every exercise of Chapter 2."""
    solutions = independent_solutions(CHAPTER)
    count = min(len(v) for v in solutions.values())
    return [{ex: sols[i] for ex, sols in solutions.items()} for i in range(count)]


def pairs_of(names) -> list[tuple[str, str]]:
    return list(itertools.combinations(names, 2))
