"""The canonical form of an answer cell, for the similarity report: what two cells share once the
choices that change nothing are undone.

``canonical(source, keep)`` parses the cell and rewrites its syntax tree:

* **Noise out**: docstrings, imports (every cell may repeat the notebook's), ``pass``, ``print``
  calls, constant assertions, branches on a constant or on a name only ever set to a constant,
  statements after a ``return``, stores to local names nothing reads, and top-level helpers and
  names nothing in the cell uses (``keep``, the exercise's own name, always stays).
* **One spelling per operation**: a call is ``@name(receiver, *args)`` whether written as a method
  (``x.softmax(-1)``), through a module (``torch.softmax(x, dim=-1)``, ``F.softmax``,
  ``torch.nn.functional.softmax``) or with keywords; ``a @ b``, ``matmul``, ``mm`` and ``bmm`` are
  one; ``.mT``, ``.T``, ``.t()`` and a transpose of the last two dimensions are one;
  ``masked_fill(x, m, v)`` is ``where(m, v, x)`` and a negated condition swaps ``where``'s branches;
  ``view`` is ``reshape``; ``.size(i)`` is ``.shape[i]``; ``sqrt(x)`` is ``x ** 0.5``; a constant
  wrapped in ``tensor``/``as_tensor`` is the constant; ``concat`` is ``cat``; ``.contiguous()``
  goes.
* **Temporaries inlined**: a local assigned once and read once is replaced by its expression, so
  splitting an expression into steps, or joining steps, leaves the same tree.
* **Names**: local names (parameters, assigned names) become ``V``; names the cell does not bind
  (the course's given functions, builtins) stay; numbers become ``N``, strings ``S``.

Nothing here runs the code; a cell that does not parse has no canonical form (``None``).
"""
from __future__ import annotations

import ast

MODULES = {"torch", "F", "nn", "math", "np", "numpy", "functional", "torch.nn", "torch.nn.functional",
           "nn.functional", "torch.linalg", "torch.special"}
SAME = {"mm": "matmul", "bmm": "matmul", "concat": "cat", "concatenate": "cat", "view": "reshape",
        "masked_fill_": "masked_fill", "t": "mT", "absolute": "abs", "greater": "gt", "less": "lt",
        "multiply": "mul", "divide": "div", "subtract": "sub", "true_divide": "div"}
KEEP_NUMBERS = True  # -1e9 or -inf, 0.5 or -0.5: choices a copy keeps and an independent answer may not
DTYPES = {"float": "float32", "double": "float64", "half": "float16", "bool": "bool", "long": "int64",
          "int": "int32"}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _op(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(ast.Name("@" + name, ast.Load()), list(args), [])


def _is_op(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "@" + name


def _number(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    return None


class _Calls(ast.NodeTransformer):
    """One spelling per operation (bottom-up)."""

    def __init__(self, modules: set[str]):
        self.modules = modules

    def _module(self, node: ast.AST) -> bool:
        name = _dotted(node)
        return name is not None and (name in self.modules or name.split(".")[0] in self.modules and
                                     name.split(".")[0] in ("torch", "nn", "F", "np", "numpy"))

    def visit_Call(self, node):
        f = node.func
        args = [self.visit(a) for a in node.args]
        keywords = sorted((k for k in node.keywords if k.arg is not None), key=lambda k: k.arg)
        args += [self.visit(k.value) for k in keywords]  # dim=-1 and -1 alike
        args += [self.visit(k) for k in node.keywords if k.arg is None]
        if isinstance(f, ast.Attribute) and self._module(f.value):
            name = f.attr  # torch.softmax(x, ...), F.softmax, torch.nn.functional.softmax
        elif isinstance(f, ast.Attribute) and not (isinstance(f.value, ast.Name) and f.value.id == "self") \
                and not (isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name)
                         and f.value.func.id == "super"):
            name, args = f.attr, [self.visit(f.value), *args]  # x.softmax(...): the receiver first
        else:  # a function, a submodule or method of self, super().__init__
            node.func = self.visit(f)
            node.args, node.keywords = args, []
            return node
        return self._rewrite(SAME.get(name, name), args)

    def _rewrite(self, name: str, args: list) -> ast.expr:
        if name == "transpose" and len(args) == 3 and sorted(filter(None, map(_number, args[1:]))) == [-2, -1]:
            return _op("mT", args[0])
        if name == "masked_fill" and len(args) == 3:
            return self._where(args[1], args[2], args[0])
        if name == "where" and len(args) == 3:
            return self._where(*args)
        if name == "logical_not" and len(args) == 1:
            return ast.UnaryOp(ast.Invert(), args[0])
        if name == "size":
            shape = _op("shape", args[0])
            return ast.Subscript(shape, args[1], ast.Load()) if len(args) > 1 else shape
        if name == "sqrt" and len(args) == 1:
            return ast.BinOp(args[0], ast.Pow(), ast.Constant(0.5))
        if name in ("tensor", "as_tensor") and args:
            return args[0]  # a conversion, not an operation
        if name == "contiguous" and len(args) == 1:
            return args[0]
        if name in DTYPES and len(args) == 1:
            return _op("to", args[0], ast.Name("@" + DTYPES[name], ast.Load()))
        return _op(name, *args)

    @staticmethod
    def _where(condition, yes, no):
        yes, no = (b.args[1] if _is_op(b, "full_like") and len(b.args) == 2 else b for b in (yes, no))
        if isinstance(condition, ast.UnaryOp) and isinstance(condition.op, (ast.Invert, ast.Not)):
            return _op("where", condition.operand, no, yes)
        return _op("where", condition, yes, no)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.MatMult):
            return _op("matmul", node.left, node.right)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return node
        if node.attr in ("mT", "T") and not self._module(node.value):
            return _op("mT", node.value)
        if node.attr == "shape" and not self._module(node.value):
            return _op("shape", node.value)
        if self._module(node.value):  # torch.float32, math.pi, nn.Linear (as a value)
            return ast.Name("@" + node.attr, ast.Load())
        return node


def _without_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]


def _falsy_names(tree: ast.AST) -> set[str]:
    """Names only ever assigned a falsy constant (a debug flag)."""
    values: dict[str, list] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    values.setdefault(target.id, []).append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            values.setdefault(node.target.id, []).append(None)
        elif isinstance(node, (ast.For, ast.comprehension)):
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    values.setdefault(n.id, []).append(None)
    return {name for name, vs in values.items()
            if all(isinstance(v, ast.Constant) and not v.value for v in vs)}


class _Noise(ast.NodeTransformer):
    """Statements that do nothing for the answer: imports, pass, print, constant branches and asserts."""

    def __init__(self, falsy: set[str]):
        self.falsy = falsy

    def _false(self, test) -> bool:
        return isinstance(test, ast.Constant) and not test.value or \
            isinstance(test, ast.Name) and test.id in self.falsy

    def visit_Import(self, node):
        return None

    visit_ImportFrom = visit_Import

    def visit_Pass(self, node):
        return None

    def visit_Expr(self, node):
        self.generic_visit(node)
        v = node.value
        if isinstance(v, ast.Constant):
            return None
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "print":
            return None
        return node

    def visit_Assert(self, node):
        return None if isinstance(node.test, ast.Constant) else node

    def visit_If(self, node):
        self.generic_visit(node)
        if self._false(node.test):
            return node.orelse or None
        if isinstance(node.test, ast.Constant) and node.test.value:
            return node.body
        return node

    def generic_visit(self, node):
        super().generic_visit(node)
        for attr in ("body", "orelse", "finalbody"):
            body = getattr(node, attr, None)
            if isinstance(body, list) and body and all(isinstance(s, ast.stmt) for s in body):
                for i, stmt in enumerate(body):
                    if isinstance(stmt, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                        del body[i + 1:]  # unreachable
                        break
        for attr in ("body",):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.While,
                                 ast.With, ast.Try)) and not getattr(node, attr):
                setattr(node, attr, [ast.Pass()])
        return node


def _counts(fn: ast.AST) -> tuple[dict, dict]:
    loads: dict[str, int] = {}
    stores: dict[str, int] = {}
    for n in ast.walk(fn):
        if isinstance(n, ast.Name):
            table = loads if isinstance(n.ctx, ast.Load) else stores
            table[n.id] = table.get(n.id, 0) + 1
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            loads[n.target.id] = loads.get(n.target.id, 0)
    return loads, stores


def _blocks(node: ast.AST):
    for n in ast.walk(node):
        for attr in ("body", "orelse", "finalbody"):
            body = getattr(n, attr, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body


def _dead_stores(fn: ast.AST) -> bool:
    """Assignments to local names nothing reads, removed; True if any was."""
    loads, _ = _counts(fn)
    changed = False
    for body in _blocks(fn):
        keep = []
        for stmt in body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else None
            if targets and all(isinstance(t, ast.Name) and not loads.get(t.id) for t in targets):
                changed = True
                continue
            keep.append(stmt)
        if not keep:
            keep = [ast.Pass()]
        body[:] = keep
    return changed


def _replace(root: ast.AST, old: ast.AST, new: ast.AST) -> bool:
    for node in ast.walk(root):
        for field, value in ast.iter_fields(node):
            if value is old:
                setattr(node, field, new)
                return True
            if isinstance(value, list):
                for k, item in enumerate(value):
                    if item is old:
                        value[k] = new
                        return True
    return False


def _inline(fn: ast.AST, params: set[str]) -> bool:
    """A local assigned once (a plain ``name = expr``) and read once: its expression put where it is read."""
    loads, stores = _counts(fn)
    for body in _blocks(fn):
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                continue
            name = stmt.targets[0].id
            if name in params or stores.get(name) != 1 or loads.get(name) != 1:
                continue
            for later in body[i + 1:]:
                use = next((n for n in ast.walk(later) if isinstance(n, ast.Name) and n.id == name
                            and isinstance(n.ctx, ast.Load)), None)
                if use is not None:
                    if _replace(later, use, stmt.value):
                        del body[i]
                        return True
                    break
    return False


class _Names(ast.NodeTransformer):
    def __init__(self, bound: set[str]):
        self.bound = bound

    def visit_Name(self, node):
        if node.id in self.bound:
            node.id = "V"
        return node

    def visit_arg(self, node):
        node.arg, node.annotation = "V", None
        return node

    def visit_Constant(self, node):
        if isinstance(node.value, (str, bytes)):
            node.value = "S"  # einsum's letters are names too
        elif not KEEP_NUMBERS:
            node.value = "N"
        return node

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        node.returns = None
        node.decorator_list = []
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_JoinedStr(self, node):
        return ast.Constant("S")


def _bound(tree: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
    return names


def _module_aliases(tree: ast.AST) -> set[str]:
    aliases = set(MODULES)
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            aliases |= {a.asname or a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in ("torch", "numpy", "math"):
            aliases |= {a.asname or a.name for a in n.names if a.name in ("nn", "functional", "linalg")}
    return aliases


def _unused_top_level(tree: ast.Module, keep: str | None) -> None:
    """Top-level definitions and names nothing else in the cell refers to (dead helpers, flags)."""
    for _ in range(3):
        used: dict[str, int] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                used[n.id] = used.get(n.id, 0) + 1
            elif isinstance(n, ast.Attribute):
                used[n.attr] = used.get(n.attr, 0) + 1
        body = []
        for stmt in tree.body:
            name = stmt.name if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else \
                stmt.targets[0].id if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name) else None
            if name is not None and name != keep and keep is not None and not used.get(name):
                continue
            body.append(stmt)
        if len(body) == len(tree.body) or not body:
            return
        tree.body = body


def canonical(source: str, keep: str | None = None) -> ast.Module | None:
    """The cell's canonical syntax tree (see the module's docstring), or None if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    modules = _module_aliases(tree) - _bound(tree)  # a parameter named F is no module
    _without_docstrings(tree)
    tree = _Noise(_falsy_names(tree)).visit(tree)
    _unused_top_level(tree, keep)
    tree = _Calls(modules).visit(tree)
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn in functions:
        params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        for _ in range(200):  # each step removes a statement: bounded by the cell's size
            if not (_dead_stores(fn) or _inline(fn, params)):
                break
    tree = _Names(_bound(tree) - {keep}).visit(tree)
    return ast.fix_missing_locations(tree)
