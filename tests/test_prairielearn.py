"""PrairieLearn external grading (issue 50, item 2): the grader image's folder and a question per
chapter, built by one command; the entry point run against /grade's layout in a temporary folder
(ATTN_PRAIRIELEARN_ROOT) on each kind of submission, every results.json validated against the schema
written from PrairieLearn's documentation (autograder/platforms/schemas/) and under its 1 MB. The
image itself is built only where docker runs."""
import concurrent.futures
import json
import shutil
import subprocess
import sys
import time

import pytest

from platform_submissions import CHAPTER, FROM_THE_ESCAPE_SUITE, hand_in, platform_env, submissions, validate
from support import ROOT

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build

QUESTION = f"attention_from_scratch_{CHAPTER}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("prairielearn")
    proc = subprocess.run([sys.executable, "-m", "autograder", "prairielearn", CHAPTER, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_question_uploads_the_chapters_notebook_and_grades_it_externally(built):
    folder = built / "questions" / QUESTION
    info = json.loads((folder / "info.json").read_text())
    assert info["type"] == "v3" and info["gradingMethod"] == "External"
    options = info["externalGradingOptions"]
    assert options["enabled"] and options["entrypoint"] == ["/usr/local/bin/attn-grade", CHAPTER]
    assert options["image"] and 0 < options["timeout"] <= 600  # PrairieLearn's most
    assert info["title"].startswith("Chapter 2")
    page = (folder / "question.html").read_text()
    assert f'<pl-file-upload file-names="{CHAPTER}.ipynb">' in page
    assert f'<pl-file-download file-name="{CHAPTER}.ipynb">' in page and "<pl-external-grader-results>" in page
    handout = (folder / "clientFilesQuestion" / f"{CHAPTER}.ipynb").read_bytes()
    assert handout == (ROOT / "chapters" / f"{CHAPTER}.ipynb").read_bytes()
    for secret in ("BEGIN SOLUTION", "BEGIN HIDDEN", "### BEGIN"):  # the question is public to learners
        assert all(secret not in p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_the_image_holds_the_grader_and_the_chapters_hidden_material(built):
    image = built / "grader-image"
    dockerfile = (image / "Dockerfile").read_text()
    assert "bubblewrap" in dockerfile and "requirements.txt" in dockerfile
    assert "python -m autograder.platforms.prairielearn check" in dockerfile
    assert (image / "grader" / "solutions" / f"ch{CHAPTER}_hidden.py").is_file()
    assert (image / "attn-grade").stat().st_mode & 0o111


def job(built, base, name, handed_in, entry_args=(CHAPTER,), isolation=None):
    """A grading job's /grade: the student's file in student/, tests/, serverFilesCourse/, data/."""
    root = base / name.replace(" ", "_").replace(",", "")
    for sub in ("tests", "serverFilesCourse", "data"):
        (root / sub).mkdir(parents=True)
    (root / "data" / "data.json").write_text(json.dumps({"params": {}, "submitted_answers": {}}))
    hand_in(root / "student", handed_in, f"{CHAPTER}.ipynb")
    env = platform_env(ATTN_PRAIRIELEARN_ROOT=str(root), ATTN_PRAIRIELEARN_PYTHON=sys.executable,
                       ATTN_PRAIRIELEARN_GRADER=str(built / "grader-image" / "grader"),
                       **({"ATTN_PLATFORM_ISOLATION": isolation} if isolation else {}))
    return root, [str(built / "grader-image" / "attn-grade"), *entry_args], env


@pytest.fixture(scope="module")
def graded(built, tmp_path_factory):
    """name -> (results.json, its size in bytes, the job's output): each job in a /grade of its own, two at a time."""
    base = tmp_path_factory.mktemp("jobs")
    hidden = str(built / "grader-image" / "grader" / "solutions" / f"ch{CHAPTER}.py")
    made = submissions(base, hidden)
    jobs = {name: job(built, base, name, made[name]) for name in made}
    jobs["tampering, audit hook"] = job(built, base, "tampering, audit hook", made["tampering"], isolation="audit-hook")
    jobs["not this image's chapter"] = job(built, base, "other", made["full marks"], entry_args=("07_gpt",))

    def run(item):
        name, (root, command, env) = item
        proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        if name.startswith("tampering"):
            time.sleep(7)  # what it left behind had 5 s to write results.json
        raw = (root / "results" / "results.json").read_bytes()
        return name, (json.loads(raw), len(raw), proc.stdout + proc.stderr)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(run, jobs.items()))


def test_every_results_json_follows_prairielearns_format_and_size(graded):
    for name, (data, size, log) in graded.items():
        validate(data, "prairielearn_results.schema.json")
        assert size < 1_000_000, name


def test_full_marks(graded):
    data, _, log = graded["full marks"]
    assert data["gradable"] is True and data["score"] == 1.0, log
    assert sum(t["max_points"] for t in data["tests"]) == 10.0 == sum(t["points"] for t in data["tests"])
    assert data["message"].startswith(f"{CHAPTER}: 10 / 10 points")


def test_a_named_mistake_is_told_per_test(graded):
    data, _, log = graded["partly wrong"]
    assert data["gradable"] and 0 < data["score"] < 1, log
    lost = [t for t in data["tests"] if t["points"] < t["max_points"]]
    assert lost and any("sqrt" in t["message"] for t in lost)
    assert "BEGIN HIDDEN" not in json.dumps(data) and "attn_probe" not in json.dumps(data)


@pytest.mark.parametrize("name", ["tampering", "tampering, audit hook"])
def test_tampering_gains_nothing(graded, name):
    data, _, log = graded[name]
    assert data["gradable"] and data["score"] <= graded["partly wrong"][0]["score"] < 1, log
    assert "tampered" not in json.dumps(data)
    assert ("isolated by the audit hook alone" in log) == ("audit hook" in name)


@pytest.mark.parametrize("name", ["empty file", "nothing", "another chapter", "not this image's chapter"])
def test_what_is_not_the_chapters_notebook_is_not_gradable_and_costs_no_attempt(graded, name):
    data, _, log = graded[name]
    assert data["gradable"] is False and "score" not in data, log
    assert data["format_errors"] and data["message"]


@pytest.mark.parametrize("name", FROM_THE_ESCAPE_SUITE)
def test_the_escape_suites_cases_gain_nothing_through_prairielearn(graded, name):
    data, _, log = graded[name]
    assert data["gradable"] and data["tests"], log
    if name.startswith("catalog"):  # the untouched notebook and a fake attn_probe: nothing earned
        assert data["score"] == 0.0, log
    else:  # the built-in behind a helper, the recorder silenced: its exercise's tests lost
        lost = [t for t in data["tests"] if t["description"] == "scaled_dot_product_attention"]
        assert lost and all(t["points"] == 0 and "from scratch" in t["output"] for t in lost), lost


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker on this machine")
def test_the_image_builds(built):
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        pytest.skip(f"docker is here but its daemon is not: {info.stderr.strip()[:200]}")
    proc = subprocess.run(["docker", "build", "-t", "attention-from-scratch/grader:test", str(built / "grader-image")],
                          capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
