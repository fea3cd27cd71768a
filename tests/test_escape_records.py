"""What the kernel says about itself earns nothing (issue 45, hole 6): its record of torch calls and
its memory.

The from-scratch rule used to believe the kernel's list of the torch functions a call used
(``attn_probe``'s recorder) and read the answer cells only: a helper in an added cell calling
``F.scaled_dot_product_attention``, with the recorder told to drop its name, gained the points.
Now the grader reads every cell the learner can edit or add and follows the answers' calls into
them (``static_check``); the recorder can only add a way to fail. Memory rules read the sandbox's
cgroup from outside, so memory kept in ``/tmp`` or ``/dev/shm`` or in a child that has ended
counts, and nothing inside can reset the peak.

The fast tier reads notebooks (the call-graph rule, which cells are read, what correct habits
cost: nothing) and checks that every chapter's cheat is a real one: run here with the recorder
silenced, its answers pass every probe of the judge. The pipeline tier grades the cheats, the
learners' own comparisons and the memory tricks through the sandboxed kernel.
"""
from __future__ import annotations

import copy
import textwrap
import time
import types

import nbformat
import pytest

from catalog import with_body
from support import grade_notebooks, reference_answers, scores_by_test, submission

from autograder import static_check
from autograder.chapters import ChapterInfo
from coursekit import conventions as C

MiB = 2**20
CHAPTERS = ["02_self_attention", "03_multi_head_attention", "05_transformer", "06_efficient_attention",
            "07_gpt", "08_modern_attention"]   # the chapters with from-scratch exercises


def _learner(chapter, answers=None, before=(), after=(), base="reference"):
    """A submission with ``answers``; cells ``before`` after the chapter's given cells that come
    before its first exercise (its imports and helpers are defined by then), ``after`` at the end."""
    nb = submission(answers, base=base, chapter=chapter)
    first_answer = next(i for i, c in enumerate(nb.cells) if C.is_answer_cell(c))
    at = max(i for i, c in enumerate(nb.cells[:first_answer]) if C.role(c) == "export") + 1
    nb.cells[at:at] = [nbformat.v4.new_code_cell(textwrap.dedent(s)) for s in before]
    nb.cells += [nbformat.v4.new_code_cell(textwrap.dedent(s)) for s in after]
    return nb


class _Reading(dict):
    """chapter -> (from_scratch, release, substituted): what ``static_builtin_use`` is given, made
    when first asked for (the substituted dependencies come from the chapter's probes)."""

    def __missing__(self, chapter):
        info = ChapterInfo(chapter)
        hidden = info.hidden()
        session = types.SimpleNamespace(probes={t: hidden.probes(t) for t in info.tests}, chapter=info)
        self[chapter] = (hidden.from_scratch, nbformat.read(C.learner_notebook(chapter), as_version=4),
                         static_check.substituted_dependencies(session))
        return self[chapter]


@pytest.fixture(scope="module")
def reading():
    return _Reading()


def found(reading, nb, substituted=True) -> dict[str, str]:
    chapter = nb.metadata["course"]["chapter"]
    if not substituted:   # every dependency followed: stricter, and no probe needs building
        info = ChapterInfo(chapter)
        return static_check.static_builtin_use(nb, info.hidden().from_scratch,
                                               nbformat.read(C.learner_notebook(chapter), as_version=4), {})
    from_scratch, release, substituted = reading[chapter]
    return static_check.static_builtin_use(nb, from_scratch, release, substituted)


# ------------------------------------------------------------------ the cheats, one per chapter
# The recorder told to drop every name (the kernel's attn_probe; here, the same class in process).
SILENCER = """
    try:
        import attn_probe  # the kernel's probe module, and its recorder of torch calls
    except ImportError:
        pass
    from torch.overrides import TorchFunctionMode

    def _quiet(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

    for _mode in TorchFunctionMode.__subclasses__():
        if _mode.__name__ == "_Recorder":
            _mode.__torch_function__ = _quiet
"""
ATTEND = """
    def _attend(query, key, value, mask=None):
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask), torch.softmax(scores, dim=-1)
"""
# Chapter 3: nn.MultiheadAttention's own function, on the exercise's weights.
MHA_HELPER = """
    def _builtin_heads(layer, query, key, value, mask=None):
        B, n_q, d = query.shape
        n_k, h = key.size(1), layer.num_heads
        blocked = None if mask is None else ~mask.expand(B, h, n_q, n_k).reshape(B * h, n_q, n_k)
        out, weights = F.multi_head_attention_forward(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), d, h,
            torch.cat([layer.W_q.weight, layer.W_k.weight, layer.W_v.weight]),
            torch.cat([layer.W_q.bias, layer.W_k.bias, layer.W_v.bias]), None, None, False, 0.0,
            layer.W_o.weight, layer.W_o.bias, attn_mask=blocked, average_attn_weights=False)
        return out.transpose(0, 1), weights
"""
# Chapter 5: the given scaled_dot_product_attention, which its MultiHeadAttention calls, defined again.
SDPA_AGAIN = """
    def scaled_dot_product_attention(query, key, value, mask=None):
        return _attend(query, key, value, mask)
"""
FLASH_HELPER = """
    def _flash(query, key, value, causal=False):
        return F.scaled_dot_product_attention(query, key, value, is_causal=causal)
"""
MODERN_TAIL = """        scores = q @ k_all.transpose(-2, -1) / math.sqrt(d)        # (B, h, N, P+N)
        mask = torch.ones(N, P + N, dtype=torch.bool, device=x.device).tril(diagonal=P)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        y = (weights @ v_all).transpose(1, 2).reshape(B, N, h * d)  # heads concatenated in order
"""
MODERN_CHEAT = """        mask = torch.ones(N, P + N, dtype=torch.bool, device=x.device).tril(diagonal=P)
        y = _attend(q, k_all, v_all, mask)[0].transpose(1, 2).reshape(B, N, h * d)
"""


def _cheat_answers(chapter) -> tuple[dict, list]:
    """(answers, helper cells) of CHAPTER's cheat: a from-scratch exercise whose work is done by
    the built-in in a cell of the learner's own (and the recorder silenced before it)."""
    if chapter == "02_self_attention":
        return {"scaled_dot_product_attention": "def scaled_dot_product_attention(query, key, value, mask=None):\n"
                                                "    return _attend(query, key, value, mask)\n"}, [ATTEND]
    if chapter == "03_multi_head_attention":
        return {"MultiHeadAttention": with_body(chapter, "MultiHeadAttention", "MultiHeadAttention.forward",
                                                "return _builtin_heads(self, query, key, value, mask)")}, [MHA_HELPER]
    if chapter == "05_transformer":
        return {}, [ATTEND, SDPA_AGAIN]
    if chapter == "06_efficient_attention":
        return {"flash_attention": "def flash_attention(query, key, value, block_size=64, causal=False):\n"
                                   "    return _flash(query, key, value, causal)\n"}, [FLASH_HELPER]
    modern = reference_answers(chapter)["ModernAttention"]
    assert MODERN_TAIL in modern
    return {"ModernAttention": modern.replace(MODERN_TAIL, MODERN_CHEAT)}, [ATTEND]


CHEATED = {"02_self_attention": ["scaled_dot_product_attention"], "03_multi_head_attention": ["MultiHeadAttention"],
           "05_transformer": ["EncoderLayer", "DecoderLayer"],   # Transformer's tests stand the layers in
           "06_efficient_attention": ["flash_attention"], "08_modern_attention": ["ModernAttention"]}


def cheat(chapter, silenced=True):
    answers, helpers = _cheat_answers(chapter)
    return _learner(chapter, answers, before=[*([SILENCER] if silenced else []), *helpers])


# A learner's own checks against the built-in, in cells of their own: a correct habit.
COMPARISONS = {
    "02_self_attention": """
        import torch.nn.functional as F
        q, k, v = torch.randn(2, 5, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 4)
        mine, _ = scaled_dot_product_attention(q, k, v)
        print("same as PyTorch:", torch.allclose(mine, F.scaled_dot_product_attention(q, k, v), atol=1e-6))
    """,
    "03_multi_head_attention": """
        torch.manual_seed(0)
        ref = nn.MultiheadAttention(16, 4, batch_first=True)
        mine = MultiHeadAttention(16, 4)
        with torch.no_grad():
            w_q, w_k, w_v = ref.in_proj_weight.chunk(3)
            b_q, b_k, b_v = ref.in_proj_bias.chunk(3)
            for lin, w, b in ((mine.W_q, w_q, b_q), (mine.W_k, w_k, b_k), (mine.W_v, w_v, b_v),
                              (mine.W_o, ref.out_proj.weight, ref.out_proj.bias)):
                lin.weight.copy_(w)
                lin.bias.copy_(b)
        x = torch.randn(2, 5, 16)
        print(torch.allclose(mine(x, x, x)[0], ref(x, x, x)[0], atol=1e-5))
    """,
    "05_transformer": """
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        x = torch.randn(2, 5, 16)
        print(layer(x).shape, EncoderLayer(16, 4, 32)(x).shape)
    """,
    "06_efficient_attention": """
        def check(fn, n=256):
            q, k, v = torch.randn(1, n, 16), torch.randn(1, n, 16), torch.randn(1, n, 16)
            return (fn(q, k, v, block_size=64) - F.scaled_dot_product_attention(q, k, v)).abs().max()
        print(check(flash_attention))
    """,
    "07_gpt": """
        x = torch.randn(2, 5, 16)
        print(F.scaled_dot_product_attention(x, x, x, is_causal=True).shape)
    """,
    "08_modern_attention": """
        import torch.nn.functional as F
        from torch.nn.functional import scaled_dot_product_attention as sdpa
        q = torch.randn(1, 4, 3, 8)
        expected = sdpa(q, q, q, is_causal=True)
        print(expected.shape)
    """,
}


# ------------------------------------------------------------------ fast tier: what is read, and how

@pytest.mark.parametrize("chapter", C.chapter_names())
@pytest.mark.parametrize("base", ["stub", "reference"])
def test_the_chapters_own_code_and_the_reference_cost_nothing(reading, chapter, base):
    """Given helpers, the imports cell, stubs and reference answers: every cell is read, nothing found."""
    assert found(reading, submission(base=base, chapter=chapter), substituted=False) == {}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_learners_own_comparison_with_the_builtin_costs_nothing(reading, chapter):
    assert found(reading, _learner(chapter, after=[COMPARISONS[chapter]])) == {}


@pytest.mark.parametrize("chapter", list(CHEATED))
def test_a_helper_in_an_added_cell_that_calls_the_builtin_costs_the_exercises_that_reach_it(reading, chapter):
    """Without the recorder silenced: the call graph alone finds it, and names the helper's cell."""
    nb = cheat(chapter, silenced=False)
    got = found(reading, nb)
    assert set(got) == set(CHEATED[chapter]), got
    helpers = [textwrap.dedent(h) for h in _cheat_answers(chapter)[1]]
    helper_cell = next(i for i, c in enumerate(nb.cells, 1) if c.source in helpers and (
        "F.scaled_dot_product_attention" in c.source or "multi_head_attention_forward" in c.source))
    for exercise, message in got.items():
        assert f"(cell {helper_cell})" in message and "from scratch" in message, message


@pytest.mark.parametrize("chapter", list(CHEATED))
def test_silencing_the_recorder_costs_every_from_scratch_exercise(reading, chapter):
    nb = cheat(chapter)
    silencer = next(i for i, c in enumerate(nb.cells, 1) if "_Recorder" in c.source)
    got = found(reading, nb)
    assert set(got) == reading[chapter][0], got
    assert all(f"cell {silencer} reaches attn_probe" in m for m in got.values()), got


@pytest.mark.parametrize("chapter", list(CHEATED))
def test_each_cheat_is_real_its_answers_pass_the_judge_with_the_recorder_silenced(chapter, monkeypatch):
    """The learner cells of the cheat run here (trusted: the course's own test), the recorder
    silenced by the cheat's own cell: every probe of the cheated exercises passes the judge, which
    only the static reading stops. Without the silencer the recorder still names the built-in."""
    from autograder.inprocess import run_probe
    from autograder.judge.verdict import judge_probe
    from autograder.sandboxed import probe as kernel_side
    info = ChapterInfo(chapter)
    hidden = info.hidden()
    release = nbformat.read(C.learner_notebook(chapter), as_version=4)
    monkeypatch.setattr(kernel_side._Recorder, "__torch_function__", kernel_side._Recorder.__torch_function__)
    for silenced in (False, True):
        ns = {"__name__": "__main__"}
        for cell in static_check.learner_cells(cheat(chapter, silenced), release):
            exec(compile(cell.source, f"<cell {cell.number}>", "exec"), ns)
        for test_id in info.tests:
            exercise = info.exercise_of(test_id)
            if exercise not in CHEATED[chapter] or test_id in hidden.memory_rules:
                continue
            for probe in hidden.probes(test_id)[:2]:
                problems = judge_probe(probe, run_probe(probe, ns, hidden), hidden.from_scratch)
                if silenced:
                    assert problems == [], (test_id, problems)
                else:
                    assert any("from scratch" in p for p in problems), (test_id, problems)


# The call-graph rule on Chapter 2: (cells before, cells after, answers) -> {exercise: words}.
SDPA_VIA = "def scaled_dot_product_attention(query, key, value, mask=None):\n    return {call}\n"
GRAPH_CASES = {
    # correct habits
    "own_imports_and_softmax_and_mask_helpers": (
        ["import torch.nn.functional as F\n\ndef softmax(x):\n    return F.softmax(x, dim=-1)\n\n"
         "def blocked(scores, mask):\n    return scores if mask is None else scores.masked_fill(~mask, float('-inf'))\n"],
        [], {"scaled_dot_product_attention": SDPA_VIA.format(
            call="(lambda w: (w @ value, w))(softmax(blocked(query @ key.transpose(-2, -1) / math.sqrt(query.size(-1)), mask)))")},
        {}),
    "comparison_helper_handed_the_builtin": (
        [], ["def compare(fn, ref):\n    q = torch.randn(2, 3, 4)\n    return torch.allclose(fn(q, q, q)[0], ref(q, q, q))\n",
             "print(compare(scaled_dot_product_attention, F.scaled_dot_product_attention))"], {}, {}),
    "comparison_in_the_answer_cell_itself": (
        [], [], {"scaled_dot_product_attention": reference_answers("02_self_attention")["scaled_dot_product_attention"]
                 + "\nq = torch.randn(2, 3, 4)\nout = F.scaled_dot_product_attention(q, q, q)\n"}, {}),
    "a_local_named_like_a_test_cells_global": (   # the reference's `scores` and `weights` are locals
        [], ["q = torch.randn(2, 3, 4)\nscores = weights = F.scaled_dot_product_attention(q, q, q)\n"], {}, {}),
    "timeit_and_matplotlib_magics": (
        [], ["%matplotlib inline\n%timeit scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4), "
             "torch.randn(2, 3, 4))\n", "%%time\nscaled_dot_product_attention(*[torch.randn(2, 3, 4)] * 3)\n"], {}, {}),
    "comparisons_patched_without_a_builtin": (
        ["torch.allclose = lambda *a, **k: True\ntorch.testing.assert_close = lambda *a, **k: None"], [], {}, {}),
    "an_optional_import_that_is_not_installed": (["try:\n    import seaborn\nexcept ImportError:\n    pass"], [], {}, {}),
    "self_attention_calls_a_cheating_sdpa_substituted_in_its_tests": (
        [], [], {"scaled_dot_product_attention": SDPA_VIA.format(call="F.scaled_dot_product_attention(query, key, value), None")},
        {"scaled_dot_product_attention": "uses torch.nn.functional.scaled_dot_product_attention"}),
    # what an exercise's tests run: followed from cell to cell
    "helper_two_cells_away": (
        ["def _inner(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v)\n",
         "def _outer(q, k, v, mask=None):\n    return _inner(q, k, v), None\n"],
        [], {"scaled_dot_product_attention": SDPA_VIA.format(call="_outer(query, key, value, mask)")},
        {"scaled_dot_product_attention": "relies on `_inner` (cell 3)"}),
    "a_table_filled_in_another_cell": (
        ["OPS = {}\nOPS['attend'] = F.scaled_dot_product_attention"], [],
        {"scaled_dot_product_attention": SDPA_VIA.format(call="OPS['attend'](query, key, value), None")},
        {"scaled_dot_product_attention": "relies on `OPS` (cell 3)"}),
    "a_constant_exec": (
        ["exec('def _hidden(q, k, v):\\n    return F.scaled_dot_product_attention(q, k, v)')"], [],
        {"scaled_dot_product_attention": SDPA_VIA.format(call="_hidden(query, key, value), None")},
        {"scaled_dot_product_attention": "relies on `_hidden` (cell 3)"}),
    "defined_again_after_its_answer": (
        [], [], {}, {"scaled_dot_product_attention": "defined again in cell"}),
    # tampering and patches: every from-scratch exercise
    "the_probe_module_touched": (["import attn_probe\nattn_probe.run = None"], [], {},
                                 {"scaled_dot_product_attention": "attn_probe", "SelfAttention": "attn_probe"}),
    "sys_modules": (["import sys\nsys.modules['x'] = None"], [], {}, {"scaled_dot_product_attention": "sys.modules",
                                                                      "SelfAttention": "sys.modules"}),
    "an_audit_hook": (["import sys\nsys.addaudithook(print)"], [], {},
                      {"scaled_dot_product_attention": "sys.addaudithook", "SelfAttention": "sys.addaudithook"}),
    "the_audit_hook_switched_off": (
        ["import gc\nfor f in gc.get_objects():\n    pass"], [], {},
        {"scaled_dot_product_attention": "gc.get_objects", "SelfAttention": "gc.get_objects"}),
    "builtins_patched": (["import builtins\nbuiltins.len = len"], [], {},
                         {"scaled_dot_product_attention": "builtins", "SelfAttention": "builtins"}),
    "torch_function_switched_off": (["DISABLE = torch._C.DisableTorchFunction()\nDISABLE.__enter__()"], [], {},
                                    {"scaled_dot_product_attention": "torch._C", "SelfAttention": "torch._C"}),
    "a_run_magic": ([], ["%run helpers.py"], {}, {"scaled_dot_product_attention": "%run", "SelfAttention": "%run"}),
    "code_built_at_run_time": (["exec(bytes([112, 97, 115, 115]).decode())"], [], {},
                               {"scaled_dot_product_attention": "exec", "SelfAttention": "exec"}),
    "a_module_the_notebook_writes": (
        ["open('helpmod.py', 'w').write('import torch')", "import helpmod"], [], {},
        {"scaled_dot_product_attention": "helpmod", "SelfAttention": "helpmod"}),
    "torch_patched_with_the_builtin": (
        ["torch.softmax = lambda x, dim=-1: F.scaled_dot_product_attention(x, x, x)"], [], {},
        {"scaled_dot_product_attention": "changes torch.softmax", "SelfAttention": "changes torch.softmax"}),
    "torch_patched_through_an_alias": (
        ["m = torch\nm.softmax = lambda x, dim=-1: F.scaled_dot_product_attention(x, x, x)"], [], {},
        {"scaled_dot_product_attention": "changes m.softmax", "SelfAttention": "changes m.softmax"}),
    "torch_handed_to_a_function_that_patches_it": (
        ["def go(m, f):\n    m.softmax = f\n", "go(torch, lambda x, dim=-1: F.scaled_dot_product_attention(x, x, x))"],
        [], {}, {"scaled_dot_product_attention": "changes torch (handed to go)",
                 "SelfAttention": "changes torch (handed to go)"}),
}


@pytest.mark.parametrize("case", list(GRAPH_CASES))
def test_the_call_graph_rule(reading, case):
    before, after, answers, expected = GRAPH_CASES[case]
    nb = _learner("02_self_attention", answers, before=before, after=after)
    if case == "defined_again_after_its_answer":
        at = next(i for i, c in enumerate(nb.cells) if C.grade_id(c) == "scaled_dot_product_attention")
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell(
            "scaled_dot_product_attention = lambda q, k, v, mask=None: (F.scaled_dot_product_attention(q, k, v), None)"))
    got = found(reading, nb)
    assert set(got) == set(expected), got
    for exercise, words in expected.items():
        assert words in got[exercise] and "from scratch" in got[exercise], got[exercise]


def test_a_builtin_bound_by_a_star_import_is_found(reading):
    chapter = "06_efficient_attention"
    nb = _learner(chapter, {"flash_attention": "def flash_attention(query, key, value, block_size=64, causal=False):\n"
                                               "    return scaled_dot_product_attention(query, key, value, is_causal=causal)\n"},
                  before=["from torch.nn.functional import *"])
    star = next(i for i, c in enumerate(nb.cells, 1) if c.source == "from torch.nn.functional import *")
    got = found(reading, nb)
    assert set(got) == {"flash_attention"}, got
    assert f"relies on `scaled_dot_product_attention` (cell {star})" in got["flash_attention"], got


def test_which_cells_are_read(reading):
    """Every cell that runs as the learner wrote it; not the restored test cells nor the given demo
    cells grading drops; an answer cell re-typed as markdown is read, a fake test cell is read."""
    chapter = "02_self_attention"
    from_scratch, release, substituted = reading[chapter]
    nb = _learner(chapter, after=["x = 1"])
    hide_as_test = nbformat.v4.new_code_cell("y = 2")   # metadata of a test the release does not have
    hide_as_test.metadata["nbgrader"] = {"grade": True, "grade_id": "test_made_up", "locked": True, "points": 1,
                                         "solution": False, "schema_version": 3}
    nb.cells.append(hide_as_test)
    answer = next(c for c in nb.cells if C.grade_id(c) == "scaled_dot_product_attention")
    answer.cell_type = "markdown"
    for key in ("outputs", "execution_count"):
        answer.pop(key, None)
    test = next(c for c in nb.cells if C.grade_id(c) == "test_SelfAttention_values")
    test.source = "z = 3"   # restored from the release: not what runs
    release = copy.deepcopy(release)   # with a written answer: prose, graded by hand, never run
    written = nbformat.v4.new_markdown_cell("YOUR ANSWER HERE")
    written.metadata["nbgrader"] = {"grade": True, "grade_id": "written_why", "locked": False, "points": 1,
                                    "solution": True, "schema_version": 3}
    release.cells.append(written)
    nb.cells.append(nbformat.v4.new_markdown_cell("Because softmax(x) = softmax(x + c).", metadata=written.metadata))
    cells = static_check.learner_cells(nb, release)
    sources = [c.source for c in cells]
    assert "x = 1" in sources and "y = 2" in sources and "z = 3" not in sources
    assert not any("softmax(x + c)" in s for s in sources)
    assert any(c.answer == "scaled_dot_product_attention" for c in cells)
    assert not any("plt." in s and "fig" in s for s in sources)   # given demo cells: dropped, never run
    assert [c.number for c in cells] == sorted(c.number for c in cells)


def test_code_the_grader_replaces_with_the_reference_is_not_followed(reading):
    assert reading["02_self_attention"][2]["SelfAttention"] == {"scaled_dot_product_attention"}
    assert reading["05_transformer"][2]["EncoderLayer"] == {"FeedForward"}


# ------------------------------------------------------------------ the judge: records only lower

def test_the_kernels_own_records_can_only_lower_a_verdict():
    """A passing result stays passing without any record (a kernel that dropped it gains nothing
    it did not have), and fails with a built-in's name in it; a failing one fails either way."""
    from autograder.inprocess import run_probe
    from autograder.judge.verdict import judge_probe
    chapter = "02_self_attention"
    info, ref = ChapterInfo(chapter), ChapterInfo(chapter).reference()
    hidden = info.hidden()
    ns = {name: getattr(ref, name) for name in dir(ref)}
    probe = hidden.probes("test_scaled_dot_product_attention_values")[0]
    good = run_probe(probe, ns, hidden)
    assert judge_probe(probe, good, hidden.from_scratch) == []
    for key in ("torch_functions", "submodules", "seconds", "model_calls"):
        assert judge_probe(probe, {k: v for k, v in good.items() if k != key}, hidden.from_scratch) == []
    assert judge_probe(probe, {**good, "seconds": 1e9}, hidden.from_scratch) == []
    forged = {**good, "torch_functions": ["scaled_dot_product_attention"]}
    assert "from scratch" in " ".join(judge_probe(probe, forged, hidden.from_scratch))
    wrong = run_probe(probe, {**ns, "scaled_dot_product_attention": lambda q, k, v, mask=None: (v[..., :1, :], None)},
                      hidden)
    for record in ({}, {"torch_functions": []}, {"torch_functions": [], "submodules": [], "seconds": 0.0}):
        assert judge_probe(probe, {**wrong, **record}, hidden.from_scratch) != []


# ------------------------------------------------------------------ the cgroup's peak, read from outside

def test_a_v1_peak_is_reset_to_the_usage_then_and_read_after(tmp_path):
    from autograder.cgroups import PeakWatch
    (tmp_path / "memory.usage_in_bytes").write_text(f"{100 * MiB}\n")
    (tmp_path / "memory.max_usage_in_bytes").write_text(f"{900 * MiB}\n")   # an old peak
    watch = PeakWatch(tmp_path, 1)
    assert watch.works and (tmp_path / "memory.max_usage_in_bytes").read_text() == "0"   # reset
    (tmp_path / "memory.max_usage_in_bytes").write_text(f"{350 * MiB}\n")
    assert watch.rise() == 250 * MiB


def test_a_v2_peak_without_reset_is_sampled(tmp_path):
    """Before Linux 6.12 memory.peak cannot be reset: memory.current is sampled meanwhile (here
    memory.peak cannot even be opened, so the samples are all there is)."""
    from autograder.cgroups import PeakWatch
    (tmp_path / "memory.peak").mkdir()            # cannot be opened for writing, nor read
    current = tmp_path / "memory.current"
    current.write_text(f"{100 * MiB}\n")
    watch = PeakWatch(tmp_path, 2)
    assert watch.works
    current.write_text(f"{400 * MiB}\n")
    time.sleep(0.2)
    current.write_text(f"{150 * MiB}\n")
    assert watch.rise() == 300 * MiB


# ------------------------------------------------------------------ pipeline: graded in the sandbox
# Memory kept where no process's resident memory shows it, in a cell of the learner's own: each
# trick runs only on the memory tests' large inputs, around a correct answer.
HOGS = """
    import os
    import _posixsubprocess

    import numpy as np

    def _after_a_reset(mib):
        \"\"\"MIB MiB allocated and freed, then the peak of resident memory reset (/proc/self/clear_refs).\"\"\"
        block = torch.ones(mib * 2**18)
        del block
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def _in_tmp(mib):
        \"\"\"MIB MiB written to a file in /tmp (tmpfs), one MiB at a time, then removed.\"\"\"
        chunk = b"x" * 2**20
        with open("/tmp/held", "wb") as f:
            for _ in range(mib):
                f.write(chunk)
        os.remove("/tmp/held")

    def _in_shm(mib):
        \"\"\"MIB files of one MiB in /dev/shm, each mapped, filled and unmapped in turn.\"\"\"
        for i in range(mib):
            part = torch.from_file(f"/dev/shm/held{i}", shared=True, size=2**18, dtype=torch.float32)
            part.fill_(1.0)
            del part

    def _in_a_child(mib):
        \"\"\"A child process touches MIB MiB and ends before anyone reads the kernel's memory.\"\"\"
        def touch():
            np.ones(mib * 2**17)
            os._exit(0)
        r, w = os.pipe()
        pid = _posixsubprocess.fork_exec([b"/bin/true"], [b"/bin/true"], True, (w,), None, None, -1, -1, -1, -1,
                                         -1, -1, r, w, True, False, -1, None, None, None, -1, touch, False)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
"""


def _wrapped(chapter, exercise, hog, big):
    """The reference answer of EXERCISE, running HOG first on inputs for which BIG holds."""
    answer = reference_answers(chapter)[exercise]
    if exercise == "MultiHeadLatentAttention":
        return answer.replace("class MultiHeadLatentAttention(nn.Module):", "class _Latent(nn.Module):") + f"""

class MultiHeadLatentAttention(_Latent):
    def forward(self, x, past=None, absorb=False):
        if {big}:
            {hog}
        return super().forward(x, past, absorb)
"""
    signature = next(line for line in answer.splitlines() if line.startswith(f"def {exercise}("))
    params = signature[len(f"def {exercise}("):-2]
    call = ", ".join(p.split("=")[0].strip() for p in params.split(","))
    return answer.replace(f"def {exercise}(", f"def _{exercise}(") + f"""

{signature}
    if {big}:
        {hog}
    return _{exercise}({call})
"""


LARGE = "query.size(-2) >= 4096"
MEMORY_TRICKS = {   # name -> (chapter, {exercise: hog}): each must fail the exercise's memory test alone
    "clear_refs_and_shm": ("06_efficient_attention", {"linear_attention": "_after_a_reset(300)",
                                                      "flash_attention": "_in_shm(160)"}),
    "tmp_and_child": ("06_efficient_attention", {"linear_attention": "_in_tmp(300)",
                                                 "flash_attention": "_in_a_child(300)"}),
    "child_in_absorb": ("08_modern_attention", {"MultiHeadLatentAttention": "_in_a_child(300)"}),
}
MEMORY_TESTS = {"linear_attention": "test_linear_attention_memory", "flash_attention": "test_flash_attention_memory",
                "MultiHeadLatentAttention": "test_MultiHeadLatentAttention_absorb"}


def _memory_trick(name):
    chapter, hogs = MEMORY_TRICKS[name]
    answers = {ex: _wrapped(chapter, ex, hog, "past is not None and past[0].size(1) >= 4096"
                            if ex == "MultiHeadLatentAttention" else LARGE) for ex, hog in hogs.items()}
    return _learner(chapter, answers, before=[HOGS])


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The cheats, the comparisons and the memory tricks, graded through the real pipeline at once."""
    notebooks = {f"cheat:{c}": cheat(c) for c in CHEATED}
    notebooks.update({f"compare:{c}": _learner(c, after=[COMPARISONS[c]])
                      for c in ("02_self_attention", "03_multi_head_attention")})
    notebooks.update({f"memory:{name}": _memory_trick(name) for name in MEMORY_TRICKS})
    return grade_notebooks(notebooks, tmp_path_factory.mktemp("records"))


def _points(chapter):
    return ChapterInfo(chapter).tests


@pytest.mark.pipeline
@pytest.mark.parametrize("chapter", list(CHEATED))
def test_a_helper_calling_the_builtin_with_the_recorder_silenced_gains_nothing(graded, chapter):
    result = graded[f"cheat:{chapter}"]
    assert "error" not in result, result
    info, from_scratch = ChapterInfo(chapter), ChapterInfo(chapter).hidden().from_scratch
    lost = {t for t in info.tests if info.exercise_of(t) in from_scratch}
    assert result["score"] <= sum(p for t, p in info.tests.items() if t not in lost), result["score"]
    feedback = scores_by_test(result)
    assert all(f"(0/{info.tests[t]:g})" in feedback[t] and "from scratch" in feedback[t] for t in lost), feedback


@pytest.mark.pipeline
@pytest.mark.parametrize("chapter", ["02_self_attention", "03_multi_head_attention"])
def test_a_learners_own_comparison_keeps_full_marks(graded, chapter):
    result = graded[f"compare:{chapter}"]
    assert "error" not in result, result
    assert result["score"] == sum(_points(chapter).values()), scores_by_test(result)


@pytest.mark.pipeline
@pytest.mark.parametrize("name", list(MEMORY_TRICKS))
def test_memory_kept_out_of_sight_still_fails_the_memory_rule(graded, name):
    result = graded[f"memory:{name}"]
    assert "error" not in result, result
    chapter, hogs = MEMORY_TRICKS[name]
    info = ChapterInfo(chapter)
    feedback = scores_by_test(result)
    for exercise in hogs:   # its memory test alone is lost, for its memory (the rest of the notebook
        # is the reference: not asserted here, a loaded machine's time limits are not this test's)
        for test_id, points in info.tests.items():
            if info.exercise_of(test_id) == exercise:
                lost = test_id == MEMORY_TESTS[exercise]
                assert (f"(0/{points:g})" in feedback[test_id]) == lost, feedback[test_id]
                assert ("memory rose by" in feedback[test_id]) == lost, feedback[test_id]


@pytest.mark.pipeline
def test_the_tricks_hide_from_vmhwm_but_not_from_the_cgroup(monkeypatch):
    """The same tricks measured by both readings in a real kernel: the cgroup's peak sees each;
    the fallback's VmHWM (no cgroup) sees none of /tmp, /dev/shm or an ended child. Nothing inside
    reaches the cgroup's files."""
    from jupyter_core.utils import run_sync

    from autograder.grading import KernelSlot

    def rises(no_cgroup):
        if no_cgroup:
            monkeypatch.setenv("ATTN_GRADER_NO_CGROUPS", "1")
        slot = KernelSlot()
        try:
            client = slot.kernel.client()
            client.start_channels()
            run_sync(client.wait_for_ready)(timeout=60)

            def run(code):
                reply = run_sync(client.execute_interactive)(code, timeout=60, output_hook=lambda msg: None)
                assert reply["content"]["status"] == "ok", code
            run("import torch\n" + textwrap.dedent(HOGS))
            out = {}
            for hog in ("_in_tmp(200)", "_in_shm(160)", "_in_a_child(200)", "_after_a_reset(200)"):
                slot.kernel.reset_peak_memory()
                run(hog)
                out[hog.split("(")[0]] = slot.kernel.peak_memory_rise()
            run("import os\nassert not os.path.exists('/sys/fs/cgroup')")
            client.stop_channels()
            return slot.kernel.memory_measure, out
        finally:
            slot.close()
            monkeypatch.delenv("ATTN_GRADER_NO_CGROUPS", raising=False)

    measure, cgroup = rises(False)
    if measure == "VmHWM":
        pytest.skip("no writable cgroup hierarchy here")
    assert all(rise > 150 * MiB for rise in cgroup.values()), cgroup
    fallback_measure, fallback = rises(True)
    assert fallback_measure == "VmHWM"
    assert all(fallback[k] < 40 * MiB for k in ("_in_tmp", "_in_shm", "_in_a_child")), fallback
    assert fallback["_after_a_reset"] > 150 * MiB, fallback   # /proc is read-only: the reset fails
