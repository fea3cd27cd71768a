"""Read the answer cells of from-scratch exercises, never run them: do they use a built-in solver?

Two kinds of finding, each a one-line reason that names what was found:

* the built-in named outright (``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``,
  ``torch.ops.aten...``, or its name as a string, also when assembled from pieces:
  ``"scaled_dot_" + "product_attention"``);
* a way to reach one without naming it: torch's internals (``torch._C``, ``torch.ops``,
  ``torch._ops``, ``torch.overrides``, ``torch.library``, any private ``torch._x``), which
  also switch off the grader's function recording (``DisableTorchFunction``); dynamic
  lookup (``importlib``, ``__import__``, ``eval``/``exec``/``compile``, ``globals()``,
  ``vars()``, ``__dict__``, ``__builtins__``, ``sys.modules``, ``inspect``, ``gc``, frames),
  and ``getattr``/``operator.attrgetter`` with a computed attribute name.

An answer cell of a from-scratch exercise has no reason for any of these: correct code
uses tensor operations, ``nn``/``F`` layers and functions by their names, ``math``, and
``getattr(self, "W_q")`` with a constant name, and ``getattr(self, f"W_{c}")``: a module's
own attributes hold nothing a built-in name could reach without another lookup. Only answer cells of the chapter's
``from_scratch`` exercises are read; code in other cells (a helper in a plain learner
cell) is out of static reach, and the kernel's function recording covers what it calls.
"""
from __future__ import annotations

import ast

from .judge import verdict as H
from .messages import msg

BANNED_ATTRIBUTES = set(H.ATTENTION_BUILTINS) | H.BUILTIN_MODULES | {"_scaled_dot_product_efficient_attention", "aten"}

# Parts of torch that reach operators below the Python API (and can switch off recording).
TORCH_INTERNALS = {"_C": "torch._C", "ops": "torch.ops", "_ops": "torch._ops", "overrides": "torch.overrides",
                   "library": "torch.library"}
# Modules that look up or import things by a name computed at run time.
DYNAMIC_MODULES = {"importlib": "importlib", "builtins": "builtins", "inspect": "inspect", "gc": "gc",
                   "ctypes": "ctypes", "pickle": "pickle", "marshal": "marshal", "types": "types"}
DYNAMIC_CALLS = {"__import__": "__import__", "eval": "eval", "exec": "exec", "compile": "compile",
                 "globals": "globals()", "vars": "vars()", "locals": "locals()"}
DYNAMIC_NAMES = {"__builtins__": "__builtins__", "__loader__": "__loader__", "__spec__": "__spec__"}
DYNAMIC_ATTRIBUTES = {
    "__dict__", "__builtins__", "__globals__", "__getattribute__", "__getattr__", "__subclasses__",
    "__import__", "__code__", "__closure__", "__loader__", "__spec__", "__mro__", "__bases__", "__base__",
    "__self__", "__func__", "__wrapped__", "__reduce__", "__reduce_ex__", "__torch_function__",
    "__torch_dispatch__", "__setattr__", "__delattr__",
    "f_globals", "f_locals", "f_builtins", "f_back", "gi_frame", "cr_frame", "tb_frame", "_getframe",
    "modules",   # sys.modules (only when read from sys, see below)
}
ATTRGETTERS = {"attrgetter", "methodcaller"}
TORCH_MODULES = {"torch", "F", "nn"}   # bound by the chapters' export cell


def _builtin_name(hit):
    return H.ATTENTION_BUILTINS.get(hit, f"nn.{hit}" if hit in H.BUILTIN_MODULES else f"torch.ops.{hit}")


def _folded(node):
    """The value of a string built from constants ("a" + "b", "".join([...]), f"{'a'}b"), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded(node.left), _folded(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_folded(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
        return "".join(parts) if all(p is not None for p in parts) else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" \
            and len(node.args) == 1 and isinstance(node.args[0], (ast.List, ast.Tuple)):
        sep, parts = _folded(node.func.value), [_folded(e) for e in node.args[0].elts]
        return sep.join(parts) if sep is not None and all(p is not None for p in parts) else None
    return None


def _root(node):
    """The name a dotted chain starts from: torch for torch.nn.functional.x, else None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _chain(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


class _Finder(ast.NodeVisitor):
    """The first forbidden construct in one answer cell, as a short description."""

    def __init__(self):
        self.torch_names = set(TORCH_MODULES)
        self.sys_names = {"sys"}
        self.called: set[int] = set()   # Name nodes in call position
        self.findings: list[str] = []

    def hit(self, what):
        if all(f.split(" (")[0] != what.split(" (")[0] for f in self.findings):
            self.findings.append(what)

    def visit_FunctionDef(self, node):
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.hit(msg("defines {name}, which intercepts torch's calls", name=node.name))
        self.generic_visit(node)

    # imports ------------------------------------------------------------------------
    def visit_Import(self, node):
        for alias in node.names:
            top, bound = alias.name.split(".")[0], (alias.asname or alias.name.split(".")[0])
            if top == "torch":
                self.torch_names.add(bound)
                for part in alias.name.split(".")[1:]:
                    self._torch_part(part, alias.name)
            elif top in DYNAMIC_MODULES:
                self.hit(msg("reaches {what} ({code})", what=DYNAMIC_MODULES[top], code=f"import {alias.name}"))
            elif top == "sys":
                self.sys_names.add(bound)
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        module = node.module or ""
        top = module.split(".")[0]
        names = [a.name for a in node.names]
        banned = next((n for n in names if n in BANNED_ATTRIBUTES), None)
        if banned:
            self.hit(msg("uses {name}", name=_builtin_name(banned)))
        if top == "torch":
            for part in module.split(".")[1:]:
                self._torch_part(part, module)
            for alias in node.names:
                self._torch_part(alias.name, f"{module}.{alias.name}")
                self.torch_names.add(alias.asname or alias.name)
        elif top in DYNAMIC_MODULES:
            self.hit(msg("reaches {what} ({code})", what=DYNAMIC_MODULES[top], code=f"from {module} import ..."))
        elif top == "sys" and any(n in DYNAMIC_ATTRIBUTES or n.startswith("_") for n in names):
            self.hit(msg("reaches {what}", what="sys." + next(n for n in names if n in DYNAMIC_ATTRIBUTES or n.startswith("_"))))
        elif top == "operator" and any(n in ATTRGETTERS for n in names):
            self.hit(msg("uses {name} (a computed attribute lookup)", name="operator." + next(n for n in names if n in ATTRGETTERS)))
        self.generic_visit(node)

    def _torch_part(self, part, where):
        if part in TORCH_INTERNALS:
            self.hit(msg("reaches {what} ({code})", what=TORCH_INTERNALS[part], code=where))
        elif part.startswith("_") and not part.startswith("__"):
            self.hit(msg("reaches torch's private internals ({code})", code=where))

    # attributes, names, calls ---------------------------------------------------------
    def visit_Attribute(self, node):
        attr = node.attr
        if attr in BANNED_ATTRIBUTES:
            self.hit(msg("uses {name}", name=_builtin_name(attr)))
        root = _root(node)
        if root in self.torch_names:
            parts = _chain(node).split(".")[1:]
            internal = next((p for p in parts if p in TORCH_INTERNALS), None)
            if internal:
                self.hit(msg("reaches {what} ({code})", what=TORCH_INTERNALS[internal], code=_chain(node)))
            elif any(p.startswith("_") and not p.startswith("__") for p in parts):
                self.hit(msg("reaches torch's private internals ({code})", code=_chain(node)))
        if attr == "modules" or attr == "_getframe":
            if root in self.sys_names:
                self.hit(msg("reaches {what} ({code})", what=f"sys.{attr}", code=_chain(node)))
        elif attr in DYNAMIC_ATTRIBUTES:
            self.hit(msg("reaches {what} ({code}), a lookup by computed name", what=attr, code=_chain(node)))
        if attr in ATTRGETTERS and root == "operator":
            self.hit(msg("uses {name} (a computed attribute lookup)", name=f"operator.{attr}"))
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in DYNAMIC_CALLS and id(node) not in self.called:
            self.hit(msg("passes {name} around, which runs or looks up code by a name computed at run time", name=node.id))
        elif node.id == "getattr" and id(node) not in self.called:
            self.hit(msg("passes getattr around as a value (a lookup by computed name)"))
        elif node.id in DYNAMIC_NAMES:
            self.hit(msg("reaches {what}", what=DYNAMIC_NAMES[node.id]))
        elif node.id in DYNAMIC_MODULES and isinstance(node.ctx, ast.Load) and node.id not in ("types",):
            self.hit(msg("reaches {what}", what=DYNAMIC_MODULES[node.id]))
        self.generic_visit(node)

    def visit_Call(self, node):  # noqa: C901
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if name in DYNAMIC_CALLS:
            self.hit(msg("calls {name}, which runs or looks up code by a name computed at run time", name=DYNAMIC_CALLS[name]))
        own = isinstance(node.args[0], ast.Name) and node.args[0].id == "self" if node.args else False
        if name == "getattr" and len(node.args) >= 2 and _folded(node.args[1]) is None and not own:
            self.hit(msg("calls getattr() with a computed attribute name ({code})", code=ast.unparse(node.args[1])[:40]))
        if isinstance(func, ast.Name):
            self.called.add(id(func))
        self._check_folded(node)
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and node.value in BANNED_ATTRIBUTES:
            self.hit(msg("uses {name}", name=_builtin_name(node.value)))

    def visit_BinOp(self, node):
        self._check_folded(node)

    def visit_JoinedStr(self, node):
        self._check_folded(node)

    def _check_folded(self, node):
        text = _folded(node)
        banned = next((b for b in sorted(BANNED_ATTRIBUTES) if len(b) > 5 and b in (text or "")), None)
        if banned:
            self.hit(msg("uses {name} (its name assembled from pieces)", name=_builtin_name(banned)))
        if not isinstance(node, ast.Call):
            self.generic_visit(node)


def find_forbidden(source: str) -> str | None:
    """What an answer cell's source reaches that a from-scratch exercise must not, or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    finder = _Finder()
    # Imports first, wherever they are, so that aliases are known when attributes are read.
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            finder.visit(node)
    finder.visit(tree)
    if not finder.findings:
        return None
    # Name the built-in first when there is one, then what else was reached.
    findings = sorted(finder.findings, key=lambda f: not f.startswith("uses "))
    return findings[0] if len(findings) == 1 else msg("{first} and {second}", first=findings[0], second=findings[1])


def static_builtin_use(nb, from_scratch) -> dict[str, str]:
    """Answer cells of from-scratch exercises that use or reach a built-in solver (read, never run)."""
    found = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {}) if cell.cell_type == "code" else {}
        name = meta.get("grade_id")
        if not meta.get("solution") or name not in from_scratch or name in found:
            continue
        what = find_forbidden(cell.source)
        if what:
            found[name] = msg("`{name}` {what}: this exercise asks you to build it from scratch, so it earns "
                              "no marks", name=name, what=what)
    return found
