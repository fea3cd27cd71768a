"""Run Chapter 10's decoding sections (drafts/ch10/decoding.py) as a script, cell by cell, and time them.

The cells run after the chapter's fixed export cell and its given imports (time, matplotlib,
glue with a print fallback), as they will in course/10_attention_kernels.py, with the
reference solutions in place. Figures go to the Agg backend and are not shown.

    nice .venv/bin/python drafts/ch10/run_decoding.py [--quiet] [--figures DIR]

With --figures, each figure a cell shows is saved as DIR/figure_N.png.
"""
from __future__ import annotations

import pathlib
import re
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent

EXPORT_CELL = '''
import math
import os

import torch

if not torch.cuda.is_available():  # no GPU: Triton's interpreter runs the kernels on the CPU, with numpy
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton
import triton.language as tl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
'''

GIVEN_IMPORTS = '''
import time

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

GLUED = {}


def glue(name, value, display=True):
    GLUED[name] = value
    if display:
        print(f"{name} = {value}")
'''


def cells(source: str) -> list[tuple[str, str]]:
    """(header, body) of each percent-format cell."""
    parts = re.split(r"^(# %%.*)$", source, flags=re.M)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts), 2)]


def main(quiet: bool = False, figures: pathlib.Path | None = None) -> int:
    namespace: dict = {"__name__": "__decoding__"}
    started = time.perf_counter()
    exec(compile(EXPORT_CELL, "<export>", "exec"), namespace)
    exec(compile(GIVEN_IMPORTS, "<given imports>", "exec"), namespace)
    if figures is not None:
        figures.mkdir(parents=True, exist_ok=True)
        plt, shown = namespace["plt"], []

        def save_figure():
            shown.append(figures / f"figure_{len(shown) + 1}.png")
            plt.gcf().savefig(shown[-1], dpi=90)
            plt.close("all")
        plt.show = save_figure
    setup = time.perf_counter() - started
    print(f"export cell + imports: {setup:.2f} s")
    total = 0.0
    for number, (header, body) in enumerate(cells((HERE / "decoding.py").read_text())):
        if "[markdown]" in header:
            continue
        cell_started = time.perf_counter()
        exec(compile(body, f"<cell {number}: {header}>", "exec"), namespace)
        seconds = time.perf_counter() - cell_started
        total += seconds
        print(f"{seconds:6.2f} s  cell {number:2d} {header}")
    print(f"decoding cells: {total:.2f} s (plus {setup:.2f} s of imports)")
    glued = namespace["GLUED"]
    markdown = "\n".join(body for header, body in cells((HERE / "decoding.py").read_text()) if "[markdown]" in header)
    used = set(re.findall(r"\{glue:text\}`([^`]+)`", markdown))
    missing = sorted(used - set(glued))
    if not quiet:
        for name in sorted(glued):
            print(f"  glue {name} = {glued[name]}{'' if name in used else '   (not used in the prose)'}")
    if missing:
        print(f"glue roles without a glue() call: {missing}")
        return 1
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    target = pathlib.Path(args[args.index("--figures") + 1]) if "--figures" in args else None
    sys.exit(main(quiet="--quiet" in args, figures=target))
