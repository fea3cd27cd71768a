"""Read the answer cells of from-scratch exercises, never run them: do they use a built-in solver?"""
from __future__ import annotations

import ast

from . import hidden as H

BANNED_ATTRIBUTES = set(H.ATTENTION_BUILTINS) | H.BUILTIN_MODULES | {"_scaled_dot_product_efficient_attention", "aten"}


def static_builtin_use(nb, from_scratch) -> dict[str, str]:
    """Answer cells of from-scratch exercises that name a built-in solver (read, never run)."""
    found = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {}) if cell.cell_type == "code" else {}
        name = meta.get("grade_id")
        if not meta.get("solution") or name not in from_scratch:
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            hit = None
            if isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRIBUTES:
                hit = node.attr
            elif isinstance(node, ast.ImportFrom):
                hit = next((a.name for a in node.names if a.name in BANNED_ATTRIBUTES), None)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in BANNED_ATTRIBUTES:
                hit = node.value
            if hit:
                what = H.ATTENTION_BUILTINS.get(hit, f"nn.{hit}" if hit in H.BUILTIN_MODULES else f"torch.ops.{hit}")
                found[name] = (f"`{name}` uses {what}: this exercise asks you to build it from "
                               "scratch, so it earns no marks")
                break
    return found
