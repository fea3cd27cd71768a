"""What an experienced nbgrader instructor found (issue 46, items 6, 8, 9 and 10), each as it was seen.

6. A notebook of another chapter (its metadata ``course.chapter``) handed in as this one is refused
   with one line by ``grade``, ``grade-class`` and ``collect``, and never joins the similarity report;
   before, a Chapter 8 notebook in Chapter 2's folder scored 0/10 ("not defined") as Chapter 2.
8. A class folder inside the checkout that git would stage is refused; the README's are ignored.
9. A course-private seed (``ATTN_GRADER_PRIVATE_SEED``) gives every hidden test other inputs: a
   correct notebook keeps full marks, answers that return the public probes' values lose.
10. Outputs are left out before the 50 MiB limit (a 190 MiB notebook of outputs is graded), the
    raw file has a limit of its own, and the Chinese feedback page has no nbgrader English labels.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import nbformat
import pytest
from class_runs import CHAPTER, cli, new_course
from support import ROOT, grade_notebooks, submission

OTHER = "08_modern_attention"


def _written(nb, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# ------------------------------------------------------------------ 6. another chapter's notebook
def test_grade_refuses_a_notebook_of_another_chapter_in_one_line(tmp_path, capsys):
    from autograder.__main__ import main
    path = _written(submission(chapter=OTHER), tmp_path / f"{CHAPTER}.ipynb")  # renamed as Chapter 2
    assert main(["grade", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"a notebook of {OTHER} (its metadata course.chapter), not of {CHAPTER}" in err[0], err
    from autograder.submission import load
    assert load(path, OTHER)[1].name == OTHER  # graded as its own chapter when asked (grade --chapter)


def test_load_reads_the_chapter_as_before_when_the_metadata_agrees_or_names_none(tmp_path):
    from autograder.submission import SubmissionError, load
    nb = submission()
    assert load(_written(nb, tmp_path / "a" / f"{CHAPTER}.ipynb"))[1].name == CHAPTER
    assert load(_written(nb, tmp_path / "b" / "renamed.ipynb"))[1].name == CHAPTER  # from the metadata
    nb.metadata.pop("course")
    assert load(_written(nb, tmp_path / "c" / "renamed.ipynb"), CHAPTER)[1].name == CHAPTER
    with pytest.raises(SubmissionError, match=f"not of {OTHER}"):
        load(_written(submission(), tmp_path / "d" / f"{OTHER}.ipynb"))


def test_collect_refuses_a_notebook_of_another_chapter(tmp_path):
    from autograder.classroom.collect import collect
    source, course = tmp_path / "download", tmp_path / "course"
    _written(submission(chapter=OTHER), source / "ben" / CHAPTER / "ben.ipynb")  # nbgrader's layout
    _written(submission(), source / "ada" / CHAPTER / "ada.ipynb")
    outcomes = {o.source: o for o in collect(source, course)}
    assert outcomes[f"ben/{CHAPTER}/ben.ipynb"].action == "refused"
    assert f"a notebook of {OTHER} (its metadata course.chapter), not of {CHAPTER}" in \
        outcomes[f"ben/{CHAPTER}/ben.ipynb"].detail
    assert outcomes[f"ada/{CHAPTER}/ada.ipynb"].action == "collected"
    flat = tmp_path / "flat"
    _written(submission(chapter=OTHER), flat / "cleo.ipynb")
    (outcome,) = collect(flat, course, CHAPTER)  # --chapter names Chapter 2
    assert outcome.action == "refused" and f"not of {CHAPTER}" in outcome.detail
    assert not (course / "submitted" / "ben").exists() and not (course / "submitted" / "cleo").exists()


def test_similarity_leaves_out_a_notebook_of_another_chapter(tmp_path):
    from autograder.classroom.similarity import class_cells
    _written(submission(), tmp_path / "ada" / CHAPTER / f"{CHAPTER}.ipynb")
    _written(submission(chapter=OTHER), tmp_path / "ben" / CHAPTER / f"{CHAPTER}.ipynb")
    cells = class_cells(tmp_path, CHAPTER)
    assert cells["ada"] and cells.get("ben") == {}  # no Chapter 8 exercise in Chapter 2's section


@pytest.mark.pipeline
def test_grade_class_refuses_a_notebook_of_another_chapter(tmp_path, released_class):
    """As seen: Chapter 8's notebook in ben's Chapter 2 folder (nbgrader's own exchange puts it there,
    collect never saw it)."""
    course = new_course(tmp_path, released_class, students={"ada"})
    _written(submission(chapter=OTHER), course / "submitted" / "ben" / CHAPTER / f"{CHAPTER}.ipynb")
    proc = cli("grade-class", "--course", str(course), "--workers", "1")
    ledger = {json.loads(line)["student"]: json.loads(line)
              for line in (course / ".grading" / "ledger.jsonl").read_text().splitlines()}
    reason = f"{CHAPTER}.ipynb: a notebook of {OTHER} (its metadata course.chapter), not of {CHAPTER}; " \
             f"not graded as {CHAPTER}"
    assert ledger["ada"]["status"] == "ok" and ledger["ada"]["score"] == 10
    assert ledger["ben"]["status"] != "ok" and ledger["ben"]["reason"] == reason, ledger["ben"]
    assert reason in proc.stderr and "is not defined" not in (course / "class-exercises.csv").read_text()
    page = (course / "class-report.html").read_text()
    ungraded = page.split("id='ungraded'", 1)[1].split("id='runs'", 1)[0]
    assert "ben" in ungraded and f"a notebook of {OTHER}" in ungraded
    assert "ben" not in (course / "class-similarity.csv").read_text()


# ------------------------------------------------------------------ 8. where class data lives
def test_a_class_folder_inside_the_checkout_is_refused_unless_git_ignores_it():
    from autograder.classroom.folders import FolderError, class_folder
    with pytest.raises(FolderError, match=r"inside the repository's checkout.*~/attention-course-classes/spring"):
        class_folder(ROOT / "spring")
    for name in ("my-class", "results/shard-1", "feedback"):  # the README's, ignored by .gitignore
        assert class_folder(ROOT / name) == ROOT / name
    proc = subprocess.run(["git", "check-ignore", "sample/student-ids.csv", "my-class/gradebook.db",
                           "results/shard-1/gradebook.db"], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout.split() == ["sample/student-ids.csv", "my-class/gradebook.db", "results/shard-1/gradebook.db"]


def test_class_commands_refuse_a_folder_git_would_stage_in_one_line():
    proc = cli("release", "--course", "spring-2027", CHAPTER, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "~/attention-course-classes/spring-2027" in lines[0], lines
    assert not (ROOT / "spring-2027").exists()


# ------------------------------------------------------------------ 9. a course-private seed
TABLE_TESTS = ("test_scaled_dot_product_attention_shapes", "test_scaled_dot_product_attention_worked_example")


def _public_table() -> dict:
    """(shape of query, its sum to 4 places) -> the reference's (output, weights) for every public probe
    of TABLE_TESTS, built here with the public seed."""
    import torch

    from autograder.chapters import known
    assert not os.environ.get("ATTN_GRADER_PRIVATE_SEED")
    hidden = known()[CHAPTER].hidden()
    table = {}
    for test_id in TABLE_TESTS:
        for probe in hidden.build(test_id):
            q = probe.args[0]
            with torch.no_grad():
                out, weights = probe.reference(*probe.args, **probe.kwargs)
            table[(tuple(q.shape), round(float(q.double().sum()), 4))] = (out.tolist(), weights.tolist())
    return table


HARD_CODED = '''
PUBLIC = {table!r}


def scaled_dot_product_attention(query, key, value, mask=None):
    """The public probes' expected values, looked up; anything else gets zeros."""
    found = PUBLIC.get((tuple(query.shape), round(float(query.double().sum()), 4)))
    if found is not None:
        return torch.tensor(found[0], dtype=query.dtype), torch.tensor(found[1], dtype=query.dtype)
    return (torch.zeros(*query.shape[:-1], value.shape[-1], dtype=query.dtype),
            torch.zeros(*query.shape[:-1], key.shape[-2], dtype=query.dtype))
'''


def test_a_private_seed_changes_every_random_probe_and_only_with_it(monkeypatch):
    from autograder.chapters import known
    hidden = known()[CHAPTER].hidden()
    test_id = "test_scaled_dot_product_attention_shapes"
    monkeypatch.delenv("ATTN_GRADER_PRIVATE_SEED", raising=False)
    public = [p.args[0] for p in hidden.build(test_id)]
    assert all(a.equal(b) for a, b in zip(public, [p.args[0] for p in hidden.build(test_id)]))
    monkeypatch.setenv("ATTN_GRADER_PRIVATE_SEED", "course-2027")
    private = [p.args[0] for p in hidden.build(test_id)]
    assert [a.shape for a in private] == [a.shape for a in public]
    assert not any(a.equal(b) for a, b in zip(public, private))


@pytest.mark.pipeline
def test_a_private_seed_keeps_full_marks_and_costs_hard_coded_answers(tmp_path):
    correct = submission()
    hard_coded = submission({"scaled_dot_product_attention": HARD_CODED.format(table=_public_table())})
    public = grade_notebooks({"hard_coded": hard_coded}, tmp_path / "public")["hard_coded"]
    paths = {name: _written(nb, tmp_path / "private" / name / f"{CHAPTER}.ipynb")
             for name, nb in (("correct", correct), ("hard_coded", hard_coded))}
    env = {**os.environ, "ATTN_GRADER_PRIVATE_SEED": "course-2027"}
    procs = {name: subprocess.Popen([sys.executable, "-m", "autograder", "grade", str(path), "--json"], cwd=ROOT,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, path in paths.items()}
    private = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        private[name] = json.loads(out)
    assert private["correct"]["score"] == private["correct"]["max_score"] == 10
    tests = lambda result: {line.split(" ", 1)[0]: line for ex in result["exercises"].values()  # noqa: E731
                            for line in ex["feedback"]}
    for test_id in TABLE_TESTS:  # the public probes' answers earn these tests, and only with the public seed
        assert tests(public)[test_id].endswith("passed"), tests(public)[test_id]
        assert not tests(private["hard_coded"])[test_id].endswith("passed"), tests(private["hard_coded"])[test_id]
    assert private["hard_coded"]["score"] <= public["score"] - len(TABLE_TESTS)


# ------------------------------------------------------------------ 10. size limits, Chinese labels
def _with_outputs(nb, mib: int):
    """NB with MIB MiB of PNG output on its first code cell (as a notebook saved with its figures)."""
    blob = "A" * (2**20)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": blob, "text/plain": "<Figure>"})
                    for _ in range(mib)]
    return nb


def test_outputs_are_left_out_before_the_limit_and_the_file_has_a_limit_of_its_own(tmp_path, monkeypatch):
    from autograder import submission as S
    path = tmp_path / f"{CHAPTER}.ipynb"
    path.write_text(json.dumps(_with_outputs(submission(), 60)))  # 60 MiB, nearly all outputs
    nb, info = S.load(path)
    assert info.name == CHAPTER and not any(c.get("outputs") for c in nb.cells)
    monkeypatch.setattr(S, "MAX_FILE_BYTES", 40 * 2**20)
    with pytest.raises(S.SubmissionError, match="the file is 60 MiB, over the 40 MiB limit on a submitted file; "
                                                "clear its outputs"):
        S.load(path)
    monkeypatch.undo()
    big = submission()
    markdown = next(c for c in big.cells if c.cell_type == "markdown")
    markdown.attachments = {"figure.png": {"image/png": "A" * (51 * 2**20)}}  # attachments stay: the cell shows them
    path.write_text(json.dumps(big))
    with pytest.raises(S.SubmissionError, match=r"its cells are 5\d MiB without their outputs, over the 50 MiB"):
        S.load(path)


@pytest.mark.pipeline
def test_a_190_mib_notebook_of_outputs_is_graded_without_them(tmp_path):
    """As seen: it scored 0 ("over the 50 MiB limit"); its code is that of full marks."""
    (result,) = grade_notebooks({"outputs": _with_outputs(submission(), 190)}, tmp_path).values()
    assert result.get("score") == 10, result


def _page(language: str) -> str:
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    from autograder import feedback
    nb = nbformat.v4.new_notebook()
    meta = {"locked": False, "schema_version": 3}
    nb.cells = [nbformat.v4.new_code_cell("def f():\n    return 1", metadata={"nbgrader": {
                    **meta, "solution": True, "grade": False, "grade_id": "f", "comment": "Well tried."}}),
                nbformat.v4.new_code_cell("assert f() == 1", metadata={"nbgrader": {
                    **meta, "solution": False, "grade": True, "grade_id": "test_f", "points": 2, "score": 1}}),
                nbformat.v4.new_markdown_cell("Student's answer: (Top) Grade cell: mine")]
    exporter = HTMLExporter(config=feedback.page_config(Config(), language))
    for step in feedback.page_steps():
        exporter.register_preprocessor(step, enabled=True)
    html, _ = exporter.from_notebook_node(nb, {"nbgrader": {"notebook": CHAPTER, "score": 1, "max_score": 2,
                                                            "late_penalty": 0}})
    return html


def test_the_chinese_feedback_page_has_no_english_labels_of_nbgrader():
    english, chinese = _page("en"), _page("zh_CN")
    labels = ("Student's answer</span>", "Grade cell: <code>", "(Top)</a>", "<b>Comments:</b>")
    assert all(label in english for label in labels) and re.search(r'pull-right">\s*Score: 1', english)
    assert not any(label in chinese for label in labels), [label for label in labels if label in chinese]
    assert not re.search(r"\bScore:", chinese)
    for word in ("学生的答案", "评分单元格：", "（回到顶部）", "得分: 1", "<b>评语：</b>"):
        assert word in chinese, word
    assert "Student&#x27;s answer: (Top) Grade cell: mine" in chinese or \
        "Student's answer: (Top) Grade cell: mine" in chinese  # the learner's own words stay as written
