"""benchmarks/attention_kernels_gpu.py without a GPU: it says that Triton's interpreter runs the
kernels, checks the reference kernels' correctness at its small shapes and prints the errors and
the interpreter's seconds (its GPU sweep needs a CUDA GPU, which no test machine has)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from support import ROOT

BENCHMARK = ROOT / "benchmarks" / "attention_kernels_gpu.py"


def test_without_a_gpu_it_checks_the_reference_kernels_under_the_interpreter():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TRITON_INTERPRET", None)  # the script sets it itself, before triton is imported
    proc = subprocess.run([sys.executable, str(BENCHMARK)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("No CUDA GPU: Triton's interpreter (TRITON_INTERPRET=1) runs the kernels on the CPU"), out
    assert "correctness only" in out and "solutions.ch10_attention_kernels" in out, out
    tolerance = {m["dtype"]: float(m["value"]) for m in re.finditer(r"(?P<value>\d\S*) \((?P<dtype>float\d+)\)", out)}
    assert set(tolerance) == {"float32", "float16"}, out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*\d+,\d+,\d+,\d+ ", line)]
    assert len(rows) >= 4, out
    assert {row[1] for row in rows} == {"True", "False"} and {row[2] for row in rows} == {"float32", "float16"}
    for shape, causal, dtype, tiles, *errors, forward_s, backward_s, verdict in rows:
        n = int(shape.split(",")[2])
        assert any(n % int(t) for t in tiles.split("x")), f"{shape}: N a multiple of the tiles {tiles}"
        assert verdict == "ok" and all(float(e) <= tolerance[dtype] for e in errors), (shape, errors)
        assert len(errors) == 5 and float(forward_s) > 0 and float(backward_s) > 0
