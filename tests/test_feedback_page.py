"""A test cell's verdict on the feedback page: Markdown's `code` shows as code, one reason is one
line (no stray "- "), several are a list, and nothing in a message can inject HTML. The page of a
submission that could not be graded says why, in its edition; one whose full page could not be
made gets its scores and verdicts; and a page is written whole.

The whole page, made by nbgrader from a real grading run, is checked in test_classroom.py and
test_chinese_edition.py; here only the verdict's own rendering, which needs no kernel.
"""
from __future__ import annotations

import re

from autograder.feedback import MATHJAX_FOLDER, as_html, scores_page, unavailable_page, verdict_output, write_page
from autograder.messages import msg
from autograder.judge.outcome import TestOutcome, Verdict


def outcome(*problems, score=0.0):
    return TestOutcome("test_GPT_cache", "GPT", 2.0, score, [Verdict(p) for p in problems])


def test_backticks_become_code_and_one_reason_is_one_line():
    reason = msg("`{target}`: {what} from the reference", target="GPT", what=msg("`{name}` differs", name="logits"))
    html = verdict_output(outcome(reason), "en").data["text/html"]
    assert "<code>GPT</code>: <code>logits</code> differs from the reference" in html, html
    assert "`" not in html and "- " not in html and "<li>" not in html, html


def test_several_reasons_are_a_list():
    out = verdict_output(outcome("first `a`", "second"), "en")
    html, plain = out.data["text/html"], out.data["text/plain"]
    assert "<ul><li>first <code>a</code></li><li>second</li></ul>" in html, html
    assert plain.splitlines()[1:] == ["- first `a`", "- second"], plain


def test_passed_and_escaped():
    assert "passed" in verdict_output(outcome(score=2.0), "en").data["text/html"]
    assert as_html("a <script> & `x < y`") == "a &lt;script&gt; &amp; <code>x &lt; y</code>"


def test_told_in_chinese():
    html = verdict_output(outcome(score=2.0), "zh_CN").data["text/html"]
    assert "通过</p>" in html and "passed</p>" not in html, html


def test_a_page_for_a_submission_that_could_not_be_graded_is_told_in_its_edition():
    page = unavailable_page("li", "02_self_attention", 10, "<x>.ipynb: the file is empty", "zh_CN")
    assert "0 / 10" in page and "&lt;x&gt;.ipynb: the file is empty" in page, page
    for english in ("feedback for", "Score", "could not be graded"):
        assert english not in page, f"English left in the Chinese page: {english!r}"
    assert "could not be graded: no reason recorded" in unavailable_page("ada", "02_self_attention", 10, "", "en")


def test_a_graded_submission_without_its_full_page_gets_its_scores_and_verdicts():
    """When nbgrader's page cannot be made safely, the page still gives the score and every verdict,
    and does not say the submission could not be graded."""
    outcomes = [TestOutcome("test_causal_mask", "causal_mask", 2.0, 2.0, []),
                TestOutcome("test_sdpa_scaling", "scaled_dot_product_attention", 3.0, 0.0,
                            [Verdict(msg("`{name}` differs", name="weights"))])]
    page = scores_page("ada", "02_self_attention", outcomes, "en")
    assert "Score: 2 / 5" in page and "could not be graded" not in page, page
    assert "test_sdpa_scaling" in page and "<code>weights</code> differs" in page and "passed" in page, page
    chinese = re.sub(r"<[^>]+>", "", scores_page("li", "02_self_attention", outcomes, "zh_CN"))  # what a reader sees
    assert "2 / 5" in chinese and "通过" in chinese, chinese
    for english in ("feedback for", "Score", "full page", "passed", "points"):
        assert english not in chinese, f"English left in the Chinese page: {english!r}"


def test_a_page_is_written_whole_beside_its_mathjax(tmp_path):
    target = write_page(tmp_path / "feedback", "ada/02_self_attention/02_self_attention.html", "<p>ok</p>")
    assert target.read_text() == "<p>ok</p>"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name], "a partial file was left behind"
    assert (tmp_path / "feedback" / MATHJAX_FOLDER / "tex-chtml.js").is_file()
