"""Read a submission's code, never run it: do its from-scratch exercises use a built-in solver?

What is read: every cell the learner can edit or add, as grading runs it (``learner_cells``,
which keeps cells as ``submission.repaired`` does): the answer cells, the chapter's imports and
given helpers (given, but not locked), a helper or a test of the learner's own, a changed or
re-typed cell. Not read: the read-only test cells (restored from the release) and the given demo
cells (never run while grading). IPython magics are read as IPython runs them (the code of
``%timeit``/``%%time`` is read; ``%run`` and the like run code no one can read here).

Four kinds of finding, each a one-line reason that names what was found and in which cell
(its position in the submitted notebook, the first cell being 1):

1. the built-in named outright (``F.scaled_dot_product_attention``, ``nn.MultiheadAttention``,
   ``torch.ops.aten...``, or its name as a string, also when assembled from pieces:
   ``"scaled_dot_" + "product_attention"``), in the code an exercise's tests run;
2. a way to reach one without naming it, in that code: torch's internals (``torch._C``,
   ``torch.ops``, ``torch._ops``, ``torch.overrides``, ``torch.library``, any private
   ``torch._x``), dynamic lookup (``importlib``, ``__import__``, ``eval``/``exec``/``compile``,
   ``globals()``, ``vars()``, ``__dict__``, ``__builtins__``, ``sys.modules``, ``inspect``,
   ``gc``, frames), ``getattr``/``operator.attrgetter`` with a computed attribute name, a
   library whose own models would do the exercise's work (``transformers``, ``timm``: their attention
   is plain matmul and softmax, which no list of torch built-ins catches), or a module this environment
   does not install (one the notebook wrote itself).

   The code an exercise's tests run is its definitions (the answer cell; a later cell that
   binds its name again) and, transitively, every top-level definition of a global name that
   code uses, in any learner cell: a function, a class, an assignment, an import, a change to
   the object the name holds (``table["f"] = ...``, ``obj.method = ...``, ``cache.update(...)``).
   Names are resolved by Python's own scoping (``symtable``): a local ``out`` is not the global
   ``out`` of a test cell. A dependency the grader replaces by the reference during the
   exercise's tests (``SelfAttention``'s ``scaled_dot_product_attention``) is not followed.
   Code that never runs when the exercise is called costs nothing: a learner's own test cell
   that compares their answer with ``F.scaled_dot_product_attention`` is a correct habit.

3. tampering with the grader or the interpreter, anywhere in learner code: the kernel's probe
   modules (``attn_probe``, ``attn_wire``), ``sys.modules`` and import hooks, audit and trace
   hooks, ``builtins``, torch's dispatch (``torch.overrides``, ``TorchFunctionMode``,
   ``DisableTorchFunction``, ``torch._C``, ``__torch_function__``), the interpreter's objects and
   frames (``gc.get_objects``, ``__closure__``, ``__code__``, ``__globals__``, ``f_back``),
   ``ctypes``, code run from a string that is not a constant or from a file (``exec``,
   ``importlib``, ``%run``): every from-scratch exercise earns nothing. A correct notebook has
   no reason for any of these.
4. a change to a shared object (an attribute of a module or of its classes set or deleted,
   ``setattr``/``delattr`` on anything but ``self``, a write into ``globals()``, ``vars()`` or a
   ``__dict__``, a module handed to the notebook's own function) whose new value reaches (1) or
   (2): every from-scratch exercise earns nothing. A patch without a built-in
   (``torch.allclose = lambda *a, **k: True``) gains nothing anyway: the grader compares results
   outside the kernel.

What the kernel records about itself (``attn_probe``'s list of torch calls) is a second way to
lose marks, never a way to earn them: the kernel could forge it, this reading it cannot.
"""
from __future__ import annotations

import ast
import collections
import copy
import dataclasses
import functools
import importlib.util
import os
import symtable
import sys

from coursekit import conventions as C

from .judge import verdict as H
from .messages import msg

BANNED_ATTRIBUTES = set(H.ATTENTION_BUILTINS) | H.BUILTIN_MODULES | {"_scaled_dot_product_efficient_attention", "aten"}

# Parts of torch that reach operators below the Python API (and can switch off recording).
TORCH_INTERNALS = {"_C": "torch._C", "ops": "torch.ops", "_ops": "torch._ops", "overrides": "torch.overrides",
                   "library": "torch.library"}
# Modules that look up or import things by a name computed at run time.
DYNAMIC_MODULES = {"importlib": "importlib", "builtins": "builtins", "inspect": "inspect", "gc": "gc",
                   "ctypes": "ctypes", "pickle": "pickle", "marshal": "marshal", "types": "types",
                   "runpy": "runpy"}
DYNAMIC_CALLS = {"__import__": "__import__", "eval": "eval", "exec": "exec", "compile": "compile",
                 "globals": "globals()", "vars": "vars()", "locals": "locals()"}
DYNAMIC_NAMES = {"__builtins__": "__builtins__", "__loader__": "__loader__", "__spec__": "__spec__"}
DYNAMIC_ATTRIBUTES = {
    "__dict__", "__builtins__", "__globals__", "__getattribute__", "__getattr__", "__subclasses__",
    "__import__", "__code__", "__closure__", "__loader__", "__spec__", "__mro__", "__bases__", "__base__",
    "__self__", "__func__", "__wrapped__", "__reduce__", "__reduce_ex__", "__torch_function__",
    "__torch_dispatch__", "__setattr__", "__delattr__", "cell_contents",
    "f_globals", "f_locals", "f_builtins", "f_back", "gi_frame", "cr_frame", "tb_frame", "_getframe",
    "modules",   # sys.modules (only when read from sys, see below)
}
ATTRGETTERS = {"attrgetter", "methodcaller"}
# Libraries of ready-made models: a from-scratch exercise that calls their layers did not write its own.
MODEL_LIBRARIES = {"transformers", "timm", "torchvision", "xformers", "flash_attn"}
TORCH_MODULES = {"torch", "F", "nn"}   # bound by the chapters' export cell

# Tampering (kind 3): anywhere in learner code, it costs every from-scratch exercise.
GRADER_MODULES = {"attn_probe", "attn_wire"}
TAMPER_MODULES = {"builtins", "importlib", "ctypes", "runpy"}
TAMPER_CALLS = {"__import__", "exec", "eval", "compile"}   # unless their code is a constant (then read)
TAMPER_ATTRIBUTES = {"__builtins__", "__globals__", "__subclasses__", "__code__", "__closure__", "cell_contents",
                     "__torch_function__", "__torch_dispatch__", "f_globals", "f_locals", "f_builtins", "f_back",
                     "gi_frame", "cr_frame", "tb_frame", "_getframe"}
SYS_TAMPER = {"modules", "meta_path", "path_hooks", "path_importer_cache", "addaudithook", "settrace", "setprofile",
              "_getframe", "_current_frames", "monitoring"}
TAMPER_FUNCTIONS = {  # module -> its functions that reach the interpreter's objects or hooks
    "gc": {"get_objects", "get_referrers", "get_referents"},
    "inspect": {"currentframe", "stack", "trace", "getouterframes", "getinnerframes"},
    "threading": {"settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads"},
}
TORCH_DISPATCH = {"TorchFunctionMode", "TorchDispatchMode", "DisableTorchFunction", "DisableTorchFunctionSubclass",
                  "enable_reentrant_dispatch", "_python_dispatch"}
# IPython magics: those whose code is read as Python, those that run code no one can read here.
CODE_MAGICS = {"time", "timeit", "prun", "capture"}
OPAQUE_MAGICS = {"run", "load", "loadpy", "macro", "rerun", "recall", "r", "store", "edit", "pastebin"}
# Calls that change the object they are called on (a change to a name's object is a definition of it).
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "add", "__setitem__", "__setattr__",
            "register_forward_hook", "register_forward_pre_hook", "register_module", "add_module",
            "register_buffer", "register_parameter"}
PATCHERS = {"setattr", "delattr"}


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
    while isinstance(node, (ast.Attribute, ast.Subscript)):
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


@functools.lru_cache(maxsize=None)
def installed(module: str) -> bool:
    """Whether this Python (the kernel's too: the sandbox runs the grader's venv) provides top-level MODULE."""
    if module in sys.stdlib_module_names or module in sys.builtin_module_names:
        return True
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin or "", *(spec.submodule_search_locations or [])]
    prefixes = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix)}
    return spec.origin in ("built-in", "frozen") or any(
        os.path.realpath(p).startswith(tuple(prefixes)) for p in places if p)


# A finding's kind, the numbered kinds of this module's docstring: a built-in named outright (1), a
# way to reach one (2), tampering (3; costs every from-scratch exercise, wherever it is).
BUILT_IN, REACH, TAMPER = "built-in", "reach", "tamper"


@dataclasses.dataclass(frozen=True)
class Finding:
    text: str            # "uses torch.nn.functional.scaled_dot_product_attention", ...
    kind: str = REACH

    @property
    def tamper(self) -> bool:
        return self.kind == TAMPER


class _Finder(ast.NodeVisitor):
    """What one piece of learner code reaches that a from-scratch exercise must not, in order."""

    def __init__(self, aliases=None):
        """aliases: name -> the module it is bound to anywhere in the notebook (``g`` -> ``gc``)."""
        self.aliases = dict(aliases or {})
        self.torch_names = set(TORCH_MODULES) | {n for n, m in self.aliases.items() if m.split(".")[0] == "torch"}
        self.sys_names = {"sys"} | {n for n, m in self.aliases.items() if m == "sys"}
        self.called: set[int] = set()   # Name nodes in call position
        self.findings: list[Finding] = []

    def hit(self, what, tamper=False, built_in=False):
        key = what.split(" (")[0]
        for i, f in enumerate(self.findings):
            if f.text.split(" (")[0] == key:
                if tamper and not f.tamper:
                    self.findings[i] = Finding(f.text, TAMPER)
                return
        self.findings.append(Finding(what, TAMPER if tamper else BUILT_IN if built_in else REACH))

    def visit_FunctionDef(self, node):
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.hit(msg("defines {name}, which intercepts torch's calls", name=node.name), tamper=True)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    # imports ------------------------------------------------------------------------
    def visit_Import(self, node):
        for alias in node.names:
            top, bound = alias.name.split(".")[0], (alias.asname or alias.name.split(".")[0])
            self.aliases.setdefault(bound, alias.name if alias.asname else top)
            if top == "torch":
                self.torch_names.add(bound)
                for part in alias.name.split(".")[1:]:
                    self._torch_part(part, alias.name)
            elif top in DYNAMIC_MODULES:
                self.hit(msg("reaches {what} ({code})", what=DYNAMIC_MODULES[top], code=f"import {alias.name}"),
                         tamper=top in TAMPER_MODULES)
            elif top == "sys":
                self.sys_names.add(bound)
            else:
                self._module(top, f"import {alias.name}")
        self.generic_visit(node)

    def visit_ImportFrom(self, node):
        module = node.module or ""
        top = module.split(".")[0]
        names = [a.name for a in node.names]
        banned = next((n for n in names if n in BANNED_ATTRIBUTES), None)
        if banned:
            self.hit(msg("uses {name}", name=_builtin_name(banned)), built_in=True)
        if top == "torch":
            for part in module.split(".")[1:]:
                self._torch_part(part, module)
            for alias in node.names:
                self._torch_part(alias.name, f"{module}.{alias.name}")
                self.torch_names.add(alias.asname or alias.name)
        elif top in DYNAMIC_MODULES:
            self.hit(msg("reaches {what} ({code})", what=DYNAMIC_MODULES[top], code=f"from {module} import ..."),
                     tamper=top in TAMPER_MODULES or bool(set(names) & TAMPER_FUNCTIONS.get(top, set())))
        elif top == "sys" and any(n in DYNAMIC_ATTRIBUTES or n in SYS_TAMPER or n.startswith("_") for n in names):
            self.hit(msg("reaches {what}", what="sys." + next(n for n in names if n in DYNAMIC_ATTRIBUTES or
                                                             n in SYS_TAMPER or n.startswith("_"))), tamper=True)
        elif top == "operator" and any(n in ATTRGETTERS for n in names):
            self.hit(msg("uses {name} (a computed attribute lookup)", name="operator." + next(n for n in names if n in ATTRGETTERS)))
        elif node.level or top != "sys":
            self._module("." * node.level + top if node.level else top, f"from {'.' * node.level}{module} import ...")
        if top in TAMPER_FUNCTIONS and set(names) & TAMPER_FUNCTIONS[top]:
            self.hit(msg("reaches {what}", what=f"{top}." + sorted(set(names) & TAMPER_FUNCTIONS[top])[0]), tamper=True)
        self.generic_visit(node)

    def _module(self, top, code):
        if top in GRADER_MODULES:
            self.hit(msg("reaches {what} ({code})", what=top, code=code), tamper=True)
        elif top in MODEL_LIBRARIES:
            self.hit(msg("uses {name}, a library of ready-made models ({code})", name=top, code=code))
        elif top.startswith(".") or not installed(top):
            self.hit(msg("imports {name}, which this environment does not install (code the check cannot read)",
                         name=top.lstrip(".") or "."))

    def _torch_part(self, part, where):
        if part in TORCH_INTERNALS:
            self.hit(msg("reaches {what} ({code})", what=TORCH_INTERNALS[part], code=where), tamper=True)
        elif part in TORCH_DISPATCH:
            self.hit(msg("reaches {what} ({code})", what=part, code=where), tamper=True)
        elif part.startswith("_") and not part.startswith("__"):
            self.hit(msg("reaches torch's private internals ({code})", code=where), tamper=True)

    # attributes, names, calls ---------------------------------------------------------
    def visit_Attribute(self, node):
        attr = node.attr
        if attr in BANNED_ATTRIBUTES:
            self.hit(msg("uses {name}", name=_builtin_name(attr)), built_in=True)
        root = _root(node)
        if root in self.torch_names:
            parts = _chain(node).split(".")[1:]
            internal = next((p for p in parts if p in TORCH_INTERNALS), None)
            if internal:
                self.hit(msg("reaches {what} ({code})", what=TORCH_INTERNALS[internal], code=_chain(node)), tamper=True)
            elif any(p in TORCH_DISPATCH for p in parts):
                self.hit(msg("reaches {what} ({code})", what=next(p for p in parts if p in TORCH_DISPATCH),
                             code=_chain(node)), tamper=True)
            elif any(p.startswith("_") and not p.startswith("__") for p in parts):
                self.hit(msg("reaches torch's private internals ({code})", code=_chain(node)), tamper=True)
        if root in self.sys_names and isinstance(node.value, ast.Name) and (attr in SYS_TAMPER or attr == "_getframe"):
            self.hit(msg("reaches {what} ({code})", what=f"sys.{attr}", code=_chain(node)), tamper=True)
        elif attr == "modules":
            pass   # a module's own .modules() (nn.Module) is no lookup
        elif attr in DYNAMIC_ATTRIBUTES:
            self.hit(msg("reaches {what} ({code}), a lookup by computed name", what=attr, code=_chain(node)),
                     tamper=attr in TAMPER_ATTRIBUTES)
        if attr in ATTRGETTERS and root == "operator":
            self.hit(msg("uses {name} (a computed attribute lookup)", name=f"operator.{attr}"))
        module = self.aliases.get(node.value.id, node.value.id) if isinstance(node.value, ast.Name) else None
        if attr in TAMPER_FUNCTIONS.get(module, ()):
            self.hit(msg("reaches {what}", what=f"{module}.{attr}"), tamper=True)
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in DYNAMIC_CALLS and id(node) not in self.called:
            self.hit(msg("passes {name} around, which runs or looks up code by a name computed at run time", name=node.id),
                     tamper=node.id in TAMPER_CALLS)
        elif node.id == "getattr" and id(node) not in self.called:
            self.hit(msg("passes getattr around as a value (a lookup by computed name)"))
        elif node.id in DYNAMIC_NAMES:
            self.hit(msg("reaches {what}", what=DYNAMIC_NAMES[node.id]), tamper=node.id == "__builtins__")
        elif node.id in DYNAMIC_MODULES and isinstance(node.ctx, ast.Load) and node.id not in ("types",):
            self.hit(msg("reaches {what}", what=DYNAMIC_MODULES[node.id]), tamper=node.id in TAMPER_MODULES)
        elif node.id in GRADER_MODULES or node.id in TORCH_DISPATCH:
            self.hit(msg("reaches {what}", what=node.id), tamper=True)
        elif node.id == "get_ipython":
            self.hit(msg("runs code the check cannot read ({code})", code="get_ipython()"), tamper=True)
        self.generic_visit(node)

    def visit_Call(self, node):  # noqa: C901
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if name in DYNAMIC_CALLS:
            self.hit(msg("calls {name}, which runs or looks up code by a name computed at run time", name=DYNAMIC_CALLS[name]),
                     tamper=name in TAMPER_CALLS)
        own = isinstance(node.args[0], ast.Name) and node.args[0].id == "self" if node.args else False
        if name == "getattr" and len(node.args) >= 2 and _folded(node.args[1]) is None and not own:
            self.hit(msg("calls getattr() with a computed attribute name ({code})", code=ast.unparse(node.args[1])[:40]))
        if isinstance(func, ast.Name):
            self.called.add(id(func))
        if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2 and \
                isinstance(_folded(node.args[1]), str) and _folded(node.args[1]).isidentifier():
            # getattr(x, "name") reaches what x.name does
            self.visit_Attribute(ast.Attribute(value=node.args[0], attr=_folded(node.args[1]), ctx=ast.Load()))
        self._check_folded(node)
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and node.value in BANNED_ATTRIBUTES:
            self.hit(msg("uses {name}", name=_builtin_name(node.value)), built_in=True)
        elif isinstance(node.value, str) and node.value in GRADER_MODULES:
            self.hit(msg("reaches {what}", what=node.value), tamper=True)

    def visit_BinOp(self, node):
        self._check_folded(node)

    def visit_JoinedStr(self, node):
        self._check_folded(node)

    def _check_folded(self, node):
        text = _folded(node)
        banned = next((b for b in sorted(BANNED_ATTRIBUTES) if len(b) > 5 and b in (text or "")), None)
        if banned:
            self.hit(msg("uses {name} (its name assembled from pieces)", name=_builtin_name(banned)), built_in=True)
        grader = next((g for g in sorted(GRADER_MODULES) if g in (text or "")), None)
        if grader and not isinstance(node, ast.Constant):
            self.hit(msg("reaches {what}", what=grader), tamper=True)
        if not isinstance(node, ast.Call):
            self.generic_visit(node)


def _described(findings: list[Finding]) -> str | None:
    """One line for a list of findings: the built-in first when there is one, then what else."""
    if not findings:
        return None
    texts = [f.text for f in sorted(findings, key=lambda f: f.kind != BUILT_IN)]
    return texts[0] if len(texts) == 1 else msg("{first} and {second}", first=texts[0], second=texts[1])


def _findings(nodes, aliases=None) -> list[Finding]:
    finder = _Finder(aliases)
    # Imports first, wherever they are, so that aliases are known when attributes are read.
    for node in nodes:
        for inner in ast.walk(node):
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                finder.visit(inner)
    for node in nodes:
        finder.visit(node)
    return finder.findings


# ------------------------------------------------------------------ which cells are learner code

@dataclasses.dataclass
class LearnerCell:
    number: int          # its position in the submitted notebook (the first cell is 1)
    source: str
    answer: str | None   # the exercise whose answer cell it is, else None


def learner_cells(nb, release) -> list[LearnerCell]:
    """The cells of the submission NB that run as the learner wrote them, as ``submission.repaired``
    keeps them: a code answer cell of the RELEASE (its first copy, whatever its type now), every
    code cell that is no course cell of the release (added, a duplicate, given code with its
    metadata changed, the unlocked imports cell); not the release's other course cells (restored
    from it, or written answers: prose), nor given demo cells (shown as markdown, not run)."""
    course = {C.grade_id(c): c for c in release.cells if C.grade_id(c)}
    seen, cells = set(), []
    for number, cell in enumerate(nb.cells, 1):
        grade_id = C.grade_id(cell)
        if C.role(cell) == "given" and not grade_id:
            continue
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        released = course.get(grade_id)
        if released is not None and grade_id not in seen:
            seen.add(grade_id)
            if C.is_answer_cell(released) and released.cell_type == "code":
                cells.append(LearnerCell(number, source, grade_id))
            continue
        if released is not None and C.is_test_cell(released):
            continue   # a duplicate test cell: dropped
        if cell.cell_type == "code":
            cells.append(LearnerCell(number, source, None))
    return cells


def _parse(source: str) -> ast.Module | None:
    """A cell's code as IPython runs it (magics turned into calls), or None if it cannot run."""
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return ast.parse(TransformerManager().transform_cell(source))
    except Exception:  # noqa: BLE001 - a cell that does not compile runs nothing
        return None


class _Expand(ast.NodeTransformer):
    """Code in strings made readable: ``exec("...")``/``eval("...")`` of a constant and the code of
    ``%timeit``-like magics become statements of the cell; ``%run``-like magics are noted."""

    def __init__(self):
        self.extra: list[ast.stmt] = []
        self.opaque: list[str] = []
        self.written: list[str] = []   # files %%writefile writes

    def visit_Call(self, node):
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("exec", "eval") and node.args \
                and _folded(node.args[0]) is not None:
            return self._read(_folded(node.args[0]), node)
        magic = _magic(node)
        if magic is None:
            return node
        kind, name, line, body = magic
        if kind == "cell" and name == "writefile":
            self.written.append(line.split()[-1] if line.split() else "")
        if name in OPAQUE_MAGICS:
            self.opaque.append(f"%{name}")
            return ast.Constant(None)
        if name in CODE_MAGICS:
            return self._read(body if kind == "cell" else _without_options(line), node)
        return ast.Constant(None) if kind in ("line", "cell", "system") else node

    def _read(self, code, node):
        tree = _parse(code)   # its own magics too (a %%time body may hold %run)
        if tree is not None:
            self.extra += tree.body
        return ast.copy_location(ast.Constant(None), node)


def _magic(node):
    """("line" | "cell" | "system", name, line, body) for IPython's own calls of a magic, else None."""
    func = node.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name) and func.value.func.id == "get_ipython"
            and not func.value.args):
        return None
    args = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in node.args]
    if None in args:
        return None
    if func.attr in ("system", "getoutput"):
        return ("system", "", "", "")
    if func.attr == "run_line_magic" and len(args) == 2:
        return ("line", args[0], args[1], "")
    if func.attr == "run_cell_magic" and len(args) == 3:
        return ("cell", args[0], args[1], args[2])
    return None


def _without_options(line: str) -> str:
    """A line magic's code without its leading options (``-n 10 -r 3 f(x)`` -> ``f(x)``)."""
    words = line.split()
    while words and words[0].startswith("-"):
        option = words.pop(0)
        if len(option) == 2 and words and words[0].replace(".", "").isdigit():
            words.pop(0)
    return " ".join(words)


# ------------------------------------------------------------------ what each statement does

def _scoping(node) -> tuple[set[str], set[str]]:
    """(global names a top-level statement reads, global names it binds), by Python's own scoping
    (a local ``out`` is not a global ``out``; ``global`` names bound in its functions count)."""
    try:
        table = symtable.symtable(ast.unparse(node), "<cell>", "exec")
    except (SyntaxError, ValueError, RecursionError):   # read every name as global
        names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
        return {n.id for n in names}, {n.id for n in names if not isinstance(n.ctx, ast.Load)}
    uses, binds, tables = set(), set(), [table]
    while tables:
        t = tables.pop()
        tables += t.get_children()
        top = t.get_type() == "module"
        for sym in t.get_symbols():
            if sym.is_referenced() and (top or sym.is_global()):
                uses.add(sym.get_name())
            if (sym.is_assigned() or sym.is_imported()) and (top or sym.is_declared_global()):
                binds.add(sym.get_name())
    return uses, binds


def _global_uses(node) -> set[str]:
    return _scoping(ast.Expr(node) if isinstance(node, ast.expr) else node)[0]


def _locals(params, body) -> set[str]:
    """A function's local names: its parameters and what it binds, less its global/nonlocal ones."""
    nodes = [n for s in (body if isinstance(body, list) else [body]) for n in ast.walk(s)]
    declared = {name for n in nodes if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    assigned = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    return (set(params) | assigned) - declared


class _Scopes(ast.NodeVisitor):
    """Walks one statement knowing, at every node, which names are local to a function around it."""

    def __init__(self):
        self.local_stack: list = []   # per function around: its locals (read when first asked)
        self.param_stack: list[set[str]] = []
        self.method_self: list[str | None] = []   # the first parameter of a method, per function
        self.in_class = 0

    def is_local(self, name) -> bool:
        for i, scope in enumerate(self.local_stack):
            if not isinstance(scope, set):
                self.local_stack[i] = scope = _locals(*scope)
            if name in scope:
                return True
        return False

    def _function(self, node, args, body):
        params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)] + \
                 [a.arg for a in (args.vararg, args.kwarg) if a]
        self.local_stack.append((params, body))
        self.param_stack.append(set(params))
        self.method_self.append(params[0] if self.in_class and params else None)
        in_class, self.in_class = self.in_class, 0
        for child in (body if isinstance(body, list) else [body]):
            self.visit(child)
        self.in_class = in_class
        self.method_self.pop()
        self.param_stack.pop()
        self.local_stack.pop()

    def visit_FunctionDef(self, node):
        for d in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if d is not None:
                self.visit(d)
        self._function(node, node.args, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._function(node, node.args, node.body)

    def visit_ClassDef(self, node):
        for d in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(d)
        self.in_class += 1
        for child in node.body:
            self.visit(child)
        self.in_class -= 1


class _Effects(_Scopes):
    """What one top-level statement changes: global names whose object it changes (a change to
    a name is a definition of it) and the patches of shared objects it makes (kind 4)."""

    def __init__(self, modules: set[str], learner_defined: set[str]):
        super().__init__()
        self.modules, self.learner_defined = modules, learner_defined
        self.mutated: set[str] = set()
        self.patches: list[tuple[str, list[ast.AST]]] = []   # (what is changed, what it gets)
        self.param_patch = False   # it changes an object handed to it (a parameter's attribute)
        self.handed: list[tuple[str, ast.Call]] = []   # (callee, call): a module handed to the notebook's code

    def _target(self, target, value):
        """An attribute or item stored to (or deleted): a change of a name, or a patch."""
        node = target
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        chain = ast.unparse(target)
        if isinstance(target, ast.Subscript) and _namespace(target.value):
            self.patches.append((chain, value))
        elif not isinstance(node, ast.Name):
            if isinstance(target, ast.Attribute):
                self.patches.append((chain, value))
        elif node.id in self.modules:
            self.patches.append((chain, value))
        elif self.is_local(node.id):
            # A parameter may be handed a module (``def patch(m): m.softmax = ...``): a patch
            # where a module is handed to it (``handed``); a method's ``self`` is the object it builds.
            if node.id in self.param_stack[-1] and node.id != self.method_self[-1]:
                self.param_patch = True
        else:
            self.mutated.add(node.id)

    def visit_Assign(self, node):
        for target in node.targets:
            for t in _targets(target):
                self._target(t, [node.value])
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        for t in _targets(node.target):
            self._target(t, [node.value])
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            for t in _targets(node.target):
                self._target(t, [node.value])
        self.generic_visit(node)

    def visit_Delete(self, node):
        for target in node.targets:
            for t in _targets(target):
                self._target(t, [])
        self.generic_visit(node)

    def visit_Call(self, node):
        func = node.func
        args = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(func, ast.Name) and func.id in PATCHERS and node.args:
            obj = node.args[0]
            if not (isinstance(obj, ast.Name) and self.method_self and obj.id == self.method_self[-1]):
                self.patches.append((f"{func.id}({ast.unparse(obj)}, ...)", args[1:]))
                self.param_patch |= isinstance(obj, ast.Name) and any(obj.id in p for p in self.param_stack)
        elif isinstance(func, ast.Attribute) and func.attr in MUTATORS:
            if _namespace(func.value):
                self.patches.append((ast.unparse(func.value), args))
            else:
                root = _root(func.value)
                if root is not None and not self.is_local(root) and root not in self.modules:
                    self.mutated.add(root)
        # A module handed to the notebook's own function or class (a patch if that changes it).
        callee = _root(func)
        if callee in self.learner_defined and not self.is_local(callee) and \
                any(_root(a) in self.modules and isinstance(a, (ast.Name, ast.Attribute)) for a in args):
            self.handed.append((callee, node))
        self.generic_visit(node)


def _definition_only(node):
    """A copy of a top-level statement without what only runs when called (function and lambda
    bodies): what runs when the cell does."""
    class Strip(ast.NodeTransformer):
        def visit_FunctionDef(self, n):
            n = self.generic_visit(n)
            n.body = [ast.Pass()]
            return n

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Lambda(self, n):
            n = self.generic_visit(n)
            n.body = ast.Constant(None)
            return n
    return Strip().visit(copy.deepcopy(node))


# What could make a statement worth a full reading (a cheap look at its nodes first).
_SUSPECT_NAMES = {*DYNAMIC_CALLS, *DYNAMIC_NAMES, *DYNAMIC_MODULES, *GRADER_MODULES, *TORCH_DISPATCH,
                  *TAMPER_FUNCTIONS, "get_ipython", "getattr", "setattr", "delattr", "hasattr", "attrgetter",
                  "methodcaller", "sys"}
_SUSPECT_ATTRIBUTES = {*BANNED_ATTRIBUTES, *TORCH_INTERNALS, *TORCH_DISPATCH, *SYS_TAMPER, *DYNAMIC_ATTRIBUTES,
                       *ATTRGETTERS, *(f for fs in TAMPER_FUNCTIONS.values() for f in fs)}


def _suspect(nodes) -> bool:
    """Whether a statement has anything a finding could come from (else ``_Finder`` is skipped)."""
    for n in nodes:
        if isinstance(n, (ast.Import, ast.ImportFrom, ast.JoinedStr)):
            return True
        if isinstance(n, ast.Name) and (n.id in _SUSPECT_NAMES or n.id in TORCH_MODULES):
            if n.id not in TORCH_MODULES:
                return True
        elif isinstance(n, ast.Attribute) and (n.attr in _SUSPECT_ATTRIBUTES or n.attr.startswith("_")):
            return True
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and (
                n.value in BANNED_ATTRIBUTES or any(g in n.value for g in GRADER_MODULES) or
                any(len(b) > 5 and b in n.value for b in BANNED_ATTRIBUTES)):
            return True
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and any(
                isinstance(side, (ast.Constant, ast.JoinedStr, ast.BinOp)) for side in (n.left, n.right)):
            return True
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "join":
            return True
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("__torch_"):
            return True
    return False


def _changes_something(nodes, modules, learner_defined) -> bool:
    """Whether a statement could change an object (``_Effects``): it stores to an attribute or an
    item, deletes, calls a changing method or setattr, or hands a module to the notebook's code."""
    for n in nodes:
        if isinstance(n, ast.Delete) or isinstance(n, (ast.Attribute, ast.Subscript)) and \
                not isinstance(n.ctx, ast.Load):
            return True
        if isinstance(n, ast.Call):
            func = n.func
            if isinstance(func, ast.Name) and func.id in PATCHERS or \
                    isinstance(func, ast.Attribute) and func.attr in MUTATORS:
                return True
            if _root(func) in learner_defined and any(_root(a) in modules for a in n.args):
                return True
    return False


def _names_bound(target):
    """The plain names an assignment target binds (``a, *b = ...``), not ``x[i]`` nor ``x.y``."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _names_bound(t)
    elif isinstance(target, ast.Starred):
        yield from _names_bound(target.value)


def _targets(target):
    if isinstance(target, (ast.Tuple, ast.List)):
        for t in target.elts:
            yield from _targets(t)
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value)
    elif isinstance(target, (ast.Attribute, ast.Subscript)):
        yield target


def _namespace(node) -> bool:
    """``globals()``, ``vars(...)``, ``locals()``, ``x.__dict__``: a namespace written into."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("globals", "vars", "locals"):
        return True
    return isinstance(node, ast.Attribute) and node.attr == "__dict__"


# ------------------------------------------------------------------ the notebook as a whole

@dataclasses.dataclass
class _Statement:
    cell: LearnerCell
    node: ast.stmt
    binds: set[str]
    uses: set[str]
    star: str | None = None   # the module of ``from M import *``
    nodes: list = dataclasses.field(default_factory=list)   # every node in it (ast.walk)


class _Program:
    """Every learner cell's top-level statements, indexed by the global names they define."""

    def __init__(self, cells: list[LearnerCell]):
        self.cells = cells
        self.statements: list[_Statement] = []
        self.opaque: list[tuple[LearnerCell, str]] = []
        written: list[str] = []
        for cell in cells:
            tree = _parse(cell.source)
            if tree is None:
                continue
            expand = _Expand()
            # Only a cell that names exec, eval or IPython's calls has code in strings to read.
            readable = any(word in cell.source for word in ("exec", "eval", "get_ipython", "%", "!"))
            body = [expand.visit(s) for s in tree.body] if readable else tree.body
            while expand.extra:   # code read from strings may hold more of it
                extra, expand.extra = expand.extra, []
                body += [expand.visit(s) for s in extra]
            self.opaque += [(cell, what) for what in expand.opaque]
            written += expand.written
            for node in body:
                star = next((n.module or "." for n in [node] if isinstance(n, ast.ImportFrom)
                             and any(a.name == "*" for a in n.names)), None)
                uses, binds = _scoping(node)
                self.statements.append(_Statement(cell, node, binds, uses, star, list(ast.walk(node))))
        self.aliases = self._module_names()
        self.modules = set(self.aliases)
        learner_defined = {n for s in self.statements if not isinstance(s.node, (ast.Import, ast.ImportFrom))
                           for n in s.binds}
        self.patches: list[tuple[_Statement, str, list]] = []
        handed, patching = [], set()
        for s in self.statements:
            if not _changes_something(s.nodes, self.modules, learner_defined):
                continue
            effects = _Effects(self.modules, learner_defined)
            effects.visit(s.node)
            s.binds |= effects.mutated
            self.patches += [(s, target, value) for target, value in effects.patches]
            handed += [(s, callee, call) for callee, call in effects.handed]
            if effects.param_patch:
                patching |= s.binds
        self.defs: dict[str, list[_Statement]] = collections.defaultdict(list)
        for s in self.statements:
            for name in s.binds:
                self.defs[name].append(s)
        # A module handed to a function of the notebook that changes what it is handed: the call
        # is the patch, and everything it passes is the new value.
        self.patches += [(s, msg("{module} (handed to {callee})", callee=callee, module=", ".join(
            ast.unparse(a) for a in [*call.args, *(k.value for k in call.keywords)] if _root(a) in self.modules)),
            [call]) for s, callee, call in handed if callee in patching]
        self.written = written + self._written_files()
        self._found: dict[int, list[Finding]] = {}

    def _module_names(self) -> dict[str, str]:
        """name -> the module (or what of it) it is bound to anywhere in the notebook: imports, and
        aliases (``m = torch.nn``, ``for m in (torch, F)``); names, not scopes."""
        aliases = {"torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn", "sys": "sys"}
        for s in self.statements:
            for node in s.nodes:
                if isinstance(node, ast.Import):
                    for a in node.names:
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    top = node.module.split(".")[0]
                    if top in ("torch", "sys", "gc", "inspect", "threading", "builtins", *GRADER_MODULES):
                        aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                                        if a.name != "*"})
        assignments = [n for s in self.statements for n in s.nodes if isinstance(n, (ast.Assign, ast.For))]
        for _ in range(3):   # aliases of aliases
            for node in assignments:
                value = node.value if isinstance(node, ast.Assign) else node.iter
                values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
                bound = next((v for v in values if isinstance(v, (ast.Name, ast.Attribute)) and _root(v) in aliases),
                             None)
                if bound is None:
                    continue
                module = aliases[_root(bound)] + _chain(bound)[len(_root(bound)):]
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    for n in _names_bound(t):
                        aliases.setdefault(n, module)
        return aliases

    def _written_files(self) -> list[str | None]:
        """Files the notebook writes: their names where constant, None where computed."""
        names = []
        for s in self.statements:
            for node in s.nodes:
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if callee == "open" and node.args:
                    mode = node.args[1] if len(node.args) > 1 else next(
                        (k.value for k in node.keywords if k.arg == "mode"), None)
                    if mode is not None and _folded(mode) in ("r", "rb", "rt", "br", "tr"):
                        continue
                    if mode is None and isinstance(func, ast.Name):
                        continue
                    names.append(_folded(node.args[0]))
                elif callee in ("write_text", "write_bytes", "touch", "symlink_to", "hardlink_to", "rename",
                                "replace") and isinstance(func, ast.Attribute):
                    receiver = func.value
                    names.append(_folded(receiver.args[0]) if isinstance(receiver, ast.Call) and receiver.args
                                 else _folded(node.args[0]) if callee in ("rename", "replace") and len(node.args) > 1
                                 else None)
                elif callee in ("tofile", "save", "savez", "savez_compressed", "savetxt", "from_file", "memmap",
                                "copy", "copyfile", "copy2", "copytree", "move", "link", "symlink", "mkdir",
                                "makedirs"):
                    target = node.args[1] if callee in ("copy", "copyfile", "copy2", "copytree", "move", "link",
                                                        "symlink", "save") and len(node.args) > 1 and \
                        callee != "save" else node.args[0] if node.args else None
                    if callee == "save" and len(node.args) > 1:
                        target = node.args[1] if isinstance(func, ast.Attribute) and _root(func) in \
                            {n for n, m in self.aliases.items() if m.startswith("torch")} else node.args[0]
                    names.append(_folded(target) if target is not None else None)
        return names

    def findings(self, s: _Statement) -> list[Finding]:
        if id(s) not in self._found:
            self._found[id(s)] = _findings([s.node], self.aliases) if _suspect(s.nodes) else []
        return self._found[id(s)]

    def _star_findings(self, s: _Statement, name: str) -> list[Finding]:
        top = s.star.split(".")[0]
        if top == "torch":
            return [Finding(msg("uses {name}", name=_builtin_name(name)), BUILT_IN)] if name in BANNED_ATTRIBUTES else []
        if top in MODEL_LIBRARIES:
            return [Finding(msg("uses {name}, a library of ready-made models ({code})", name=top,
                                code=f"from {s.star} import *"))]
        if s.star.startswith(".") or not installed(top):
            return [Finding(msg("imports {name}, which this environment does not install (code the check "
                                "cannot read)", name=s.star))]
        return []

    def reach(self, names, *, skip=(), after: dict | None = None, findings=None):
        """The first finding in the code that NAMES run: (statement, name, findings), or None.
        SKIP: names not followed (substituted by the reference); AFTER: name -> cell number before
        which its definitions are not read (a later definition replaces them); FINDINGS: statement ->
        findings, the from-scratch rule's by default."""
        own_rule, findings = findings is None, findings or self.findings
        queue, seen = collections.deque(names), set(skip)
        while queue:
            name = queue.popleft()
            if name in seen:
                continue
            seen.add(name)
            first = (after or {}).get(name, 0)
            for s in self.defs.get(name, []):
                if s.cell.number < first:
                    continue
                found = findings(s)
                if found:
                    return s, name, found
                queue.extend(s.uses - seen)
            for s in self.statements:
                if not own_rule:   # a star import is only a from-scratch question
                    break
                if s.star and s.cell.number >= first:
                    found = self._star_findings(s, name)
                    if found:
                        return s, name, found
        return None

    def _closure(self, names) -> set[str]:
        """NAMES and every global name their definitions use, transitively."""
        seen, queue = set(), list(names)
        while queue:
            name = queue.pop()
            if name not in seen:
                seen.add(name)
                queue += [u for s in self.defs.get(name, []) for u in s.uses - seen]
        return seen

    def value_reach(self, s: _Statement, value: list):
        """What the value a patch gives reaches: (statement, name, findings), or None."""
        found = _findings(value, self.aliases)
        if found:
            return s, None, found
        return self.reach(set().union(*(_global_uses(node) for node in value)))

    def tampering(self):
        """The first kind-3 finding in learner code: (cell, what), or None."""
        for cell, what in self.opaque:
            return cell, msg("runs code the check cannot read ({code})", code=what)
        in_bodies = []   # statements whose tampering is inside a function: only if that function runs
        for s in self.statements:
            if not any(f.tamper for f in self.findings(s)):
                continue
            found = [f for f in _findings([_definition_only(s.node)], self.aliases) if f.tamper]
            if found:
                return s.cell, found[0].text
            in_bodies.append(s)
        if in_bodies:
            # Functions that the learner's own top-level code runs (a call, any use); the tests'
            # calls of an exercise count for that exercise alone (``reach``).
            ran = set().union(*(_scoping(_definition_only(s.node))[0] for s in self.statements))
            reached = self._closure(ran)
            for s in in_bodies:
                if s.binds & reached:
                    return s.cell, next(f for f in self.findings(s) if f.tamper).text
        for s in self.statements:   # a module the notebook wrote itself, imported anywhere
            for node in s.nodes:
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or "."] if isinstance(node, ast.ImportFrom) and not node.level else []
                for module in modules:
                    top = module.split(".")[0]
                    if not installed(top) and any(w is None or os.path.basename(w.rstrip("/")) == top or
                                                  os.path.basename(w).startswith(top + ".") for w in self.written):
                        return s.cell, msg("imports {name}, which this environment does not install (code the "
                                           "check cannot read)", name=top)
        return None

    def patch(self):
        """The first kind-4 finding: (cell, what is changed, what its value reaches), or None."""
        for s, target, value in self.patches:
            reached = self.value_reach(s, value)
            if reached:
                return s.cell, target, _described(reached[2])
        return None


# ------------------------------------------------------------------ the verdicts

def substituted_dependencies(session) -> dict[str, set[str]]:
    """exercise -> the dependencies every one of its tests replaces by the reference."""
    out: dict[str, set[str]] = {}
    for test_id, probes in session.probes.items():
        exercise = session.chapter.exercise_of(test_id)
        deps = set.intersection(*(set(p.deps) for p in probes)) if probes else set()
        out[exercise] = out[exercise] & deps if exercise in out else deps
    return out


def static_builtin_use(nb, from_scratch, release, substituted=None, kernel_only=()) -> dict[str, str]:
    """From-scratch exercises whose code (answer and the learner code it uses) uses or reaches a
    built-in solver, or whose notebook tampers with the grader: exercise -> the reason (read, never run).

    release: the chapter's learner notebook as released (which cells are the course's);
    substituted: exercise -> names its tests replace by the reference (not followed); kernel_only:
    exercises that must also compute in @triton.jit kernels only (``static_kernel_only``)."""
    kernel_findings = static_kernel_only(nb, kernel_only, release, substituted)
    cells = learner_cells(nb, release)
    program = _Program(cells)
    answers = {c.answer: c.number for c in cells if c.answer}
    found = {}
    tampering, patch = program.tampering(), None
    if tampering is None:
        patch = program.patch()
    for name in sorted(from_scratch, key=lambda n: answers.get(n, 0)):
        if tampering is not None:
            cell, what = tampering
            found[name] = msg("`{name}` earns no marks: cell {cell} {what}; code there can change what any "
                              "exercise calls, and this exercise asks you to build it from scratch", name=name,
                              cell=cell.number, what=what)
            continue
        if patch is not None:
            cell, target, what = patch
            found[name] = msg("`{name}` earns no marks: cell {cell} changes {target} with code that {what}, "
                              "and this exercise asks you to build it from scratch", name=name, cell=cell.number,
                              target=target, what=what)
            continue
        reached = program.reach([name], skip=(substituted or {}).get(name, ()),
                                after={name: answers.get(name, 0)})
        if reached is None:
            continue
        s, helper, findings = reached
        what = _described(findings)
        if helper == name and s.cell.answer == name:
            found[name] = msg("`{name}` {what}: this exercise asks you to build it from scratch, so it earns "
                              "no marks", name=name, what=what)
        elif helper == name:
            found[name] = msg("`{name}` is defined again in cell {cell}, which {what}: this exercise asks you to "
                              "build it from scratch, so it earns no marks", name=name, cell=s.cell.number, what=what)
        else:
            found[name] = msg("`{name}` relies on `{helper}` (cell {cell}), which {what}: this exercise asks you "
                              "to build it from scratch, so it earns no marks", name=name, helper=helper,
                              cell=s.cell.number, what=what)
    return {**kernel_findings, **found}


# ------------------------------------------------------------------ kernel-only exercises (Chapter 10)

# Tensor computing a kernel-only wrapper must leave to its kernels (torch functions and tensor methods).
TENSOR_COMPUTING = {
    "softmax", "log_softmax", "exp", "exp2", "expm1", "log", "log2", "log1p", "logsumexp", "matmul", "mm", "bmm",
    "baddbmm", "addmm", "addbmm", "einsum", "tensordot", "dot", "mv", "outer", "inner", "sum", "nansum", "mean",
    "prod", "max", "amax", "min", "amin", "maximum", "minimum", "cumsum", "cumprod", "logcumsumexp", "where",
    "masked_fill", "masked_fill_", "scaled_dot_product_attention", "sigmoid", "tanh", "sqrt", "rsqrt", "pow",
    "div", "div_", "mul", "mul_", "add_", "sub", "sub_", "true_divide", "reciprocal", "norm",
    "topk", "argmax", "argmin", "tril", "triu", "gather", "index_select", "clamp", "neg", "square",
}
OPERATOR_DUNDERS = {f"__{op}__" for base in ("matmul", "mul", "add", "sub", "truediv", "floordiv", "pow", "neg")
                    for op in (base, "r" + base, "i" + base)}
NUMPY_MODULES = {"numpy"}
KERNEL_MODULES = {"triton", "tl"}   # what a kernel body may call (and the kernels it calls, followed as code)


def _is_kernel(node) -> bool:
    """A ``@triton.jit`` (or ``@jit``, ``@triton.jit(...)``) function."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if (isinstance(d, ast.Attribute) and d.attr == "jit") or (isinstance(d, ast.Name) and d.id == "jit"):
            return True
    return False


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _kernel_only_findings(statement_node, aliases) -> list[Finding]:
    """What one top-level statement computes outside kernels, or calls inside one, that a kernel-only
    exercise must not: torch or numpy tensor computing in wrappers, anything but triton in kernels."""
    torch_names = {n for n, m in aliases.items() if m.split(".")[0] == "torch"} | TORCH_MODULES
    numpy_names = {n for n, m in aliases.items() if m.split(".")[0] in NUMPY_MODULES}
    found: list[Finding] = []

    def add(text):
        if text not in [f.text for f in found]:
            found.append(Finding(text))

    def kernel_body(fn):
        for node in ast.walk(fn):
            root = _root(node.func) if isinstance(node, ast.Call) else None
            if root and (root in torch_names or root in numpy_names):
                add(msg("calls {code} inside the @triton.jit kernel `{kernel}`: a kernel may use only "
                        "triton.language (a torch call runs only under the interpreter)",
                        code=ast.unparse(node.func), kernel=fn.name))

    def wrapper(nodes):
        for node in nodes:
            if node is statement_node and isinstance(node, ast.Import):
                continue   # reached for the name it gives torch ("import torch, numpy"); np.* is flagged where used
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(n.split(".")[0] in NUMPY_MODULES for n in names):
                    add(msg("imports numpy in code that must leave its computing to kernels"))
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) or \
                    isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
                add(msg("multiplies matrices with @ outside a kernel ({code})", code=ast.unparse(node)[:60]))
            elif isinstance(node, ast.Attribute) and node.attr in OPERATOR_DUNDERS:
                add(msg("computes with {code} outside a kernel", code=ast.unparse(node)[:60]))
            elif isinstance(node, (ast.Attribute, ast.Call)) and _root(node) in numpy_names:
                add(msg("computes with numpy ({code}) outside a kernel",
                        code=ast.unparse(node.func if isinstance(node, ast.Call) else node)[:60]))
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else None
                if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2 and \
                        isinstance(node.args[1], ast.Constant) and node.args[1].value in TENSOR_COMPUTING:
                    name = node.args[1].value
                elif isinstance(f, ast.Attribute) and _root(f) in ({"math"} | KERNEL_MODULES):
                    name = None   # math.sqrt(d), triton.cdiv(N, block): numbers, not tensors
                if name in TENSOR_COMPUTING:
                    add(msg("computes {code} with torch outside a kernel: a kernel-only exercise computes in its "
                            "@triton.jit kernels, its wrapper only allocates and launches", code=ast.unparse(f)[:60]))

    def visit(node):
        if _is_kernel(node):
            kernel_body(node)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            wrapper(node.decorator_list)
            for inner in node.body:
                visit(inner)
            return
        wrapper(list(ast.walk(node)))

    visit(statement_node)
    return found


def static_kernel_only(nb, kernel_only, release, substituted=None) -> dict[str, str]:
    """Kernel-only exercises whose code (the wrapper, its kernels and the learner code they use) computes
    with torch or numpy outside kernels or calls anything but triton inside one: exercise -> the reason."""
    if not kernel_only:
        return {}
    cells = learner_cells(nb, release)
    program = _Program(cells)
    answers = {c.answer: c.number for c in cells if c.answer}
    cache: dict[int, list[Finding]] = {}

    def findings(s):
        if id(s) not in cache:
            cache[id(s)] = _kernel_only_findings(s.node, program.aliases)
        return cache[id(s)]

    found = {}
    for name in sorted(kernel_only, key=lambda n: answers.get(n, 0)):
        reached = program.reach([name], skip=(substituted or {}).get(name, ()),
                                after={name: answers.get(name, 0)}, findings=findings)
        if reached is None:
            continue
        s, helper, what = reached[0], reached[1], reached[2][0].text
        where = "" if helper == name else msg(" (through `{helper}`)", helper=helper)
        found[name] = msg("`{name}` earns no marks: cell {cell}{where} {what}", name=name, cell=s.cell.number,
                          where=where, what=what)
    return found
