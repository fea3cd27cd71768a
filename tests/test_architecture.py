"""The import floors of ARCHITECTURE.md, enforced: imports only run downward, and no module cycle.

Every ``import`` of the project's packages is read from source (function-local ones too, since
those are where a cycle hides), never executed.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("coursekit", "autograder", "coursegen", "solutions", "benchmarks", "tests", "examples")

# package -> the project's packages it may import (ARCHITECTURE.md); everything above these is free.
FLOORS = {
    "coursekit": set(),                       # ground floor: conventions, the chapter-source format, nbgrader
    "autograder": {"coursekit"},              # the grader
    "coursegen": {"coursekit"},               # the generator (reads the grader's messages as text only)
    "solutions": {"autograder"},              # generated: the authoring API of the hidden tests
}
# Copied into the sandboxed kernel, where nothing of the project exists: only each other, by file.
KERNEL_SIDE = {"autograder/sandboxed/probe.py", "autograder/sandboxed/wire.py", "autograder/sandboxed/guard.py",
               "autograder/sandboxed/standin.py"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module imported, line) for every import statement in the file, at any depth."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:   # from . import a, b: each is a module (or a name) of the package
                    found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
                else:
                    found.append((target, node.lineno))
            else:
                found.append((node.module, node.lineno))
    return found


def project_files() -> list[Path]:
    return sorted(p for pkg in FLOORS for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def _edges():
    modules = {module_name(p): p for p in project_files()}
    for path in project_files():
        for target, line in imports(path):
            if target.split(".")[0] in PROJECT:
                yield path, target, line, modules


def test_imports_only_run_downward():
    upward = []
    for path, target, line, _ in _edges():
        own, top = path.relative_to(ROOT).parts[0], target.split(".")[0]
        if top != own and top not in FLOORS[own]:
            upward.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({own} may import "
                          f"{', '.join(sorted(FLOORS[own])) or 'nothing of the project'})")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("rel", sorted(KERNEL_SIDE))
def test_kernel_side_modules_import_nothing_of_the_project(rel):
    """They run inside the sandbox as attn_probe / attn_wire / attn_standin / the startup guard."""
    path = ROOT / rel
    assert path.exists(), rel
    wrong = [f"{rel}:{line} imports {t}" for t, line in imports(path)
             if t.split(".")[0] in PROJECT and t not in {"autograder.sandboxed.wire", "autograder.sandboxed.standin"}]
    assert not wrong, wrong


# Inside the grader: a part may import only these of the project (besides coursekit and itself).
PARTS = {
    "autograder.sandboxed": set(),                                        # copied into the kernel
    "autograder.judge": {"autograder.messages", "autograder.sandboxed"},  # never the authoring API
    # a class run uses one submission's grading whole, its pages and chapters, and removes the
    # scratch folders of a worker it killed; its reports escape what they show as the pages do
    "autograder.classroom": {"autograder.grading", "autograder.submission", "autograder.feedback",
                             "autograder.chapters", "autograder.sandbox", "autograder.scratch",
                             "autograder.html_safety"},
}
# Only the command line reaches up into a class run: one submission's grading knows nothing of classes.
CLASS_USERS = {"autograder/__main__.py"}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_the_grader_s_parts_import_only_below_them(part):
    folder = ROOT / Path(*part.split("."))
    wrong = []
    for path in sorted(folder.rglob("*.py")):
        for target, line in imports(path):
            if target.startswith("autograder") and not any(target == p or target.startswith(p + ".")
                                                           for p in {part, *PARTS[part]}):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_only_the_command_line_imports_the_class_package():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {target}"
             for path in sorted((ROOT / "autograder").rglob("*.py"))
             if not path.relative_to(ROOT).as_posix().startswith("autograder/classroom/")
             and path.relative_to(ROOT).as_posix() not in CLASS_USERS
             for target, line in imports(path)
             if target == "autograder.classroom" or target.startswith("autograder.classroom.")]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_modules():
    """Inside a package too: module A importing B (at any depth) while B imports A is a knot."""
    modules = {module_name(p) for p in project_files()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path, target, _, _ in _edges():
        while target and target not in modules:   # a name imported from a module: that module
            target = target.rpartition(".")[0]
        src = module_name(path)
        if target and target != src:
            graph[src].add(target)
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(cycles)
