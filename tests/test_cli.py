"""`python -m autograder grade`: output formats, exit status, and malformed submissions."""
import json
import subprocess
import sys

import nbformat
import pytest

from support import ROOT, scores_by_test, submission

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build


def grade_cli(path, *args):
    return subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_json_output_follows_the_spec(tmp_path):
    path = tmp_path / "02_self_attention.ipynb"
    nbformat.write(submission(), path)
    proc = grade_cli(path, "--json", "--feedback-dir", str(tmp_path / "fb"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"notebook", "score", "max_score", "exercises", "by_hand"}
    assert data["notebook"] == "02_self_attention"
    assert data["score"] == data["max_score"] == 10.0  # the automatic part: written answers are outside it
    assert data["by_hand"] == {"max_score": 2.0, "pending": 0.0,  # left as its prompt: nbgrader's 0
                               "answers": {"written_key_bias_gradient": {"max_score": 2.0, "answered": False}}}
    assert list(data["exercises"]) == ["scaled_dot_product_attention", "causal_mask", "padding_mask",
                                       "SelfAttention"]
    for exercise in data["exercises"].values():
        assert set(exercise) == {"score", "max_score", "feedback"}
        assert exercise["score"] == exercise["max_score"]
    html = (tmp_path / "fb" / "student-02_self_attention.html").read_text()
    for secret in ("BEGIN HIDDEN", "attn_probe", "ATTN_GRADER"):
        assert secret not in html


def test_text_report_for_the_untouched_notebook():
    proc = grade_cli(ROOT / "chapters" / "02_self_attention.ipynb")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("02_self_attention: 0 / 10 points")
    assert "not implemented yet" in proc.stdout


BAD_FILES = {
    "empty.ipynb": b"",
    "not_json.ipynb": b"{this is not json",
    "list.ipynb": b"[1, 2, 3]",
    "no_cells.ipynb": json.dumps({"metadata": {}, "nbformat": 4}).encode(),
    "02_self_attention.ipynb": json.dumps({"cells": [], "metadata": {}, "nbformat": 5,
                                           "nbformat_minor": 0}).encode(),
    "homework.ipynb": nbformat.writes(nbformat.v4.new_notebook()).encode(),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_ungradable_files_give_one_line_and_nonzero_exit(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(BAD_FILES[name])
    proc = grade_cli(path, "--json")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr


def test_missing_file(tmp_path):
    proc = grade_cli(tmp_path / "nothing.ipynb")
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_a_failed_autograde_is_named_by_its_cause_not_nbgraders_summary():
    """nbgrader's API returns its log and, as "error", its own summary ("see the above traceback"):
    the error a grading raises shows the cause, from the log."""
    from autograder.grading import _autograde_failure
    log = ("[AutogradeApp | ERROR] There was an error processing assignment: /tmp/c/submitted/s/ch\n"
           "Traceback (most recent call last):\n  File \"run.py\", line 3, in preprocess\n"
           "    raise DeadKernelError('Kernel died')\nnbclient.exceptions.DeadKernelError: Kernel died\n"
           "[AutogradeApp | ERROR] Please see the the above traceback for details\n")
    error = ("Traceback (most recent call last):\n  File \"base.py\", line 468, in convert_notebooks\n"
             "    raise NbGraderException(msg)\n"
             "nbgrader.converters.base.NbGraderException: Please see the the above traceback for details\n")
    assert _autograde_failure({"success": False, "log": log, "error": error}) == \
        "nbclient.exceptions.DeadKernelError: Kernel died"
    assert _autograde_failure({"success": False, "log": "no traceback at all"}) == "no traceback at all"


# ------------------------------------------------------------ damaged but gradable notebooks
def _damaged():
    cases = {}
    nb = submission()
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") not in
                ("test_causal_mask", "padding_mask")]
    cases["deleted_cells"] = (nb, {"test_padding_mask": "not defined"})

    nb = submission()
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade") is True:
            cell.source = "pass  # the learner emptied this test"
    cases["edited_tests"] = (nb, {})

    nb = submission()
    test = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_causal_mask")
    nb.cells.append(nbformat.from_dict(json.loads(json.dumps(test))))
    nb.cells.append(nbformat.v4.new_markdown_cell(test.source))
    nb.cells[-1].metadata = dict(test.metadata)
    cases["duplicated_and_retyped_test"] = (nb, {})

    nb = submission()
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "causal_mask":
            cell.source = "def causal_mask(n):\n    return torch.ones(n, n, dtype=torch.bool).tril(\n"
    cases["syntax_error"] = (nb, {"test_causal_mask": "not defined"})

    nb = submission()
    nb.nbformat_minor = 5
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    cases["newer_minor_format_with_ids"] = (nb, {})

    nb = submission(append=["while True:\n    print('spam ' * 200)"])
    cases["endless_output_at_the_end"] = (nb, {})
    return cases


DAMAGED = _damaged()


@pytest.fixture(scope="module")
def damaged(grade_catalog):
    return grade_catalog({f"damaged:{k}": v[0] for k, v in DAMAGED.items()})


@pytest.mark.parametrize("name", list(DAMAGED))
def test_damaged_notebooks_grade_on_honest_tests(damaged, name):
    result = damaged[f"damaged:{name}"]
    assert "error" not in result, result
    expected = DAMAGED[name][1]
    for test_id, line in scores_by_test(result).items():
        if test_id in expected:
            assert "(0/1)" in line and expected[test_id] in line, line
        else:
            assert "(1/1): passed" in line, line


def test_renamed_notebook_is_recognised_by_its_metadata(tmp_path):
    path = tmp_path / "my homework (final).ipynb"
    nbformat.write(submission(), path)
    proc = grade_cli(path, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["score"] == 10.0


def test_a_graded_submission_whose_full_page_cannot_be_made_gets_its_scores(tmp_path, monkeypatch):
    """nbgrader's page failed or held a hidden test's text (``feedback.render`` gives None): the learner
    still gets a page with the score and every verdict, not one saying it could not be graded."""
    import autograder.feedback
    from autograder.grading import grade
    monkeypatch.setattr(autograder.feedback, "render", lambda *args, **kwargs: None)
    path = tmp_path / "02_self_attention.ipynb"
    nbformat.write(submission(), path)
    page = grade(path, feedback=True).feedback_page
    assert "Score: 10 / 10" in page and "could not be graded" not in page, page
    assert "test_causal_mask" in page and "passed" in page, page
