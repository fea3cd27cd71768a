"""The platforms' results.json made from reports (fast: no grading), and their commands' arguments:
each platform's schema holds for a graded, a refused and a failed submission; a huge message is
cut under PrairieLearn's 1 MB; what a submission names is shown as text in Gradescope's Markdown."""
import json
import subprocess
import sys
import types

import pytest

from platform_submissions import CHAPTER, validate
from support import ROOT

from autograder.platforms import bundle, gradescope, prairielearn
from autograder.report import Report


def outcome(test_id, points, score, *problems):
    return types.SimpleNamespace(test_id=test_id, exercise="scaled_dot_product_attention", points=points,
                                 score=score, problems=list(problems))


def graded(*outcomes, repairs=()):
    report = Report(CHAPTER, "student", list(outcomes), repairs=list(repairs), written={})
    return bundle.Graded(CHAPTER, "the OS sandbox", 12.3, report=report)


CASES = {
    "graded": graded(outcome("test_a", 1, 1), outcome("test_b", 2, 0, "scores not scaled by 1/sqrt(d_k)")),
    "huge": graded(outcome("test_a", 1, 0, "x" * 3_000_000)),
    "refused": bundle.Graded(CHAPTER, "not graded", 0.1, refused="homework.ipynb: the file is empty"),
    "failed": bundle.Graded(CHAPTER, "the audit hook alone", 0.1, failed="RuntimeError: no kernel"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_both_platforms_results_follow_their_schemas(case):
    for data, schema in ((gradescope.results(CASES[case]), "gradescope_results.schema.json"),
                         (prairielearn.results(CASES[case]), "prairielearn_results.schema.json")):
        validate(data, schema)


def test_scores_and_what_cannot_be_graded():
    data = gradescope.results(CASES["graded"])
    assert data["score"] == 1.0 and [t["status"] for t in data["tests"]] == ["passed", "failed"]
    assert data["tests"][1]["output"] == "scores not scaled by 1/sqrt(d_k)"
    pl = prairielearn.results(CASES["graded"])
    assert pl["gradable"] and pl["score"] == pytest.approx(1 / 3) and pl["tests"][1]["max_points"] == 2
    for case in ("refused", "failed"):
        assert gradescope.results(CASES[case])["score"] == 0.0
        assert prairielearn.results(CASES[case])["gradable"] is False
    assert "the file is empty" in prairielearn.results(CASES["refused"])["message"]


def test_a_huge_message_is_cut_under_one_megabyte():
    data = prairielearn.results(CASES["huge"])
    assert len(json.dumps(data, ensure_ascii=False).encode()) < prairielearn.MAX_BYTES
    assert data["tests"][0]["output"].endswith("[... cut]")
    assert len(gradescope.results(CASES["huge"])["tests"][0]["output"]) <= gradescope.OUTPUT_CAP + 20


def test_what_a_submission_names_is_text_in_gradescopes_markdown():
    data = gradescope.results(graded(outcome("test_a", 1, 1), repairs=["cell <script>alert(1)</script> *x*"]))
    assert "<script>" not in data["output"] and "\\<script\\>" in data["output"] and "\\*x\\*" in data["output"]


@pytest.mark.parametrize("platform", ["gradescope", "prairielearn"])
def test_an_unknown_chapter_is_one_line_and_exit_2(platform, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "autograder", platform, "99_nothing", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown chapter(s): 99_nothing")
    assert not any(tmp_path.iterdir())


def test_the_submitted_notebook_is_found_whatever_its_name_but_never_through_a_link(tmp_path):
    folder = tmp_path / "submission"
    (folder / ".ipynb_checkpoints").mkdir(parents=True)
    (folder / ".ipynb_checkpoints" / f"{CHAPTER}.ipynb").write_text("{}")
    assert bundle.find_notebook(folder, CHAPTER) is None
    secret = tmp_path / "package" / f"{CHAPTER}.ipynb"  # the instructor notebook, in the package
    secret.parent.mkdir()
    secret.write_text("{}")
    (folder / f"{CHAPTER}.ipynb").symlink_to(secret)
    (folder / "linked").symlink_to(secret.parent, target_is_directory=True)
    assert bundle.find_notebook(folder, CHAPTER) is None
    (folder / "b").mkdir()
    (folder / "b" / "my homework.ipynb").write_text("{}")
    (folder / "a.ipynb").write_text("{}")
    assert bundle.find_notebook(folder, CHAPTER) == folder / "a.ipynb"
