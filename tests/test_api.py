"""``autograder.grade_notebook``, the one Python call other systems grade with (issue 50, item 3):
the same JSON as ``python -m autograder grade --json`` on the same notebook."""
import json
import subprocess
import sys

import nbformat
import pytest

from support import ROOT, reference_answers, submission

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build

CHAPTER = "02_self_attention"


def unscaled():
    """A Chapter 2 submission with one named mistake: scores not scaled by 1/sqrt(d_k)."""
    answer = reference_answers(CHAPTER)["scaled_dot_product_attention"]
    assert " / math.sqrt(d_k)" in answer
    return submission({"scaled_dot_product_attention": answer.replace(" / math.sqrt(d_k)", "")})


BY_THE_CALL = """
import json, sys
import autograder
report = autograder.grade_notebook(sys.argv[1])
print(json.dumps(report.as_json()))
"""


def test_the_call_gives_the_command_lines_json(tmp_path):
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(unscaled(), path)
    by_command = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), "--json"],
                                cwd=ROOT, capture_output=True, text=True, timeout=600)
    by_call = subprocess.run([sys.executable, "-c", BY_THE_CALL, str(path)], cwd=tmp_path,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=600)
    assert by_command.returncode == 0 and by_call.returncode == 0, by_command.stderr + by_call.stderr
    data = json.loads(by_call.stdout)
    assert data == json.loads(by_command.stdout)
    assert 0 < data["score"] < data["max_score"]
    assert any("sqrt" in line for line in data["exercises"]["scaled_dot_product_attention"]["feedback"])


def test_the_call_refuses_what_the_command_line_refuses(tmp_path):
    import autograder
    path = tmp_path / f"{CHAPTER}.ipynb"
    path.write_text("{not json")
    with pytest.raises(autograder.SubmissionError, match="not a notebook"):
        autograder.grade_notebook(path)
