"""The grader's settings: one object (``autograder.settings``), read once per grading, documented in
one table of the README; the probes' time limit follows the setting at grading time."""
from __future__ import annotations

import dataclasses
import re

from traitlets.config import Config

from autograder import settings
from autograder.chapters import known
from autograder.execute import GuardedExecute
from autograder.judge.verdict import judge_probe
from support import ROOT

SETTINGS = dataclasses.fields(settings.GraderSettings)
# Files copied into the sandboxed kernel read the kernel's channel (CASES, RESULTS, RULES): no settings.
KERNEL_SIDE = ROOT / "autograder" / "sandboxed"
READ = re.compile(r"\b(environ|getenv)\b")


def _readme_rows() -> dict[str, list[str]]:
    """The README's table of settings: setting name -> its (default, meaning) cells."""
    rows = {}
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].strip("`") in {
                f.metadata["name"] for f in SETTINGS}:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_only_the_settings_module_reads_the_grader_s_environment_variables():
    """No module of the grader, the generator or the conventions reads an ``ATTN_GRADER_*`` variable
    itself (the kernel-side files excepted, which read the channel the kernel is started with)."""
    readers = []
    for package in ("autograder", "coursekit", "coursegen"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "autograder" / "settings.py" or KERNEL_SIDE in path.parents:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "ATTN_GRADER_" in line and READ.search(line):
                    readers.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not readers, "read these through autograder.settings.current():\n" + "\n".join(readers)


def test_each_variable_changes_its_setting(monkeypatch):
    """Every setting named by an environment variable takes that variable's value; unset, its default."""
    defaults = settings.GraderSettings()
    changed = {"cell_timeout": ("7.5", 7.5), "call_timeout": ("3", 3.0), "private_seed": ("s3cret", "s3cret"),
               "cache": (str(ROOT / "elsewhere"), ROOT / "elsewhere"), "keep": ("1", True), "no_cgroups": ("1", True)}
    assert set(changed) == {f.name for f in SETTINGS if f.metadata["name"].startswith(settings.ENV)} - {"limits"}
    for field in SETTINGS:
        if field.name in changed:
            monkeypatch.setenv(field.metadata["name"], changed[field.name][0])
    monkeypatch.setenv("ATTN_GRADER_LIMIT_TASKS", str(defaults.limits.tasks + 1))
    read = settings.GraderSettings.from_environment()
    assert {name: getattr(read, name) for name in changed} == {name: value for name, (_, value) in changed.items()}
    assert read.limits.tasks == defaults.limits.tasks + 1
    for field in SETTINGS:
        if field.name in changed:
            monkeypatch.delenv(field.metadata["name"])
    assert {n: getattr(settings.GraderSettings.from_environment(), n) for n in changed} == \
        {n: getattr(defaults, n) for n in changed}


def test_a_grading_reads_the_settings_once(monkeypatch):
    """Within a grading (``in_use``), a variable changed meanwhile is not seen; after it, it is."""
    monkeypatch.setenv("ATTN_GRADER_CALL_TIMEOUT", "5")
    with settings.in_use(settings.GraderSettings.from_environment()):
        monkeypatch.setenv("ATTN_GRADER_CALL_TIMEOUT", "6")
        assert settings.current().call_timeout == 5
    assert settings.current().call_timeout == 6


def test_a_probe_s_time_limit_follows_the_setting_at_grading_time(monkeypatch):
    """Probes are built once per process; a later ``ATTN_GRADER_CALL_TIMEOUT`` still sets the limit the
    encoded call carries to the kernel and the one a timed-out call's message names."""
    from autograder import inprocess
    hidden = known()["02_self_attention"].hidden()
    test_id = next(iter(known()["02_self_attention"].tests))
    seen = {}
    for seconds in ("3", "7"):
        monkeypatch.setenv("ATTN_GRADER_CALL_TIMEOUT", seconds)
        probes = hidden.probes(test_id)
        with settings.in_use(settings.GraderSettings.from_environment()):
            calls, _, _ = inprocess.sent_calls(probes, hidden)
            messages = judge_probe(probes[0], {"status": "timeout"}, set())
        seen[seconds] = (id(probes), {c["time_limit"] for c in calls}, messages)
    assert seen["3"][0] == seen["7"][0], "the probes were built again: the test shows nothing"
    for seconds, (_, limits, messages) in seen.items():
        assert limits == {float(seconds)}
        assert f"longer than {seconds} s" in " ".join(map(str, messages)), messages


def test_the_output_cap_is_an_nbgrader_config_value_of_the_execute_step():
    """``GuardedExecute.output_cap`` defaults to the setting and nbgrader's config changes it."""
    assert GuardedExecute().output_cap == settings.GraderSettings().output_cap
    config = Config()
    config.GuardedExecute.output_cap = 100
    assert GuardedExecute(config=config).output_cap == 100


def test_the_readme_has_one_row_per_setting_with_its_meaning_and_default():
    """The README's table of settings names every setting, with the meaning its field gives, and each
    number's default as the field has it."""
    rows = _readme_rows()
    assert set(rows) == {f.metadata["name"] for f in SETTINGS}
    for field in SETTINGS:
        default, meaning = rows[field.metadata["name"]]
        assert meaning == field.metadata["meaning"], field.name
        if isinstance(field.default, (int, float)) and not isinstance(field.default, bool):
            assert default == f"{field.default:g}", field.name
