"""merge reads shards' ledgers as it reads any file it did not write: no name in them reaches a
path unchecked (issue 45, hole 5's class, found in merge)."""
from __future__ import annotations

import json

import pytest

from autograder import feedback
from autograder.classroom.merge import merge

CHAPTER = "02_self_attention"


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("student", ["../../../escaped", "/tmp/absolute", ".hidden", "a/b", "ok\nnext"])
def test_a_ledger_entry_naming_a_path_out_is_skipped_with_a_line(tmp_path, student, capsys):
    shard, target = tmp_path / "shard", tmp_path / "class"
    (shard / ".grading").mkdir(parents=True)
    entry = {"student": student, "chapter": CHAPTER, "status": "graded", "tests": {}, "sha": "x"}
    lines = [json.dumps(entry), json.dumps([1, 2]), json.dumps({"student": 3}), "not json"]
    (shard / ".grading" / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    page = shard / "feedback" / student / CHAPTER / f"{CHAPTER}.html"
    try:
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text("<html>planted</html>")
    except OSError:
        pass
    around = _tree(tmp_path)
    assert merge(target, [shard]) == 0
    assert "entry skipped" in capsys.readouterr().err
    made = set(_tree(tmp_path)) - set(around)
    assert all(p.startswith("class") for p in made), sorted(made)
    assert not any("escaped" in p or "planted" in p for p in made)


@pytest.mark.parametrize("name", ["../x.html", "/tmp/x.html", "a/../../x.html"])
def test_write_page_refuses_a_name_out_of_its_folder(tmp_path, name):
    with pytest.raises(ValueError, match="must stay inside"):
        feedback.write_page(tmp_path / "feedback", name, "<html></html>")
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize("student", ["/tmp/absolute", "../../x", ".hidden", "", "a\\b"])
def test_grade_refuses_a_student_id_that_leads_out_of_its_scratch_course(tmp_path, student):
    """The Python call, not only the command line: the id names folders of the scratch course."""
    from autograder.grading import grade
    from autograder.submission import SubmissionError
    with pytest.raises(SubmissionError, match="cannot be a student id"):
        grade(tmp_path / "02_self_attention.ipynb", student=student)
