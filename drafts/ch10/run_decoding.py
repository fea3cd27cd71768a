"""Run Chapter 10's decoding sections (drafts/ch10/decoding.py) as a script, cell by cell, and time them.

The cells run after the chapter's fixed export cell and its given imports (time, matplotlib,
glue with a print fallback), as they will in course/10_attention_kernels.py, with the
reference solutions in place. Figures go to the Agg backend and are not shown.

    nice .venv/bin/python drafts/ch10/run_decoding.py [--quiet] [--figures DIR]
    nice .venv/bin/python drafts/ch10/run_decoding.py --compile-for-gpu

With --figures, each figure a cell shows is saved as DIR/figure_N.png. With --compile-for-gpu,
nothing runs: the exercise cells' kernels are compiled, without a GPU and without the
interpreter, for an H100 (sm_90) and an A100 (sm_80), down to a cubin, at the dtypes and
sizes the wrappers launch them with; a kernel that only the interpreter can run (one that
calls torch, say) fails here.
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


# Each kernel's signature as the wrappers launch it (pointer dtypes, integer arguments), and its
# constexprs at a large and a small size.
GPU_LAUNCHES = {
    "decode_partials_kernel": (
        dict(q_ptr="*fp32", k_ptr="*fp32", v_ptr="*fp32", o_part_ptr="*fp32", lse_part_ptr="*fp32",
             n_keys="i32", split_len="i32", scale="fp32"),
        [dict(D=128, BLOCK_N=64), dict(D=16, BLOCK_N=16)]),
    "combine_kernel": (
        dict(o_part_ptr="*fp32", lse_part_ptr="*fp32", o_ptr="*fp32", lse_ptr="*fp32", num_splits="i32"),
        [dict(D=128, BLOCK_S=64), dict(D=16, BLOCK_S=1)]),
    "paged_decoding_kernel": (
        dict(q_ptr="*fp16", k_ptr="*fp32", v_ptr="*fp32", table_ptr="*i64", lens_ptr="*i32", o_ptr="*fp16",
             scale="fp32", stride_table="i32", stride_block="i32", stride_head="i32", stride_slot="i32"),
        [dict(H=32, D=128, BLOCK_SIZE=16), dict(H=1, D=16, BLOCK_SIZE=4)]),
}


def compile_for_gpu() -> int:
    """Compile every kernel of the exercise cells for sm_90 and sm_80 (Triton's own ptxas); 0 if all do."""
    import os
    import tempfile
    os.environ.pop("TRITON_INTERPRET", None)           # real compilation, not the interpreter
    import triton
    import triton.language as tl
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    namespace = {"math": __import__("math"), "torch": torch, "triton": triton, "tl": tl}
    with tempfile.TemporaryDirectory() as folder:
        for number, (header, body) in enumerate(cells((HERE / "decoding.py").read_text())):
            if "[exercise" in header:
                path = pathlib.Path(folder) / f"cell_{number}.py"    # triton.jit reads its source from a file
                path.write_text(body)
                exec(compile(body, str(path), "exec"), namespace)
        failed = 0
        for name, (signature, sizes) in GPU_LAUNCHES.items():
            for constexprs in sizes:
                for arch in (90, 80):
                    full = {**signature, **{key: "constexpr" for key in constexprs}}
                    positions = {(list(full).index(key),): value for key, value in constexprs.items()}
                    try:
                        kernel = triton.compile(ASTSource(namespace[name], full, positions),
                                                target=GPUTarget("cuda", arch, 32))
                        print(f"sm_{arch} {name} {constexprs}: cubin of {len(kernel.asm['cubin']):,} bytes")
                    except Exception as error:  # noqa: BLE001 - report every kernel, then fail
                        failed += 1
                        print(f"sm_{arch} {name} {constexprs}: FAILED {type(error).__name__}: {error}")
    return 1 if failed else 0


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
    if "--compile-for-gpu" in args:
        sys.exit(compile_for_gpu())
    target = pathlib.Path(args[args.index("--figures") + 1]) if "--figures" in args else None
    sys.exit(main(quiet="--quiet" in args, figures=target))
