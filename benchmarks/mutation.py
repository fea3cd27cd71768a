"""Mutation testing of the hidden tests: do they catch small changes to the reference?

    .venv/bin/python benchmarks/mutation.py [--chapters 02 04] [--max-per-chapter N] [--seed 0]
                                            [--workers 2] [--verbose]

For each chapter, every exercise function (and the learner-written methods of every
exercise class, not the given ``__init__``) of the reference module
``solutions/chNN_*.py`` is mutated one site at a time by an AST mutator of our own:
operator swaps (+ - * / @ **), comparison flips, constants (0/1, -1/-2 dims, True/False,
"-inf"), unary operators dropped, operands and call arguments swapped, list/tuple items
swapped, method calls dropped (``x.transpose(..)`` -> ``x``), ``if`` conditions forced,
and statements removed (a mask line, a scale line). In Chapter 10 the learner writes
``@triton.jit`` kernels (and an autograd Function) in an exercise's cell beside the wrapper the
probes call: every top-level def of an exercise cell is mutated, the kernels too.

Each mutant is loaded as a module (from source text that ``linecache`` holds, so that
``triton.jit`` can read a mutated kernel back and re-jit it), with every def that calls the
mutated one defined again beside it (a kernel's wrapper, a wrapper's autograd Function), and
the hidden probes of the exercises it changes are run IN
PROCESS by the kernel's own routine (``autograder/sandboxed/probe.py``'s ``call_one``,
through ``autograder.inprocess``: the probe encoded and its result decoded in the wire
format, dependencies replaced by the reference), and the result dict is judged by
``autograder.judge.verdict.judge_probe`` against the ORIGINAL reference. A mutant is killed
when any probe reports a problem. A Triton kernel reads memory through pointers, and a
mutated offset or mask can crash the process: in a chapter of kernels each mutant runs in a
forked child, and a child that dies (or runs past ``CHILD_SECONDS``) is a kill, as a dead
kernel loses its tests in grading. Under Triton's interpreter a tile iteration costs about
5 ms: sample Chapter 10 (``--max-per-chapter``).

Why not mutmut or cosmic-ray: they mutate files on disk and decide "killed" from a
test command's exit status, one process (or more) per mutant. Here the "tests" are
hidden probes judged by an in-process function against an unmutated reference held in
the same process, and the reference module must stay intact for the judge while the
mutant is loaded beside it; a file-and-subprocess driver cannot express that, and would
spend minutes per mutant going through nbgrader.

Survivors are classified: ``equivalent`` when the mutant also agrees with the reference
(to float64 rounding) on inputs re-drawn at random around every probe, including
nearby integer arguments; ``unspecified`` when KNOWN_SURVIVORS explains that it only
changes behaviour the spec does not grade; otherwise ``real gap`` (a mutant that the
re-drawn inputs tell apart from the reference, but no hidden probe does). The kill rate
is killed / (mutants - equivalent - unspecified).

Importable: ``run_chapter("02_self_attention", limit=15)`` returns a ``ChapterReport``.
"""
from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import importlib
import itertools
import linecache
import os
import pickle
import random
import select
import signal
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autograder import hidden as H  # noqa: E402
from autograder import inprocess  # noqa: E402
from autograder.judge.verdict import judge_probe  # noqa: E402
from autograder.sandboxed.wire import ModuleState  # noqa: E402

from coursekit.conventions import COURSE_DIR, chapter_names  # noqa: E402
from coursekit.source import parse_chapter  # noqa: E402

CHAPTERS = chapter_names()
GIVEN_METHODS = {"__init__"}  # given complete in the stubs: not answer code

# Survivors that only change what the spec leaves ungraded: (exercise, mutation) -> why.
KNOWN_SURVIVORS: dict[tuple[str, str], str] = {
    ("flash_attention_backward", "flash_attention_backward: `block_m` -> `o.shape[-1]` in "
                                 "`flash_backward_dkdv_kernel[triton.cdiv(N, block_n), B * H](q, k, v,...` (line 18)"):
        "the query tile the dK/dV kernel loops over is a tuning choice: every tiling gives the same gradients "
        "(it passes every probe); only re-drawn o and lse, no longer those of q and k, make exp(s - lse) large "
        "enough for the order of the sums to show",
}


# ----------------------------------------------------------------------------- mutator

@dataclasses.dataclass
class Mutant:
    exercise: str
    description: str
    tree: ast.AST        # the mutated top-level def
    lineno: int

    @property
    def key(self):
        return (self.exercise, self.description)


def _src(node) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 70 else text[:67] + "..."


_BINOP_SWAPS = {ast.Add: [ast.Sub], ast.Sub: [ast.Add], ast.Mult: [ast.Div], ast.Div: [ast.Mult, ast.FloorDiv],
                ast.MatMult: [ast.Mult], ast.Pow: [ast.Mult], ast.FloorDiv: [ast.Div], ast.Mod: [ast.FloorDiv],
                ast.BitAnd: [ast.BitOr], ast.BitOr: [ast.BitAnd]}
_NONCOMMUTATIVE = (ast.Sub, ast.Div, ast.MatMult, ast.Pow, ast.FloorDiv)
_CMP_SWAPS = {ast.Lt: [ast.LtE, ast.Gt], ast.LtE: [ast.Lt], ast.Gt: [ast.GtE, ast.Lt], ast.GtE: [ast.Gt],
              ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq], ast.Is: [ast.IsNot], ast.IsNot: [ast.Is]}


# Names that are easily confused with one another (attribute accesses only).
_ATTR_GROUPS = [("tril", "triu"), ("sin", "cos"), ("W_q", "W_k", "W_v", "W_o"), ("W_a", "U_a"),
                ("min", "max"), ("sum", "mean"), ("amax", "amin"), ("float32", "float64"),
                ("embedding", "out"), ("ne", "eq"), ("lt", "le"), ("gt", "ge"),
                ("exp", "exp2"), ("log", "log2"), ("maximum", "minimum")]
_ATTR_SWAPS = {a: [b for b in group if b != a] for group in _ATTR_GROUPS for a in group}


def _int_variants(v):
    return {0: [1], 1: [0, 2], 2: [1, 3], -1: [-2, 0], -2: [-1]}.get(v, [v + 1, v - 1])


def _sites(node):
    """(description, replacement builder) pairs for one AST node; builders return a new node or None (delete)."""
    out = []
    if isinstance(node, ast.BinOp):
        for new in _BINOP_SWAPS.get(type(node.op), []):
            def make(n=node, new=new):
                m = copy.deepcopy(n)
                m.op = new()
                return m
            out.append(make)
        if isinstance(node.op, _NONCOMMUTATIVE):
            out.append(lambda n=node: ast.BinOp(left=copy.deepcopy(n.right), op=copy.deepcopy(n.op),
                                                right=copy.deepcopy(n.left)))
        # drop one operand of a scale: x / s -> x, x * s -> x
        if isinstance(node.op, (ast.Div, ast.Mult)):
            out.append(lambda n=node: copy.deepcopy(n.left))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1:
        for new in _CMP_SWAPS.get(type(node.ops[0]), []):
            def make(n=node, new=new):
                m = copy.deepcopy(n)
                m.ops = [new()]
                return m
            out.append(make)
    elif isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
            v = -node.operand.value
            for new in (_int_variants(v) if isinstance(v, int) else [-v]):
                out.append(lambda new=new: ast.parse(repr(new), mode="eval").body)
        else:
            out.append(lambda n=node: copy.deepcopy(n.operand))        # drop ~, -, not
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool):
            out.append(lambda v=v: ast.Constant(not v))
        elif isinstance(v, int):
            for new in _int_variants(v):
                out.append(lambda new=new: ast.parse(repr(new), mode="eval").body)
        elif isinstance(v, float):
            for new in ([1.0] if v == 0 else [0.0] if v == 1 else [v * 2]):
                out.append(lambda new=new: ast.Constant(new))
        elif isinstance(v, str) and v in ("-inf", "inf"):
            out.append(lambda v=v: ast.Constant("inf" if v == "-inf" else "-inf"))
    elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        for new in _ATTR_SWAPS.get(node.attr, []):
            def make(n=node, new=new):
                m = copy.deepcopy(n)
                m.attr = new
                return m
            out.append(make)
    elif isinstance(node, ast.Call):
        for i, kw in enumerate(node.keywords):      # drop a keyword argument (dim=, dtype=, device=, ...)
            if kw.arg is not None:
                def make(n=node, i=i):
                    m = copy.deepcopy(n)
                    del m.keywords[i]
                    return m
                out.append(make)
        if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            def make(n=node):
                m = copy.deepcopy(n)
                m.args[0], m.args[1] = m.args[1], m.args[0]
                return m
            out.append(make)
        if isinstance(node.func, ast.Attribute) and not isinstance(node.func.value, ast.Name):
            out.append(lambda n=node: copy.deepcopy(n.func.value))    # x.f(...).g(...) -> x.f(...)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id not in ("torch", "F", "nn", "math", "self", "super"):
            out.append(lambda n=node: copy.deepcopy(n.func.value))    # x.f(...) -> x
        if node.args and not isinstance(node.args[0], ast.Starred) and (
                isinstance(node.func, ast.Name) and node.func.id not in ("range", "len", "super", "float", "int")
                or isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id in ("torch", "F", "math")):
            out.append(lambda n=node: copy.deepcopy(n.args[0]))       # f(x, ...) -> x
    elif isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= 2 and isinstance(node.ctx, ast.Load):
        def make(n=node):
            m = copy.deepcopy(n)
            m.elts[0], m.elts[1] = m.elts[1], m.elts[0]
            return m
        out.append(make)
    elif isinstance(node, ast.If):
        out.append(lambda n=node: ast.If(test=ast.Constant(True), body=n.body, orelse=n.orelse))
        out.append(lambda n=node: ast.If(test=ast.Constant(False), body=n.body, orelse=n.orelse))
    return out


def _statement_removals(fn):
    """Remove one statement of a function body (or of a nested block): the body keeps a ``pass``."""
    out = []
    for parent in ast.walk(fn):
        for field in ("body", "orelse"):
            block = getattr(parent, field, None)
            if not isinstance(block, list) or parent is fn and field == "body" and isinstance(fn, ast.ClassDef):
                continue
            for i, stmt in enumerate(block):
                if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.If, ast.For)) \
                        and not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                    out.append((parent, field, i, stmt))
    return out


def _defaults_for_params(fn):
    """A use of a parameter replaced by the parameter's default: the argument is ignored there."""
    args = fn.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(fn.args.defaults):]], fn.args.defaults))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    return [(n, defaults[n.id]) for n in ast.walk(fn)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in defaults]


def _sizes_from_other_args(fn, kinds):
    """An integer parameter replaced by a size read off a tensor argument: the parameter is
    ignored and the size taken from the data (``max_len`` -> ``int(lengths.max())``).
    ``kinds`` maps parameter names to "int", "float tensor" or "int tensor" (from the probes)."""
    ints = [p for p, k in kinds.items() if k == "int"]
    tensors = [(p, k) for p, k in kinds.items() if k.endswith("tensor")]
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in ints:
            for q, kind in tensors:
                exprs = [f"{q}.shape[-1]", f"{q}.shape[-2]"] + ([f"int({q}.max())"] if kind == "int tensor" else [])
                out += [(node, ast.parse(e, mode="eval").body) for e in exprs]
    return out


def _argument_kinds(probes, reference):
    """exercise -> {parameter: "int" | "float tensor" | "int tensor"} as the probes pass them."""
    import inspect
    kinds = {}
    for probe in probes:
        if probe.init is not None:
            continue
        try:
            bound = inspect.signature(getattr(reference, probe.target)).bind(*probe.args, **probe.kwargs)
        except TypeError:
            continue
        for name, value in bound.arguments.items():
            kind = ("int" if isinstance(value, int) and not isinstance(value, bool) else
                    "float tensor" if isinstance(value, torch.Tensor) and value.is_floating_point() else
                    "int tensor" if isinstance(value, torch.Tensor) and value.dtype != torch.bool else None)
            if kind:
                kinds.setdefault(probe.target, {})[name] = kind
    return kinds


def _name_swaps(fn, per_use=4):
    """Read of a local (parameter or assigned variable) replaced by another local: q <-> k, x <-> y."""
    params = [a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg != "self"]
    assigned = [n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    local = list(dict.fromkeys(params + assigned))
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in local:
            others = [o for o in local if o != node.id]
            # the nearest names in order of definition: the likely confusions
            i = local.index(node.id)
            others.sort(key=lambda o: abs(local.index(o) - i))
            out += [(node, o) for o in others[:per_use]]
    return out


def mutants_of(tree: ast.Module, exercises, kinds=None) -> list[Mutant]:
    """Every single-site mutant of the exercises' answer code (``kinds``: see _argument_kinds)."""
    kinds = kinds or {}
    found = []
    for index, top in enumerate(tree.body):
        if not isinstance(top, (ast.FunctionDef, ast.ClassDef)) or top.name not in exercises:
            continue
        bodies = [top] if isinstance(top, ast.FunctionDef) else [
            f for f in top.body if isinstance(f, ast.FunctionDef) and f.name not in GIVEN_METHODS]
        for fn in bodies:
            where = f"{top.name}.{fn.name}" if fn is not top else top.name
            parents = {id(c): p for p in ast.walk(fn) for c in ast.iter_child_nodes(p)}

            def context(node):
                """` in `<enclosing call or expression>`` for short nodes, so that descriptions read."""
                if len(_src(node)) > 15:
                    return ""
                up = parents.get(id(node))
                while up is not None and not isinstance(up, (ast.Call, ast.BinOp, ast.Compare, ast.Subscript)) \
                        and not isinstance(up, ast.stmt):
                    up = parents.get(id(up))
                return f" in `{_src(up).splitlines()[0]}`" if up is not None and not isinstance(up, ast.stmt) else ""
            nodes = [n for stmt in fn.body for n in ast.walk(stmt)]
            nodes = [n for n in nodes if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            for node in nodes:
                if isinstance(node, ast.Constant) and isinstance(parents.get(id(node)), ast.UnaryOp):
                    continue   # -1 is mutated as a whole (to -2, 0)
                for make in _sites(node):
                    replacement = make()
                    if replacement is None:
                        continue
                    line = getattr(node, "lineno", fn.lineno) - fn.lineno
                    desc = f"{where}: `{_src(node)}` -> `{_src(replacement)}`{context(node)} (line {line})"
                    new_top = _replace(top, node, replacement)
                    if new_top is not None:
                        found.append(Mutant(top.name, desc, new_top, getattr(node, "lineno", 0)))
            for node, default in _defaults_for_params(fn):
                desc = f"{where}: `{node.id}` -> its default `{_src(default)}`{context(node)} (line {node.lineno - fn.lineno})"
                new_top = _replace(top, node, copy.deepcopy(default))
                if new_top is not None:
                    found.append(Mutant(top.name, desc, new_top, node.lineno))
            for node, derived in _sizes_from_other_args(fn, kinds.get(top.name, {})):
                desc = f"{where}: `{node.id}` -> `{_src(derived)}`{context(node)} (line {node.lineno - fn.lineno})"
                new_top = _replace(top, node, derived)
                if new_top is not None:
                    found.append(Mutant(top.name, desc, new_top, node.lineno))
            for node, other in _name_swaps(fn):
                replacement = ast.Name(id=other, ctx=ast.Load())
                desc = f"{where}: `{node.id}` -> `{other}`{context(node)} (line {node.lineno - fn.lineno})"
                new_top = _replace(top, node, replacement)
                if new_top is not None:
                    found.append(Mutant(top.name, desc, new_top, node.lineno))
            for parent, field, i, stmt in _statement_removals(fn):
                desc = f"{where}: remove `{_src(stmt).splitlines()[0]}` (line {stmt.lineno - fn.lineno})"
                new_top = _remove(top, parent, field, i)
                found.append(Mutant(top.name, desc, new_top, stmt.lineno))
    originals = {t.name: ast.dump(t) for t in tree.body if isinstance(t, (ast.FunctionDef, ast.ClassDef))}
    unique, seen = [], set()
    for m in found:
        dump = ast.dump(m.tree)
        if m.key in seen or dump in seen or dump == originals[m.exercise]:
            continue   # the same mutant twice, or no change at all
        seen.update((m.key, dump))
        unique.append(m)
    return unique


def _replace(top, target, replacement):
    """A copy of ``top`` with the node ``target`` (by identity) replaced."""
    class Swap(ast.NodeTransformer):
        done = False

        def generic_visit(self, node):
            if node is target:
                self.done = True
                return replacement
            return super().generic_visit(node)
    # Deep-copy after marking: map the original node to its copy through a parallel walk.
    mapping = {}
    clone = copy.deepcopy(top, mapping)
    target_copy = mapping.get(id(target))
    if target_copy is None:
        return None
    target = target_copy
    swapper = Swap()
    new = swapper.visit(clone)
    ast.fix_missing_locations(new)
    return new if swapper.done else None


def _remove(top, parent, field, i):
    mapping = {}
    clone = copy.deepcopy(top, mapping)
    block = getattr(mapping[id(parent)], field)
    del block[i]
    if not block:
        block.append(ast.Pass())
    ast.fix_missing_locations(clone)
    return clone


# ------------------------------------------------------------------ running probes in process

def run_probe(chapter: "Chapter", probe: H.Probe, ns: dict) -> dict:
    """Run one probe against the namespace ``ns`` with the kernel's own routine (``autograder.inprocess``:
    ``attn_probe.call_one``, the wire format both ways); every dependency's reference stands in."""
    return inprocess.run_probe(probe, ns, chapter.hidden)


@dataclasses.dataclass
class Chapter:
    name: str
    reference: types.ModuleType
    hidden: H.HiddenTests
    probes: dict            # test id -> [Probe]
    tree: ast.Module
    exercises: list         # what the probes call
    answers: list = dataclasses.field(default_factory=list)   # every def the learner writes: exercises, their kernels
    users: dict = dataclasses.field(default_factory=dict)     # top-level name -> the top-level defs that name it

    @property
    def raw_memory(self) -> bool:
        """Its kernels read memory through pointers (Triton): a mutated offset can crash the process."""
        return "triton" in vars(self.reference)

    def affected(self, name) -> set:
        """NAME and every top-level def that calls it, directly or through others: what a mutant of NAME changes."""
        found, todo = {name}, [name]
        while todo:
            for user in self.users.get(todo.pop(), ()):
                if user not in found:
                    found.add(user)
                    todo.append(user)
        return found


def _answer_defs(name) -> set:
    """Top-level defs of the chapter's exercise cells: the exercise and, in Chapter 10, its ``@triton.jit``
    kernels and its autograd Function (the learner writes them in the exercise's cell; the probes call
    only the wrapper)."""
    found = set()
    for cell in parse_chapter(COURSE_DIR / f"{name}.py").of_kind("exercise"):
        found |= {n.name for n in ast.parse(cell.source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return found


def _users(tree: ast.Module) -> dict:
    defs = [top for top in tree.body if isinstance(top, (ast.FunctionDef, ast.ClassDef))]
    users = {}
    for top in defs:
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id != top.name:
                users.setdefault(node.id, set()).add(top.name)
    return users


def load_chapter(name) -> Chapter:
    module = "ch" + name
    reference = importlib.import_module(f"solutions.{module}")
    hidden = importlib.import_module(f"solutions.{module}_hidden").hidden
    probes = {t: hidden.build(t) for t in hidden.builders}
    exercises = sorted({p.target for ps in probes.values() for p in ps})
    tree = ast.parse(Path(reference.__file__).read_text())
    defined = {top.name for top in tree.body if isinstance(top, (ast.FunctionDef, ast.ClassDef))}
    answers = sorted(set(exercises) | (_answer_defs(name) & defined))
    return Chapter(name, reference, hidden, probes, tree, exercises, answers, _users(tree))


_compiled = itertools.count()


def _exec_source(defs, label, ns) -> None:
    """Run top-level DEFS into NS from source text that ``inspect`` can read back (``linecache``):
    ``triton.jit`` reads a kernel's source, and its interpreter rewrites it from there."""
    source = "\n\n".join(ast.unparse(d) for d in defs) + "\n"
    filename = f"<mutant {next(_compiled)}: {label}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), ns)


def mutant_namespace(chapter: Chapter, mutant: Mutant | None) -> dict:
    """The reference module's namespace with one def replaced by the mutant, and every def that calls
    it (a wrapper of a mutated kernel, the autograd Function of a mutated wrapper) defined again there
    so that it calls the mutant."""
    mod = types.ModuleType(f"mutant_{chapter.name}")
    mod.__dict__.update({k: v for k, v in vars(chapter.reference).items() if not k.startswith("__")})
    if mutant is not None:
        callers = chapter.affected(mutant.exercise) - {mutant.exercise}
        again = [top for top in chapter.tree.body
                 if isinstance(top, (ast.FunctionDef, ast.ClassDef)) and top.name in callers]
        _exec_source([mutant.tree, *again], mutant.description, mod.__dict__)
    return mod.__dict__


def first_problem(chapter: Chapter, ns: dict, targets=None) -> str | None:
    """The first problem the hidden tests report for this namespace, or None (survived).
    targets: only the probes of these exercises (those a mutant can change); default all."""
    for test_id, probes in chapter.probes.items():
        for probe in probes:
            if targets is not None and probe.target not in targets:
                continue
            got = run_probe(chapter, probe, ns)
            try:
                problems = judge_probe(probe, got, chapter.hidden.from_scratch)
            except Exception as err:  # noqa: BLE001 - a result the judge cannot even read is a kill
                problems = [f"judge raised {type(err).__name__}: {err}"]
            if problems:
                return f"{test_id}: {problems[0]}"
    return None


# ------------------------------------------------------------------ equivalence heuristic

def _redraw(value, gen, keep_integers=False):
    """VALUE drawn again at random; integer tensors kept when KEEP_INTEGERS (a kernel's indices: block
    tables, lengths: a kernel reads memory at them, and a redrawn index out of range crashes it)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        scale = float(value.detach().double().std()) if value.numel() > 1 else 1.0
        return (torch.randn(value.shape, generator=gen, dtype=torch.float64) * (scale or 1.0)).to(value.dtype)
    if isinstance(value, torch.Tensor) and value.dtype == torch.bool and value.dim() >= 1:
        new = torch.rand(value.shape, generator=gen) < 0.6
        new[..., 0] = True
        return new
    if isinstance(value, torch.Tensor) and value.dtype == torch.long and value.numel() and not keep_integers:
        hi = int(value.max()) + 2
        return torch.randint(0, hi, value.shape, generator=gen)
    return value


def _variants(probe, gen, draws=3, keep_integers=False):
    """Probes around ``probe``: inputs re-drawn at random, and integer arguments moved by +-1/+2."""
    out = []
    for _ in range(draws):
        out.append(dataclasses.replace(probe, args=tuple(_redraw(a, gen, keep_integers) for a in probe.args),
                                       kwargs={k: _redraw(v, gen, keep_integers) for k, v in probe.kwargs.items()}))
    for i, a in enumerate(probe.args):
        if isinstance(a, int) and not isinstance(a, bool):
            for delta in (1, 2, 3):
                args = list(probe.args)
                args[i] = a + delta
                out.append(dataclasses.replace(probe, args=tuple(args)))
    return out


def _outputs(chapter, probe, ns):
    got = run_probe(chapter, dataclasses.replace(probe, cotangents=()), ns)
    return got.get("value") if got["status"] == "ok" else got.get("error", got["status"])


def _same(a, b, loose=False) -> bool:
    """Equal up to rounding (``loose``: up to the judge's tolerance, which is float32-level)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y, loose) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not a.is_floating_point():
            return torch.equal(a, b)
        if loose:
            return H.close(a, b)
        return bool(torch.allclose(a.double(), b.double(), atol=1e-6 if a.dtype != torch.float64 else 1e-12,
                                   rtol=1e-5 if a.dtype != torch.float64 else 1e-10, equal_nan=True))
    if isinstance(a, ModuleState) and isinstance(b, ModuleState):   # a returned model: by its state
        return set(a.state) == set(b.state) and all(_same(a.state[k], b.state[k], loose) for k in a.state)
    if isinstance(a, str) and isinstance(b, str):
        return a.split(":")[0] == b.split(":")[0]        # both raised the same kind of error
    return False


def classify_survivor(chapter: Chapter, mutant: Mutant, ns: dict, seed=0) -> tuple[str, str]:
    if mutant.key in KNOWN_SURVIVORS:
        return "unspecified", KNOWN_SURVIVORS[mutant.key]
    gen = torch.Generator().manual_seed(seed)
    ref_ns = mutant_namespace(chapter, None)
    targets = chapter.affected(mutant.exercise)
    checked, precision_only = 0, None
    for probes in chapter.probes.values():
        for probe in probes:
            if probe.target not in targets:
                continue
            for variant in _variants(probe, gen, keep_integers=chapter.raw_memory):
                want = _outputs(chapter, variant, ref_ns)
                if isinstance(want, str):
                    continue   # the reference itself rejects this variant
                checked += 1
                have = _outputs(chapter, variant, ns)
                if not _same(have, want, loose=True):
                    return "real gap", f"differs from the reference on re-drawn inputs near '{variant.label}'"
                if precision_only is None and not _same(have, want):
                    precision_only = variant.label
    if precision_only is not None:
        return "equivalent", (f"precision only: agrees to float32 precision (accepted, see hidden.tolerance) on "
                              f"every probe and {checked} re-drawn variants, not to float64 rounding "
                              f"(near '{precision_only}')")
    return "equivalent", f"agrees with the reference on every probe and {checked} re-drawn variants"


# ------------------------------------------------------------------ driver

@dataclasses.dataclass
class ChapterReport:
    chapter: str
    mutants: int
    killed: list
    survivors: list          # (mutant description, class, explanation)
    seconds: float

    @property
    def equivalent(self):
        return [s for s in self.survivors if s[1] in ("equivalent", "unspecified")]

    @property
    def gaps(self):
        return [s for s in self.survivors if s[1] == "real gap"]

    @property
    def kill_rate(self):
        relevant = self.mutants - len(self.equivalent)
        return len(self.killed) / relevant if relevant else 1.0


# A mutant of a raw-memory chapter runs in a child process: past this, it is stopped (each probe has its
# own time limit as in grading; this catches the rest).
CHILD_SECONDS = 600


def judged(chapter: Chapter, mutant: Mutant, seed=0) -> tuple:
    """("killed", why) or ("survived", class, explanation) of one mutant."""
    try:
        ns = mutant_namespace(chapter, mutant)
    except Exception as err:  # noqa: BLE001 - does not even compile: trivially killed
        return "killed", f"does not load: {err}"
    problem = first_problem(chapter, ns, chapter.affected(mutant.exercise))
    if problem:
        return "killed", problem
    return ("survived", *classify_survivor(chapter, mutant, ns, seed))


def in_child(fn, seconds=CHILD_SECONDS):
    """FN() in a forked child, its result pickled back; ("killed", why) if the child dies or runs past
    SECONDS, as a dead or stopped kernel loses its tests when grading."""
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        try:
            payload = pickle.dumps(fn())
        except BaseException as err:  # noqa: BLE001 - said to the parent, as a kill
            payload = pickle.dumps(("killed", f"the mutation run raised {type(err).__name__}: {err}"))
        with os.fdopen(write, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write)
    chunks, deadline = [], time.monotonic() + seconds
    with os.fdopen(read, "rb") as pipe:
        while True:
            ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "killed", f"ran past {seconds} s (stopped)"
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "killed", f"the process died ({signal.Signals(os.WTERMSIG(status)).name})"
    return pickle.loads(b"".join(chunks))


def run_chapter(name, limit=None, seed=0, only=None, verbose=False) -> ChapterReport:
    """Mutate, run and judge one chapter. ``limit`` samples that many mutants (deterministic seed);
    ``only`` keeps mutants whose description contains one of the given strings. In a chapter of
    Triton kernels, the kernels are mutated too (each is re-jitted from its mutated source) and
    every mutant runs in a child process (``in_child``)."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    chapter = load_chapter(name)
    kinds = _argument_kinds([p for ps in chapter.probes.values() for p in ps], chapter.reference)
    mutants = mutants_of(chapter.tree, set(chapter.answers), kinds)
    if only:
        mutants = [m for m in mutants if any(s in m.description for s in only)]
    if limit is not None and len(mutants) > limit:
        mutants = sorted(random.Random(seed).sample(mutants, limit), key=lambda m: (m.exercise, m.lineno))
    killed, survivors = [], []
    for mutant in mutants:
        if chapter.raw_memory:
            outcome = in_child(lambda mutant=mutant: judged(chapter, mutant, seed))
        else:
            outcome = judged(chapter, mutant, seed)
        if outcome[0] == "killed":
            killed.append((mutant.description, outcome[1]))
            if verbose:
                print(f"  killed   {mutant.description}\n           by {outcome[1][:150]}")
        else:
            survivors.append((mutant.description, *outcome[1:]))
            if verbose:
                print(f"  SURVIVED {mutant.description} [{outcome[1]}] {outcome[2]}")
    return ChapterReport(name, len(mutants), killed, survivors, time.perf_counter() - started)


def _run(args):
    name, limit, seed, verbose = args
    return run_chapter(name, limit=limit, seed=seed, verbose=verbose)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chapters", nargs="*", default=None, help="chapter numbers or names (default: all)")
    parser.add_argument("--max-per-chapter", type=int, default=None, help="sample this many mutants per chapter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--min-kill-rate", type=float, default=None, help="exit 1 if a chapter is below")
    opts = parser.parse_args(argv)
    names = [c for c in CHAPTERS if not opts.chapters or any(c.startswith(x) or c == x for x in opts.chapters)]
    jobs = [(n, opts.max_per_chapter, opts.seed, opts.verbose) for n in names]
    started = time.perf_counter()
    if opts.workers > 1 and len(jobs) > 1:
        import multiprocessing
        with multiprocessing.get_context("spawn").Pool(min(opts.workers, len(jobs))) as pool:
            reports = pool.map(_run, jobs, chunksize=1)
    else:
        reports = [_run(j) for j in jobs]
    print(f"{'chapter':28} {'mutants':>7} {'killed':>6} {'by error':>8} {'survived':>8} {'equiv.':>6} {'gaps':>4} "
          f"{'kill rate':>9} {'time':>6}")
    for r in reports:
        by_error = sum(1 for _, why in r.killed if " raised " in why or "does not load" in why)
        print(f"{r.chapter:28} {r.mutants:7d} {len(r.killed):6d} {by_error:8d} {len(r.survivors):8d} "
              f"{len(r.equivalent):6d} {len(r.gaps):4d} {r.kill_rate:9.1%} {r.seconds:5.0f}s")
    print(f"(kill rate = killed / (mutants - equivalent - unspecified); 'by error': killed because the mutant "
          f"raised; total {time.perf_counter() - started:.0f} s)")
    for r in reports:
        if r.survivors:
            print(f"\nSurvivors in {r.chapter}:")
            for desc, kind, why in r.survivors:
                print(f"  [{kind}] {desc}\n      {why}")
    if opts.min_kill_rate is not None and any(r.kill_rate < opts.min_kill_rate for r in reports):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
