"""The hidden-test protocol end to end, in process: build probes, encode, run the kernel side, decode, judge.

Both routes the kernel-side routine is run by: through the exchange's files (as the grading
kernel runs it) and in memory (``autograder.inprocess``, as the mutation benchmark and the
in-process catalog tier run it); each must give the same verdicts.

A toy reference with a model argument, a dict argument and a module return value, so
that the features later chapters rely on (``t.model``, state dicts, weight loaders) are
tested apart from any chapter.
"""
from __future__ import annotations

import importlib.util
import sys
import textwrap
import time

import pytest

from autograder import hidden as H
from autograder.judge.verdict import judge_probe
from autograder import inprocess, session
from autograder.sandboxed import probe, wire
from autograder.exchange import Exchange

TOY = textwrap.dedent('''
    import torch
    from torch import nn


    class Scale(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))
            self.register_buffer("offset", torch.arange(d, dtype=torch.float32))

        def forward(self, x):
            return x * self.w + self.offset


    def apply_model(model, x):
        return model(x)


    def load(model, state):
        with torch.no_grad():
            model.w.copy_(state["w"])
        return model


    EXPORTS_SOURCE = "import torch\\nfrom torch import nn"
''')

STUDENTS = {
    "correct": TOY,
    "new_model_instead_of_in_place": TOY.replace(
        "    with torch.no_grad():\n        model.w.copy_(state[\"w\"])\n    return model",
        "    import copy\n    fresh = copy.deepcopy(model)\n    with torch.no_grad():\n"
        "        fresh.w.copy_(state[\"w\"])\n    return fresh"),
    "changes_the_model": TOY.replace("    return model(x)", "    with torch.no_grad():\n        model.w.mul_(2)\n"
                                                           "    return model(x) / 2 + model.offset / 2"),
    "ignores_the_state": TOY.replace("model.w.copy_(state[\"w\"])", "model.w.zero_()"),
}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    path = tmp_path_factory.mktemp("toy") / "toy_reference.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_reference"] = module
    spec.loader.exec_module(module)
    tests = H.HiddenTests(module)

    @tests.test("test_apply")
    def _(t):
        t.function("apply_model", t.model("Scale", {"d": 4}), t.randn(2, 4))

    @tests.test("test_load")
    def _(t):
        t.function("load", t.model("Scale", {"d": 4}), {"w": t.randn(4)})

    return tests


@pytest.fixture(params=["files", "in process"])
def route(request):
    return request.param


def _judge(tests, test_id, student_source, tmp_path, monkeypatch, route="files") -> list[str]:
    probes = tests.build(test_id)
    if route == "in process":
        namespace: dict = {}
        exec(compile(student_source, "<student>", "exec"), namespace)
        got = inprocess.run_probes(probes, namespace, tests)
        return [problem for p, g in zip(probes, got) for problem in judge_probe(p, g, set())]
    namespace: dict = {}
    exec(compile(student_source, "<student>", "exec"), namespace)
    got, _ = _run_in_kernel_side(tests, test_id, probes, namespace, tmp_path, monkeypatch)
    return [problem for p, g in zip(probes, got) for problem in judge_probe(p, g, set())]


def _run_in_kernel_side(tests, test_id, probes, namespace, tmp_path, monkeypatch) -> tuple[list[dict], bool]:
    """The probes through the exchange's files and the kernel's ``run``, as a hidden test cell runs them
    (``session.KernelRoute``, the grading's own route, with the reference standing in for nothing):
    the results, and whether ``run`` ended the cell (so that its visible checks do not run)."""
    exchange = Exchange(tmp_path / "exchange")
    route = session.KernelRoute(tests, exchange, tmp_path / "private", sandboxed=False)  # the kernel side runs here
    route.open()
    monkeypatch.setenv("ATTN_GRADER_CASES", str(exchange.cases))
    monkeypatch.setenv("ATTN_GRADER_RESULTS", str(exchange.results))
    route.before_test(test_id, probes, [])
    try:
        probe.run(test_id, namespace)
        ended = False
    except SystemExit:
        ended = True
    finally:
        records = route.after_test(test_id)
        route.close()
    return session.with_model_calls(route.results(test_id), probes, records), ended


def test_a_model_argument_crosses_as_data_without_a_line_of_the_reference(toy):
    """A model argument reaches the kernel as names, shapes and values of its parameters and
    buffers, and the names of its methods: none of the reference's source."""
    import json
    calls, arrays, _ = session.encode_calls(toy.build("test_apply"), toy, set(), "nowhere")
    text = json.dumps(calls)
    assert all(line.strip() not in text for line in TOY.splitlines() if len(line.strip()) > 12)
    tree = calls[0]["args"][0]["m"]["tree"]
    assert set(tree["params"]) == {"w"} and set(tree["buffers"]) == {"offset"}
    assert tree["modules"][""]["methods"] == ["forward"]


@pytest.mark.parametrize("test_id", ["test_apply", "test_load"])
def test_a_correct_submission_passes(toy, test_id, tmp_path, monkeypatch, route):
    assert _judge(toy, test_id, STUDENTS["correct"], tmp_path, monkeypatch, route) == []


def test_a_loader_that_returns_a_new_model_is_told_to_load_in_place(toy, tmp_path, monkeypatch, route):
    problems = _judge(toy, "test_load", STUDENTS["new_model_instead_of_in_place"], tmp_path, monkeypatch, route)
    assert problems and "did not update `model` in place" in problems[0], problems


def test_a_function_that_changes_its_model_argument_is_told_so(toy, tmp_path, monkeypatch, route):
    problems = _judge(toy, "test_apply", STUDENTS["changes_the_model"], tmp_path, monkeypatch, route)
    assert problems and "changed the parameters of `model`" in problems[0], problems


def test_a_returned_model_is_compared_by_its_state(toy, tmp_path, monkeypatch, route):
    problems = _judge(toy, "test_load", STUDENTS["ignores_the_state"], tmp_path, monkeypatch, route)
    assert problems and "the model's `w` differs" in problems[0], problems


def test_after_a_call_runs_past_its_limit_no_later_visible_check_runs(toy, tmp_path, monkeypatch):
    """The cell of the test whose call looped, and of every later test, ends right after its calls
    (their results written): a visible check would call the looping code again, for a whole cell
    time limit, and earns nothing."""
    monkeypatch.setattr(probe, "_TIMED_OUT", [])
    namespace: dict = {}
    exec(compile(TOY.replace("    return model(x)", "    while True:\n        pass"), "<student>", "exec"),
         namespace)
    looping = toy.build("test_apply")
    for p in looping:
        p.time_limit = 0.2
    got, ended = _run_in_kernel_side(toy, "test_apply", looping, namespace, tmp_path / "apply", monkeypatch)
    assert [g["status"] for g in got] == ["timeout"] and ended
    later = toy.build("test_load")
    got, ended = _run_in_kernel_side(toy, "test_load", later, namespace, tmp_path / "load", monkeypatch)
    assert [problem for p, g in zip(later, got) for problem in judge_probe(p, g, set())] == [] and ended


@pytest.mark.parametrize("body, status", [("time.sleep(0.6)", "ok"), ("time.sleep(60)", "timeout")],
                         ids=["sleeps past its limit", "waits for ever"])
def test_a_call_is_limited_in_processor_time_and_a_waiting_call_on_the_clock(toy, body, status):
    """A sleep uses no processor time: a call that sleeps past its limit (0.3 s) still returns, so
    a busy machine cannot fail a correct call; a call that waits for ever is stopped after
    ``WAITING_FACTOR`` times its limit on the clock."""
    namespace: dict = {}
    exec(compile(TOY.replace("    return model(x)", f"    import time\n    {body}\n    return model(x)"),
                 "<student>", "exec"), namespace)
    call = toy.build("test_apply")[0]
    call.time_limit = 0.3
    started = time.monotonic()
    got = inprocess.run_probe(call, namespace, toy)
    assert got["status"] == status, got
    assert time.monotonic() - started < 0.3 * probe.WAITING_FACTOR + 2


def _same(a, b) -> bool:
    """Equal values, tensors equal to the bit (nested in tuples, lists, dicts, objects; modules by their state)."""
    import torch
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and bool(torch.equal(a.detach(), b.detach()))
    if isinstance(a, torch.nn.Module) or isinstance(b, torch.nn.Module):
        return type(a) is type(b) and _same(a.state_dict(), b.state_dict())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__") and type(a) is type(b) and not callable(a):
        return _same(vars(a), vars(b))
    return a == b


def _kept_probes_after_gradings(paths) -> list[str]:
    """In this (forked) process: grade PATHS one after another, then compare every kept probe of
    their chapter with a fresh build; what differs."""
    from autograder.chapters import ChapterInfo
    from autograder.judge.reference import expected_grads, mistake_result, reference_call
    from autograder.submission import load
    # Probes another test module of this worker built and kept (with torch's default threads: other
    # rounding in float64) are not these gradings' own: start from none.
    ChapterInfo(load(paths[0])[1].name).hidden()._built.clear()
    for path in paths:
        inprocess.grade_notebook(path)
    chapter = ChapterInfo(load(paths[0])[1].name)
    hidden, differ = chapter.hidden(), []
    kept_by_test = {test_id: hidden.probes(test_id) for test_id in chapter.tests}
    for test_id, kept in kept_by_test.items():
        for i, (old, new) in enumerate(zip(kept, hidden.build(test_id))):
            for field in ("args", "kwargs", "init", "state", "cotangents"):
                if not _same(getattr(old, field), getattr(new, field)):
                    differ.append(f"{test_id}[{i}].{field}")
            again = {"reference": reference_call, "grads": expected_grads}
            for key, (value, err) in (old.computed or {}).items():
                try:
                    fresh = mistake_result(new, key[1]) if isinstance(key, tuple) else again[key](new)
                except Exception as fresh_err:  # noqa: BLE001 - kept errors must be raised again
                    if err is None or type(err) is not type(fresh_err):
                        differ.append(f"{test_id}[{i}].computed[{key!r}]")
                    continue
                if err is not None or not _same(value, fresh):
                    differ.append(f"{test_id}[{i}].computed[{key!r}]")
    kept_results = any(p.computed for kept in kept_by_test.values() for p in kept)
    return differ if kept_results else ["no grading kept a reference result on a probe"]


def test_the_probes_a_process_keeps_stay_as_built_after_gradings(tmp_path):
    """``HiddenTests.probes`` builds a test's probes once per process and every later grading there
    reuses them (and the reference's results kept on them): after a correct notebook and mistakes
    are judged, each kept probe's inputs and each result it keeps equal a fresh build's."""
    import nbformat
    import test_grading_ch05 as catalog
    cases = ["correct:reference", *(f"mistake:{k}" for k in list(catalog.CATALOG.mistakes)[:6])]
    notebooks = catalog.CATALOG.notebooks()
    paths = []
    for case in cases:
        path = tmp_path / case.replace(":", "_") / f"{catalog.CHAPTER}.ipynb"
        path.parent.mkdir()
        nbformat.write(notebooks[case], path)
        paths.append(path)
    differ = inprocess._in_a_child(_kept_probes_after_gradings, paths)
    assert differ == [], f"kept probes that gradings changed: {differ}"
