"""Seeded disguises of a correct answer cell: what a learner who copies does so that it looks their own.

Instructor-only test data for the similarity report (benchmarks/similarity_accuracy.py). Each
disguise keeps the cell's behaviour: names the tests or the chapter's other cells use (the
parameters of functions and methods, attributes, definitions) are never renamed; statements
move only past statements they share no name with, and a statement that calls anything that
may draw random numbers or change state keeps its place among such statements; an
expression is split into a temporary only where nothing before it in the statement has an
effect. Kinds (``KINDS``): renamed, reordered, recommented, calls_swapped (``.mT`` for
``.transpose(-2, -1)``, ``x.softmax(-1)`` for ``F.softmax(x, dim=-1)``, ``torch.where`` for
``masked_fill``, ``a @ b`` for ``torch.matmul``, method for function, ``reshape`` for
``view``, ``.shape[i]`` for ``.size(i)``), temporaries (split, or inlined where used once),
dead_code, imports (the usual ones, inside the cell and its functions), and combined (all
of them, in an order drawn from the seed).

``split(seed)`` tells which half a disguise belongs to: odd seeds are held out.
"""
from __future__ import annotations

import ast
import copy
import random

KINDS = ("renamed", "reordered", "recommented", "calls_swapped", "temporaries", "dead_code", "imports", "combined")


def split(seed: int) -> str:
    """"tuning" for even seeds, "held-out" for odd: the similarity measure is tuned on the first only."""
    return "held-out" if seed % 2 else "tuning"


# ------------------------------------------------------------------ what a statement reads, writes, does
# Calls that neither draw random numbers nor change anything (methods of tensors and functions of
# torch, F and math by their last name). Anything else (a module, nn.Linear, dropout, an in-place
# method, print, append) is an effect.
PURE = {
    "abs", "amax", "amin", "arange", "argmax", "bool", "cat", "chunk", "clamp", "clone", "concat", "contiguous",
    "cos", "cumsum", "detach", "diagonal", "dim", "einsum", "empty_like", "eq", "exp", "expand", "expand_as",
    "flatten", "float", "flip", "full", "full_like", "gather", "ge", "gelu", "gt", "int", "isinf", "le", "len",
    "list", "log", "log_softmax", "logical_not", "logsumexp", "long", "lt", "masked_fill", "matmul", "max", "maximum",
    "mean", "min", "minimum", "ne", "new_zeros", "new_ones", "new_full", "norm", "ones", "ones_like", "outer", "permute",
    "pow", "range", "relu", "repeat", "repeat_interleave", "reshape", "rsqrt", "sigmoid", "silu", "sin", "size",
    "softmax", "split", "sqrt", "square", "squeeze", "stack", "sum", "tanh", "tensor", "to", "transpose", "tril",
    "triu", "tuple", "type_as", "unbind", "unflatten", "unsqueeze", "view", "view_as", "where", "zeros",
    "zeros_like", "zip", "enumerate", "isinstance", "float32", "finfo", "sort", "topk", "any", "all", "item",
    "round", "floor", "ceil", "log2", "int", "str", "dict", "sorted", "reversed", "getattr", "hasattr", "as_tensor",
    "polar", "view_as_complex", "view_as_real", "real", "imag", "linspace", "logical_and", "logical_or", "bmm",
    "count_nonzero", "sign", "argsort", "nonzero", "numel", "t", "mm", "addmm", "baddbmm", "type", "cumprod",
    "scaled_dot_product_attention", "attention", "layer_norm", "linear", "pad", "one_hot", "is_floating_point",
}


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _effectful(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                return True  # a submodule or a method of the learner's own: may hold dropout
            if _call_name(n) not in PURE:
                return True
        if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr, ast.Lambda)):
            return True
    return False


def _dotted(node: ast.AST) -> str | None:
    """"self.W_q" for a chain of attributes on a name, else None."""
    chain = node
    while isinstance(chain, ast.Attribute):
        chain = chain.value
    return ast.unparse(node) if isinstance(chain, ast.Name) else None


def _reads_writes(stmt: ast.stmt) -> tuple[set, set]:
    reads, writes = set(), set()
    for n in ast.walk(stmt):
        if isinstance(n, (ast.Name, ast.Attribute)):
            name = _dotted(n)
            if name is None:
                continue
            root = name.split(".")[0]
            if isinstance(n.ctx, ast.Store) or isinstance(n.ctx, ast.Del):
                writes.add(name)
                writes.add(root)  # an attribute set on a module may need its __init__ first
                if "." in name:
                    writes.add("<world>")
            else:
                reads.add(name)
                reads.add(root)
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store):
            name = _dotted(n.value)
            if name:
                writes.add(name)
                writes.add(name.split(".")[0])
    if _effectful(stmt):
        reads.add("<world>")
        writes.add("<world>")
    return reads, writes


SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)


def _writes_into(stmt: ast.stmt) -> bool:
    """The statement writes into a tensor (x[...] = ..., x[...] += ...): a view of it read by a name
    the statement never mentions (l_i = l[..., i:j]) changes too."""
    return any(isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del)) for n in ast.walk(stmt))


def _independent(a: ast.stmt, b: ast.stmt) -> bool:
    if not (isinstance(a, SIMPLE) and isinstance(b, SIMPLE)):
        return False
    if any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in (a, b)):
        return False  # a docstring stays first
    if _writes_into(a) or _writes_into(b):
        return False
    ra, wa = _reads_writes(a)
    rb, wb = _reads_writes(b)
    return not (wa & rb or wb & ra or wa & wb)


def _bodies(tree: ast.AST):
    for node in ast.walk(tree):
        for attr in ("body", "orelse", "finalbody"):
            body = getattr(node, attr, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield node, attr, body


def _functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


# ------------------------------------------------------------------ renamed
NAME_POOL = ("tmp", "res", "out", "val", "buf", "acc", "cur", "nxt", "item", "part", "data", "thing", "step",
             "mat", "vec", "arr", "t", "z", "u", "w2", "h2", "aux", "my_var", "helper", "result", "piece")


def renamed(source: str, rng: random.Random) -> str:
    """Every local name a function binds (not its parameters: tests may pass them by keyword) renamed."""
    tree = ast.parse(source)
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} | \
        {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    for fn in _functions(tree):
        params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        bound = sorted({n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                       - params - {"self"})
        for nested in ast.walk(fn):  # comprehension and lambda variables, nested functions' own
            if isinstance(nested, ast.Global | ast.Nonlocal):
                bound = [b for b in bound if b not in nested.names]
            if nested is not fn and isinstance(nested, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                # a nested function's parameter of the same name is another variable: both kept
                inner = {a.arg for a in ast.walk(nested.args) if isinstance(a, ast.arg)}
                bound = [b for b in bound if b not in inner]
        mapping = {}
        for name in bound:
            stem = rng.choice(NAME_POOL)
            new = stem
            i = 2
            while new in taken:
                new = f"{stem}{i}"
                i += 1
            taken.add(new)
            mapping[name] = new
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id in mapping:
                n.id = mapping[n.id]
    return ast.unparse(tree) + "\n"


# ------------------------------------------------------------------ reordered
def reordered(source: str, rng: random.Random) -> str:
    """Adjacent statements that share no name and not both an effect, swapped (each with chance 0.7)."""
    tree = ast.parse(source)
    for _, _, body in _bodies(tree):
        for _ in range(2):
            i = 0
            while i + 1 < len(body):
                if _independent(body[i], body[i + 1]) and rng.random() < 0.7:
                    body[i], body[i + 1] = body[i + 1], body[i]
                    i += 2
                else:
                    i += 1
    return ast.unparse(tree) + "\n"


# ------------------------------------------------------------------ recommented
COMMENTS = ("compute this step", "see lecture notes", "TODO: tidy up", "shape check", "as in the paper",
            "my implementation", "note: works for batches", "helper step", "careful with dims", "done")
DOCSTRINGS = ("My solution.", "Implements the exercise.", "Computes the result as described above.",
              "Written for the assignment.")


def _drop_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]


def recommented(source: str, rng: random.Random) -> str:
    """Docstrings replaced or dropped, comments removed, new comments and blank lines added."""
    tree = ast.parse(source)
    _drop_docstrings(tree)
    for fn in _functions(tree):
        if rng.random() < 0.5:
            fn.body.insert(0, ast.Expr(ast.Constant(rng.choice(DOCSTRINGS))))
    lines = []
    for line in ast.unparse(tree).splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        if line.strip() and rng.random() < 0.3:
            lines.append(f"{indent}# {rng.choice(COMMENTS)}")
        if rng.random() < 0.15:
            lines.append("")
        tail = f"  # {rng.choice(COMMENTS)}" if line.strip() and not line.rstrip().endswith(":") \
            and rng.random() < 0.2 else ""
        lines.append(line + tail)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ calls_swapped
def _is_last_two(args) -> bool:
    """transpose's arguments are the last two dimensions, either order."""
    vals = []
    for a in args:
        if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.USub) and isinstance(a.operand, ast.Constant):
            vals.append(-a.operand.value)
        else:
            return False
    return sorted(vals) == [-2, -1]


def _attr(value, name):
    return ast.Attribute(value=value, attr=name, ctx=ast.Load())


def _torch(name):
    return _attr(ast.Name("torch", ast.Load()), name)


def _dim_of(call: ast.Call, position: int):
    for kw in call.keywords:
        if kw.arg == "dim":
            return kw.value
    return call.args[position] if len(call.args) > position else None


FUNCTION_METHODS = {"exp", "log", "tanh", "sigmoid", "relu", "sqrt", "rsqrt", "abs", "sum", "mean", "amax", "cos",
                    "sin", "cumsum", "tril", "triu", "flatten", "square"}


class _Swap(ast.NodeTransformer):
    def __init__(self, rng: random.Random, modules: tuple[str, ...] = ("torch", "F", "nn.functional",
                                                                        "torch.nn.functional")):
        self.rng = rng
        self.count = 0
        self.modules = modules  # the names that are torch's modules in this cell
        self.F = "F" in modules

    def _go(self) -> bool:
        go = self.rng.random() < 0.8
        self.count += go
        return go

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.MatMult) and self._go():
            if self.rng.random() < 0.5:
                return ast.Call(_torch("matmul"), [node.left, node.right], [])
            return ast.Call(_attr(node.left, "matmul"), [node.right], [])
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if not isinstance(f, ast.Attribute):
            return node
        owner = _dotted(f.value)
        is_module = owner in self.modules
        name = f.attr
        if name == "transpose" and not is_module and _is_last_two(node.args) and not node.keywords and self._go():
            choice = self.rng.randrange(3)
            if choice == 0:
                return _attr(f.value, "mT")
            if choice == 1:
                return ast.Call(_torch("transpose"), [f.value, *node.args[::-1]], [])
            return ast.Call(f, node.args[::-1], [])
        if name == "matmul" and len(node.args) == (2 if is_module else 1) and not node.keywords and self._go():
            left, right = (node.args if is_module else [f.value, node.args[0]])
            return ast.BinOp(left, ast.MatMult(), right)
        if name == "softmax" and not any(k.arg not in ("dim",) for k in node.keywords):
            if is_module and node.args and _dim_of(node, 1) is not None and self._go():
                x, dim = node.args[0], _dim_of(node, 1)
                if self.rng.random() < 0.5:
                    return ast.Call(_attr(x, "softmax"), [dim], [])
                return ast.Call(_torch("softmax"), [x], [ast.keyword("dim", dim)])
            if not is_module and _dim_of(node, 0) is not None and self._go():
                return ast.Call(_attr(ast.Name("F", ast.Load()), "softmax") if self.F else _torch("softmax"),
                                [f.value], [ast.keyword("dim", _dim_of(node, 0))])
        if name == "masked_fill" and not is_module and len(node.args) == 2 and not node.keywords and self._go():
            mask, value = node.args
            return ast.Call(_torch("where"), [mask, ast.Call(_torch("as_tensor"), [value], [
                ast.keyword("dtype", _attr(f.value, "dtype"))]), f.value], [])
        if name == "view" and not is_module and node.args and self._go():
            return ast.Call(_attr(f.value, "reshape"), node.args, node.keywords)
        if name == "size" and not is_module and len(node.args) == 1 and not node.keywords and self._go():
            return ast.Subscript(_attr(f.value, "shape"), node.args[0], ast.Load())
        if name in FUNCTION_METHODS and self._go():
            if owner == "torch" and node.args and not isinstance(node.args[0], ast.Starred):
                return ast.Call(_attr(node.args[0], name), node.args[1:], node.keywords)
            if not is_module and owner not in ("math", "np", "self") and name != "relu":
                return ast.Call(_torch(name), [f.value, *node.args], node.keywords)
        if owner == "F" and self.F and name in ("relu", "gelu", "silu", "linear", "pad", "layer_norm", "dropout") \
                and self._go():
            return ast.Call(_attr(_attr(_attr(ast.Name("torch", ast.Load()), "nn"), "functional"), name),
                            node.args, node.keywords)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if node.attr == "mT" and isinstance(node.ctx, ast.Load) and self._go():
            return ast.Call(_attr(node.value, "transpose"), [ast.UnaryOp(ast.USub(), ast.Constant(2)),
                                                             ast.UnaryOp(ast.USub(), ast.Constant(1))], [])
        return node

    def visit_Subscript(self, node):
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape" \
                and not isinstance(node.slice, (ast.Slice, ast.Tuple)) and self._go():
            return ast.Call(_attr(node.value.value, "size"), [node.slice], [])
        return node


def calls_swapped(source: str, rng: random.Random) -> str:
    """Calls replaced by equivalent ones, each site with chance 0.8 (``F`` is no module where the cell
    binds the name itself: linformer_attention's projection argument)."""
    tree = ast.parse(source)
    bound = {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} | \
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    modules = tuple(m for m in ("torch", "F", "nn.functional", "torch.nn.functional") if m not in bound)
    tree = _Swap(rng, modules).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# ------------------------------------------------------------------ temporaries
TEMP_NAMES = ("tmp", "inter", "partial", "step_val", "mid", "h_", "aux", "stage")


def _unsafe_inside(stmt: ast.stmt, target: ast.AST) -> bool:
    """True if target sits under a lambda, comprehension, short-circuit or conditional expression, or
    anything with an effect is evaluated before it in stmt."""
    parents = {}
    for n in ast.walk(stmt):
        for c in ast.iter_child_nodes(n):
            parents[c] = n
    n = target
    while n in parents:
        p = parents[n]
        if isinstance(p, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.BoolOp,
                          ast.IfExp, ast.comprehension)):
            return True
        n = p
    # Anything with an effect outside target makes hoisting change the order of effects.
    outside = copy.deepcopy(stmt)
    for a, b in zip(ast.walk(outside), ast.walk(stmt)):
        if b is target:
            a.__class__ = ast.Constant
            a.value = 0
            a._fields = ()
            break
    return _effectful(outside) and _effectful(target)


def _replace(root: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for node in ast.walk(root):
        for field, value in ast.iter_fields(node):
            if value is old:
                setattr(node, field, new)
                return
            if isinstance(value, list):
                for k, item in enumerate(value):
                    if item is old:
                        value[k] = new
                        return


def _split_one(fn, rng, taken) -> bool:
    candidates = []
    for _, _, body in _bodies(fn):
        for i, stmt in enumerate(body):
            if not isinstance(stmt, (ast.Assign, ast.Return, ast.AugAssign)) or stmt.value is None:
                continue
            for sub in ast.walk(stmt.value):
                if sub is stmt.value or not isinstance(sub, (ast.Call, ast.BinOp)):
                    continue
                if any(isinstance(x, ast.Starred) for x in ast.walk(sub)):
                    continue
                if not _unsafe_inside(stmt, sub):
                    candidates.append((body, i, stmt, sub))
    if not candidates:
        return False
    body, i, stmt, sub = rng.choice(candidates)
    name = rng.choice(TEMP_NAMES)
    while name in taken:
        name += "_"
    taken.add(name)
    _replace(stmt, sub, ast.Name(name, ast.Load()))
    body.insert(i, ast.Assign([ast.Name(name, ast.Store())], sub))
    return True


def _inline_one(fn, rng) -> bool:
    loads: dict[str, int] = {}
    stores: dict[str, int] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name):
            (stores if isinstance(n.ctx, ast.Store) else loads)[n.id] = \
                (stores if isinstance(n.ctx, ast.Store) else loads).get(n.id, 0) + 1
    params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    candidates = []
    for _, _, body in _bodies(fn):
        for i in range(len(body) - 1):
            a, b = body[i], body[i + 1]
            if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)):
                continue
            name = a.targets[0].id
            if name in params or stores.get(name) != 1 or loads.get(name) != 1 or _effectful(a.value):
                continue
            if not isinstance(b, (ast.Assign, ast.Return)) or b.value is None:
                continue
            uses = [n for n in ast.walk(b.value) if isinstance(n, ast.Name) and n.id == name]
            if len(uses) == 1 and not _unsafe_inside(b, uses[0]):
                candidates.append((body, i, a, b, uses[0]))
    if not candidates:
        return False
    body, i, a, b, use = rng.choice(candidates)
    _replace(b, use, a.value)
    del body[i]
    return True


def temporaries(source: str, rng: random.Random) -> str:
    """Sub-expressions split into temporaries, and temporaries used once inlined."""
    tree = ast.parse(source)
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    for fn in _functions(tree):
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.6:
                _split_one(fn, rng, taken)
            else:
                _inline_one(fn, rng)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# ------------------------------------------------------------------ dead_code
DEAD = (
    "debug = False", "eps_unused = 1e-09", "history = []", "_ = None", "assert True", "pass",
    "if False:\n    print('debug')", "verbose = 0\nif verbose:\n    print('running')", "checked = True",
    "count_calls = 0\ncount_calls += 1",
)
DEAD_HELPERS = (
    "def _identity(t):\n    return t\n", "def _shape_of(t):\n    return tuple(t.shape)\n",
    "DEBUG = False\n", "def _check(x):\n    assert x is not None\n    return True\n",
)


def dead_code(source: str, rng: random.Random) -> str:
    """Statements of no use added in every function, sometimes a helper nobody calls, sometimes a line
    after a return."""
    tree = ast.parse(source)
    for fn in _functions(tree):
        for _ in range(rng.randint(1, 2)):
            stmts = ast.parse(rng.choice(DEAD)).body
            at = rng.randint(0, max(0, len(fn.body) - 1))
            if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant):
                at = max(at, 1)
            fn.body[at:at] = stmts
        if isinstance(fn.body[-1], ast.Return) and rng.random() < 0.2:
            fn.body.append(ast.parse("print('unreachable')").body[0])
    if rng.random() < 0.5:
        tree.body[0:0] = ast.parse(rng.choice(DEAD_HELPERS)).body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# ------------------------------------------------------------------ imports
IMPORTS = ("import torch", "import math", "import torch.nn as nn", "import torch.nn.functional as F",
           "from torch import nn", "import numpy as np", "from typing import Optional", "from torch import Tensor")


def imports(source: str, rng: random.Random) -> str:
    """The usual imports at the top of the cell, and sometimes inside a function."""
    tree = ast.parse(source)
    chosen = rng.sample(IMPORTS, rng.randint(2, 5))
    tree.body[0:0] = [ast.parse(line).body[0] for line in chosen]
    for fn in _functions(tree):
        own = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | {a.arg for a in ast.walk(fn.args)
                                                                         if isinstance(a, ast.arg)}
        usable = [line for line in IMPORTS[:4] if line.split()[-1] not in own]  # never shadow a parameter (F)
        if usable and rng.random() < 0.3:
            at = 1 if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
                else 0
            fn.body.insert(at, ast.parse(rng.choice(usable)).body[0])
    return ast.unparse(tree) + "\n"


ONE = {"renamed": renamed, "reordered": reordered, "recommented": recommented, "calls_swapped": calls_swapped,
       "temporaries": temporaries, "dead_code": dead_code, "imports": imports}


def combined(source: str, rng: random.Random) -> str:
    """Every disguise, in an order drawn from the seed (comments last: the others rewrite the cell)."""
    order = [k for k in ONE if k != "recommented"]
    rng.shuffle(order)
    for kind in order:
        source = ONE[kind](source, rng)
    return recommented(source, rng)


def disguise(source: str, kind: str, seed: int) -> str:
    """source disguised one way (KINDS), reproducibly for one (kind, seed)."""
    rng = random.Random(f"{kind}:{seed}")
    how = combined if kind == "combined" else ONE[kind]
    return how(source, rng)
