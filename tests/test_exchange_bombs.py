"""Forged results: what a kernel leaves in its results folder is decoded in the grader's own process,
outside the sandbox's memory limit, so it is bounded and checked before it is decoded
(``autograder.results_check``). Anything forged or past a bound counts as a missing result: that
test "did not run", never an error of the grading, and the grader's memory stays bounded.

Most of this runs no kernel: forged files are written into a private folder, as ``transfer.take_results``
leaves them, and read and judged there (``transfer.read_results`` and ``judge.cells``), as
``test_grader_protocol`` drives the judge. Bombs are measured in a forked child each, whose peak
memory is read from ``/proc`` (``VmHWM`` after ``clear_refs``); one case goes through the real
pipeline (a notebook whose answer cell forges its own results).
"""
from __future__ import annotations

import inspect
import io
import json
import resource
import shutil
import tempfile
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from autograder import inprocess, results_check, transfer
from autograder.chapters import ChapterInfo
from autograder.exchange import Exchange
from autograder.judge import cells
from autograder.sandboxed import probe, wire
from support import ROOT, grade_notebooks, reference_answers, scores_by_test, submission

CHAPTER = "02_self_attention"
TEST = "test_scaled_dot_product_attention_values"  # inputs, outputs and inputs kept: most fields of a result
GIB = 2**30
MIB = 2**20


# ------------------------------------------------------------------ forged files (also run in a kernel)

# The forger's tools: module-level here, and the source of a notebook cell in the pipeline's case
# (``forging_answer``), so they import what they use themselves.
UNIT = 1 << 24  # 16 MiB of zeros: deflated alike after each full flush, to 16,315 bytes


def _npy_header(shape, descr="<f8") -> bytes:
    import io
    import numpy as np
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return buffer.getvalue()


def _deflated(header: bytes, zeros: int, crc=True) -> tuple:
    """HEADER then ZEROS zero bytes, deflated to about a thousandth of that: (data, size, crc); with
    ``crc=False`` the CRC is 0 (not worked out: 2 s for 3 GiB)."""
    import zlib
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(UNIT)) + c.flush(zlib.Z_FULL_FLUSH)  # no reference crosses a full flush
    blocks, rest = divmod(zeros, UNIT)
    checksum = zlib.crc32(header)
    for _ in range(blocks if crc else 0):
        checksum = zlib.crc32(bytes(UNIT), checksum)
    checksum = zlib.crc32(bytes(rest), checksum) if crc else 0
    return head + block * blocks + c.compress(bytes(rest)) + c.flush(), len(header) + zeros, checksum


def _zip_file(path, members, entries=None) -> None:
    """A zip written by hand, so that it can lie: MEMBERS are (name, data as stored, size declared, crc,
    deflated); ENTRIES: the count its end record declares (default: the truth)."""
    import struct
    local, central = bytearray(), bytearray()
    for name, data, size, crc, deflate in members:
        name, method = name.encode(), 8 if deflate else 0
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, len(data), size,
                               len(name), 0, 0, 0, 0, 0, len(local)) + name
        local += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data), size,
                             len(name), 0) + name + data
    count = len(members) if entries is None else entries
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(central), len(local), 0)
    with open(path, "wb") as f:
        f.write(bytes(local + central + end))


def forge(folder, test_id, kind) -> None:
    """Write test ``test_id``'s results in FOLDER as a forger would: a ``.npz`` bomb of KIND and a JSON
    that names its arrays, or a forged JSON (and an empty ``.npz``)."""
    import json
    import os
    import struct
    import zlib

    def tensor(ref):
        return {"kind": "tensor", "ref": ref, "dtype": "float64", "requires_grad": False}

    def results(output=None, probes=None):
        data = {"test": test_id, "probes": probes if probes is not None else
                [{"status": "ok", "output": output, "inputs_after": [], "torch_functions": []}]}
        with open(os.path.join(folder, f"{test_id}.json"), "w") as f:
            json.dump(data, f)

    npz, gib3 = os.path.join(folder, f"{test_id}.npz"), 3 * 2**30
    four = _npy_header((4,))
    if kind == "inflating":  # one member, honest in every field, that inflates to 3 GiB
        _zip_file(npz, [("r0.npy", *_deflated(_npy_header((gib3 // 8,)), gib3), True)])
        results(tensor("r0"))
    elif kind == "many_arrays":  # 200 members of 2,000,000 float64 (as many as a returned tensor has): 3.0 GiB
        member = _deflated(_npy_header((2_000_000,)), 16_000_000)
        _zip_file(npz, [(f"r{i}.npy", *member, True) for i in range(200)])
        results({"kind": "tuple", "items": [tensor(f"r{i}") for i in range(200)]})
    elif kind == "lying_header":  # the .npy header says 4 elements; the member (as its zip entry says) 3 GiB
        _zip_file(npz, [("r0.npy", *_deflated(four, gib3, crc=False), True)])
        results(tensor("r0"))
    elif kind == "lying_zip_size":  # the header and the zip entry say 4 elements; the deflated data holds 3 GiB
        data, _, crc = _deflated(four, gib3, crc=False)
        _zip_file(npz, [("r0.npy", data, len(four) + 32, crc, True)])
        results(tensor("r0"))
    elif kind == "header_length":  # a version 2 .npy header that says it is 4 GiB long, then 3 GiB of zeros
        header = b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**32 - 1)
        _zip_file(npz, [("r0.npy", *_deflated(header, gib3, crc=False), True)])
        results(tensor("r0"))
    elif kind in ("many_members", "many_members_few_declared"):
        empty = _npy_header((0,))
        count = 60_000 if kind == "many_members" else 5_000  # a central directory of 3.4 MB, of 0.3 MB
        _zip_file(npz, [(f"r{i}.npy", empty, len(empty), zlib.crc32(empty), False) for i in range(count)],
                  entries=None if kind == "many_members" else 1)
        results(tensor("r0"))
    else:
        _zip_file(npz, [])
        if kind == "not_run":  # the results the grader crashed on (issue 45)
            results(probes=[{"status": "not-run"}])
        elif kind == "not_run_file":
            with open(os.path.join(folder, f"{test_id}.json"), "w") as f:
                json.dump({"status": "not-run"}, f)
        elif kind == "many_probes":  # 85,000 results: 1.96 MB, under the JSON's size bound
            results(probes=[{"status": "missing"}] * 85_000)
        else:
            depth, width, leaf = {
                "json_at_the_bounds": (1, 99_000, "{}"),  # 0.4 MB, 99,000 values: parsed, then not results
                "deep_json": (60_000, 1, "[]"),  # 1.8 MB: deeper than the JSON parser goes
                "deep_json_parsed": (900, 1, "[]"),  # parsed, deeper than the bound
                "wide_json": (1, 1_800_000, '{"kind": "python", "type": "int"}'),  # 65 MB, under the file cap
                "wide_json_parsed": (1, 500_000, "[]"),  # 1.9 MB, half a million values
            }[kind]
            output = '{"kind": "tuple", "items": [' * depth + ", ".join([leaf] * width) + "]}" * depth
            with open(os.path.join(folder, f"{test_id}.json"), "w") as f:
                f.write('{"test": "%s", "probes": [{"status": "ok", "output": %s}]}' % (test_id, output))


NPZ_BOMBS = ["inflating", "many_arrays", "lying_header", "lying_zip_size", "header_length", "many_members",
             "many_members_few_declared"]
JSON_BOMBS = ["json_at_the_bounds", "deep_json", "deep_json_parsed", "wide_json", "wide_json_parsed", "many_probes",
              "not_run", "not_run_file"]
FORGER = (_npy_header, _deflated, _zip_file, forge)


# ------------------------------------------------------------------ honest results, as the kernel writes them

def kernel_results(test_id: str, folder: Path) -> Path:
    """FOLDER/private holding test ``test_id``'s results as a grading leaves them: the reference run on
    its inputs by the kernel's own ``attn_probe.run``, taken out by ``transfer.take_results`` (a test
    of Chapter 2 whose probes have neither dependencies nor model arguments)."""
    hidden = ChapterInfo(CHAPTER).hidden()
    exchange, private = Exchange(folder / "exchange"), folder / "private"
    private.mkdir(parents=True, exist_ok=True)
    arrays: dict = {}
    calls = [wire.encode_call(i, p, {}, arrays) for i, p in enumerate(hidden.probes(test_id))]
    transfer.write_inputs(exchange.cases, test_id, calls, arrays)
    namespace: dict = {}
    exec(compile((ROOT / "solutions" / f"ch{CHAPTER}.py").read_text(), "<reference>", "exec"), namespace)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_GRADER_CASES", str(exchange.cases))
        patch.setenv("ATTN_GRADER_RESULTS", str(exchange.results))
        probe.run(test_id, namespace)
    transfer.take_results(exchange, private, test_id)
    return private


class PrivateSession:
    """What the judge reads of a grading session of Chapter 2, its results read from PRIVATE (no kernel)."""

    def __init__(self, private: Path):
        self.private, self.chapter = private, ChapterInfo(CHAPTER)
        self.hidden = self.chapter.hidden()
        self.probes = {t: self.hidden.probes(t) for t in self.chapter.tests}  # built once per process
        self.memory_rise: dict = {}

    def results(self, test_id):
        return transfer.read_results(self.private, test_id)


def session_on(private: Path) -> PrivateSession:
    return PrivateSession(private)


def outcome(session, test_id=TEST) -> tuple[float, list[str]]:
    """(score, problems) of TEST as the judge gives them from what the private folder holds."""
    found = next(o for o in cells.judge(session, {}) if o.test_id == test_id)
    return found.score, [str(p) for p in found.problems]


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    return kernel_results(TEST, tmp_path_factory.mktemp("honest"))


@pytest.fixture(scope="module")
def missing(tmp_path_factory):
    """What a test scores when it left no results."""
    private = tmp_path_factory.mktemp("missing") / "private"
    private.mkdir()
    return outcome(session_on(private))


# ------------------------------------------------------------------ bombs, measured

def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _measured(private: str) -> dict:
    """In a forked child: the peak memory rise of reading and judging TEST's results in PRIVATE. The
    child's address space may grow by 2 GiB at most, so a bomb that got through fails fast
    (a MemoryError) instead of filling the machine."""
    import warnings
    warnings.filterwarnings("ignore")
    headroom = _status("VmSize") + 2 * GIB
    resource.setrlimit(resource.RLIMIT_AS, (headroom, headroom))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    got = transfer.read_results(Path(private), TEST)
    score, problems = outcome(session_on(Path(private)))
    return {"rise": _status("VmHWM") - before, "read": got is not None, "score": score, "problems": problems}


@pytest.fixture(scope="module")
def bombs(tmp_path_factory, honest) -> dict[str, dict]:
    """Each bomb's folder, forged once; their figures and the honest one's, each measured in a child
    forked from this process after a first judging here (the reference's results computed and kept)."""
    outcome(session_on(honest))
    figures = {"honest": inprocess._in_a_child(_measured, str(honest))}
    for kind in NPZ_BOMBS + JSON_BOMBS:
        private = tmp_path_factory.mktemp(kind) / "private"
        private.mkdir()
        forge(private, TEST, kind)
        figures[kind] = inprocess._in_a_child(_measured, str(private))
        figures[kind]["bytes"] = sum(p.stat().st_size for p in private.iterdir())
        shutil.rmtree(private)
    print("\npeak memory rise of reading and judging one test's results (forked child, VmHWM):")
    for kind, f in figures.items():
        print(f"  {kind:28} {f.get('rise', 0) / MIB:8.1f} MiB  files {f.get('bytes', 0) / MIB:6.2f} MiB  "
              f"score {f.get('score')}  {f.get('error', '')}")
    return figures


# Every bomb is refused before anything of its size is made: reading it may cost little more than
# reading and judging an honest result (13 MiB on this test, most of it the judge's work). Before
# this bound, the 3 GiB ones cost 6 GiB (the .npz unpacked, then copied) and wide_json 700 MiB.
MARGIN = 16 * MIB


def test_honest_results_pass_the_bounds_and_full_marks(bombs, honest):
    assert transfer.read_results(honest, TEST) is not None
    assert outcome(session_on(honest)) == (1.0 * ChapterInfo(CHAPTER).tests[TEST], [])
    assert "error" not in bombs["honest"], bombs["honest"]


@pytest.mark.parametrize("kind", NPZ_BOMBS + JSON_BOMBS)
def test_a_bomb_stays_within_a_margin_of_honest_memory_and_scores_as_missing(bombs, missing, kind):
    figures, honest = bombs[kind], bombs["honest"]
    assert "error" not in figures, figures  # a MemoryError: the bomb got through
    assert figures["rise"] <= honest["rise"] + MARGIN, \
        f"{kind}: {figures['rise'] / MIB:.1f} MiB, honest {honest['rise'] / MIB:.1f} MiB + {MARGIN / MIB:.0f}"
    assert not figures["read"]
    assert (figures["score"], figures["problems"]) == missing


# ------------------------------------------------------------------ each bound, one step past it

def _npz(folder: Path, arrays: dict) -> None:
    np.savez(folder / f"{TEST}.npz", **arrays)


def _json(folder: Path, data) -> None:
    (folder / f"{TEST}.json").write_text(json.dumps(data))


def _one_tensor(folder: Path, array: np.ndarray, dtype: str | None = None) -> None:
    _npz(folder, {"r0": array})
    _json(folder, {"test": TEST, "probes": [{"status": "ok", "torch_functions": [], "inputs_after": [],
                                             "output": {"kind": "tensor", "ref": "r0",
                                                        "dtype": dtype or str(array.dtype)}}]})


@pytest.mark.parametrize("elements, read", [(wire.MAX_ELEMENTS, True), (wire.MAX_ELEMENTS + 1, False)])
def test_a_tensor_may_have_as_many_elements_as_the_kernel_returns_and_no_more(tmp_path, elements, read):
    _one_tensor(tmp_path, np.zeros(elements, np.float32), "float32")
    assert (transfer.read_results(tmp_path, TEST) is not None) == read


@pytest.mark.parametrize("dtype", ["object", "U3", "datetime64[s]", ">f4", "f4,i4", "V8"])
def test_only_numeric_and_bool_arrays_are_read(tmp_path, dtype):
    array = np.array([1, 2], dtype=object) if dtype == "object" else np.zeros(2, dtype)
    _one_tensor(tmp_path, array, "float32")
    assert transfer.read_results(tmp_path, TEST) is None


def test_every_allowed_dtype_comes_back_as_its_tensor(tmp_path):
    for name in results_check.DTYPES.values():
        _one_tensor(tmp_path, np.arange(6).reshape(2, 3).astype(name), name)
        value = transfer.read_results(tmp_path, TEST)[0]["value"]
        assert str(value.dtype) == f"torch.{name}" and value.shape == (2, 3), name
    _one_tensor(tmp_path, np.asfortranarray(np.arange(6.0).reshape(2, 3)), "float64")
    assert transfer.read_results(tmp_path, TEST)[0]["value"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_the_decoded_total_is_bounded(tmp_path):
    per = wire.MAX_ELEMENTS * 8
    count = results_check.MAX_DECODED_BYTES // per
    for n, read in ((count, True), (count + 1, False)):
        _npz(tmp_path, {f"r{i}": np.zeros(wire.MAX_ELEMENTS) for i in range(n)})
        _json(tmp_path, {"test": TEST, "probes": [{"status": "ok", "output": {"kind": "tuple", "items": [
            {"kind": "tensor", "ref": f"r{i}", "dtype": "float64"} for i in range(n)]}}]})
        assert (transfer.read_results(tmp_path, TEST) is not None) == read, n


def test_json_bounds(tmp_path):
    _npz(tmp_path, {})
    ok = {"status": "missing"}
    cases = {
        "size": ({"test": TEST, "probes": [ok], "pad": "x" * results_check.MAX_JSON_BYTES}, False),
        "probes": ({"test": TEST, "probes": [ok] * (results_check.MAX_PROBES + 1)}, False),
        "probes at the bound": ({"test": TEST, "probes": [ok] * results_check.MAX_PROBES}, True),
        "nodes": ({"test": TEST, "probes": [ok], "pad": [0] * results_check.MAX_NODES}, False),
        "another test's": ({"test": "test_causal_mask", "probes": [ok]}, False),
    }
    for name, (data, read) in cases.items():
        _json(tmp_path, data)
        assert (transfer.read_results(tmp_path, TEST) is not None) == read, name
    # The deepest value of a result nested in K tuples, its kind's text, is 5 + 2K levels down.
    deepest = (results_check.MAX_DEPTH - 5) // 2
    for wraps, read in ((deepest, True), (deepest + 1, False)):
        nested = {"kind": "python", "type": "int"}
        for _ in range(wraps):
            nested = {"kind": "tuple", "items": [nested]}
        _json(tmp_path, {"test": TEST, "probes": [{"status": "ok", "output": nested}]})
        assert (transfer.read_results(tmp_path, TEST) is not None) == read, wraps


def test_a_tensor_named_twice_or_not_there_is_forged(tmp_path):
    _npz(tmp_path, {"r0": np.zeros(3)})
    tensor = {"kind": "tensor", "ref": "r0", "dtype": "float64"}
    for output in ({"kind": "tuple", "items": [tensor, tensor]}, dict(tensor, ref="r1"),
                   dict(tensor, ref="../r0"), dict(tensor, ref=0)):
        _json(tmp_path, {"test": TEST, "probes": [{"status": "ok", "output": output}]})
        assert transfer.read_results(tmp_path, TEST) is None, output


def test_another_sequence_is_read_as_a_value_the_judge_cannot_compare(tmp_path, missing):
    """The kernel names another sequence by its class (``Writer.put``: a named tuple, or
    torch.return_types.max as "max"): an answer the judge reads and fails, not a test that did not run."""
    _npz(tmp_path, {"r0": np.zeros((2, 2), np.float32)})
    _json(tmp_path, {"test": TEST, "probes": [{"status": "ok", "torch_functions": [], "inputs_after": [], "output": {
        "kind": "max", "items": [{"kind": "tensor", "ref": "r0", "dtype": "float32"}]}}]})
    assert transfer.read_results(tmp_path, TEST)[0]["value"].description == "a value"
    score, problems = outcome(session_on(tmp_path))
    assert score == 0 and problems != missing[1] and "returned a value" in problems[0], problems


def test_a_member_not_named_is_never_decoded(tmp_path):
    """An array the results do not name (the kernel leaves one when a call times out after its value
    was written) is skipped, even a bomb."""
    forge(tmp_path, TEST, "lying_header")
    _json(tmp_path, {"test": TEST, "probes": [{"status": "timeout", "torch_functions": []}]})
    assert [r["status"] for r in transfer.read_results(tmp_path, TEST)] == ["timeout"]


# ------------------------------------------------------------------ the chapters' honest results fit, with room

def _honest_figures(chapters) -> dict:
    """In a forked child: each chapter's reference notebook graded in process with every test's results
    written as the kernel writes them and read back by ``transfer.read_results`` (instead of in memory);
    per chapter its score and the largest figures of one test's results."""
    import warnings
    warnings.filterwarnings("ignore")
    from coursekit.sample_submissions import submission as notebook_of
    import nbformat
    real_run, real_call = inprocess.InProcessRoute.run, probe.call_one
    folder = Path(tempfile.mkdtemp())
    figures: dict = {}

    def run(route, test_id, ns):
        written = []

        def call_one(call, arrays, namespace, writer, *rest, **options):
            written.append(real_call(call, arrays, namespace, writer, *rest, **options))
            written_arrays.update(writer.arrays)
            return written[-1]
        written_arrays: dict = {}
        probe.call_one = call_one
        try:
            real_run(route, test_id, ns)
        finally:
            probe.call_one = real_call
            np.savez(folder / f"{test_id}.npz", **written_arrays)  # as attn_probe.run writes them
            with open(folder / f"{test_id}.json", "w") as f:
                json.dump({"test": test_id, "probes": written}, f)
            route._results[test_id] = transfer.read_results(folder, test_id)
            text = (folder / f"{test_id}.json").read_bytes()
            mine = {"decoded": sum(a.nbytes for a in written_arrays.values()), "json": len(text),
                    "members": len(written_arrays), "probes": len(written),
                    "elements": max([a.size for a in written_arrays.values()] or [0])}
            for key, value in mine.items():
                figures[chapter][key] = max(figures[chapter].get(key, 0), value)  # the chapter being graded

    inprocess.InProcessRoute.run = run
    try:
        for chapter in chapters:
            figures[chapter] = {}
            path = folder / chapter / f"{chapter}.ipynb"
            path.parent.mkdir()
            nbformat.write(notebook_of(chapter=chapter), path)
            report = inprocess.grade_notebook(path)
            figures[chapter].update(score=report["score"], max_score=report["max_score"])
    finally:
        inprocess.InProcessRoute.run = real_run
        shutil.rmtree(folder)
    return figures


def test_every_chapters_reference_results_fit_the_bounds_with_room():
    """Each chapter's reference gets full marks through the bounded reader, and its largest results
    use at most a quarter of each bound (the margins the bounds were set with are 4x to 32x)."""
    from coursekit.conventions import chapter_names
    figures = inprocess._in_a_child(_honest_figures, list(chapter_names()))
    assert "error" not in figures, figures
    bounds = {"decoded": results_check.MAX_DECODED_BYTES, "json": results_check.MAX_JSON_BYTES,
              "members": results_check.MAX_MEMBERS, "probes": results_check.MAX_PROBES,
              "elements": wire.MAX_ELEMENTS}
    print()
    for chapter, f in figures.items():
        print(chapter, f)
        assert f["score"] == f["max_score"], (chapter, f)
        for key, bound in bounds.items():
            assert f[key] <= bound / 4, (chapter, key, f[key], bound)


# ------------------------------------------------------------------ fuzzing the decoder and the judge

JSON_LEAVES = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12) | \
    st.sampled_from(["ok", "error", "timeout", "missing", "not-run", "tensor", "tuple", "list", "module",
                     "python", "r0", "r1", "float32", "float64", "int64", "bool", "arg0", "forward"])
FIELDS = ["test", "probes", "status", "output", "kind", "ref", "dtype", "items", "state", "type", "shape",
          "inputs_after", "grads", "grad_error", "error", "error_message", "torch_functions", "submodules",
          "model_calls", "method", "rows", "reason", "seconds"]
JSON_TREES = st.recursive(JSON_LEAVES, lambda children: st.lists(children, max_size=4) | st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=6), children, max_size=4), max_leaves=24)
FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def fuzzed(honest):
    """A Chapter 2 session over a private folder of its own, each example's files written there, and
    the honest results' JSON and arrays to start from."""
    private = honest.parent / "fuzzed"
    private.mkdir(exist_ok=True)
    meta = json.loads((honest / f"{TEST}.json").read_text())
    with np.load(honest / f"{TEST}.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    session = session_on(private)
    outcome(session)  # the reference's results computed once, outside the examples' memory
    return session, private, meta, arrays


def _judged_without_error(fuzzed, meta=None, arrays=None, raw_json=None, raw_npz=None, missing=None):
    """Write one example's files, then read and judge them: nothing may escape, memory stays bounded,
    and results that cannot be read score what a missing result scores."""
    import tracemalloc
    session, private, *_ = fuzzed
    for path in private.iterdir():
        path.unlink()
    if raw_json is not None or meta is not None:
        (private / f"{TEST}.json").write_bytes(raw_json if raw_json is not None else json.dumps(meta).encode())
    if raw_npz is not None:
        (private / f"{TEST}.npz").write_bytes(raw_npz)
    elif arrays is not None:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        (private / f"{TEST}.npz").write_bytes(buffer.getvalue())
    tracemalloc.start()
    try:
        got = transfer.read_results(private, TEST)
        score, problems = outcome(session)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * results_check.MAX_DECODED_BYTES + 16 * MIB, peak
    assert all(isinstance(p, str) for p in problems) and 0 <= score
    if got is None and missing is not None:
        assert (score, problems) == missing
    return got


def _paths(value, prefix=()):
    """Every path into a JSON value (keys and indices)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _replaced(value, path, new):
    if not path:
        return new
    copy = list(value) if isinstance(value, list) else dict(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


def _without(value, path):
    copy = list(value) if isinstance(value, list) else dict(value)
    if len(path) == 1:
        del copy[path[0]]
    else:
        copy[path[0]] = _without(value[path[0]], path[1:])
    return copy


@FUZZ
@given(tree=JSON_TREES)
def test_fuzz_a_random_json_tree_in_place_of_the_results(fuzzed, missing, tree):
    _judged_without_error(fuzzed, meta=tree, arrays=fuzzed[3], missing=missing)
    _judged_without_error(fuzzed, meta={"test": TEST, "probes": tree}, arrays=fuzzed[3], missing=missing)
    _judged_without_error(fuzzed, meta={"test": TEST, "probes": [tree] * 4}, arrays=fuzzed[3], missing=missing)


@FUZZ
@given(data=st.data())
def test_fuzz_one_field_of_honest_results_replaced_or_removed(fuzzed, missing, data):
    meta = fuzzed[2]
    path = data.draw(st.sampled_from(list(_paths(meta))[1:]))
    forged = _without(meta, path) if data.draw(st.booleans()) else _replaced(meta, path, data.draw(JSON_TREES))
    _judged_without_error(fuzzed, meta=forged, arrays=fuzzed[3], missing=missing)


DTYPES = ["float32", "float64", "float16", "int64", "int8", "uint8", "bool", "complex64", "object", ">f4", "U2",
          "datetime64[s]", "f4,i4"]


@FUZZ
@given(data=st.data())
def test_fuzz_arrays_of_wrong_dtypes_shapes_or_missing(fuzzed, missing, data):
    _, _, meta, honest_arrays = fuzzed
    arrays = dict(honest_arrays)
    for key in data.draw(st.lists(st.sampled_from(sorted(honest_arrays)), max_size=4, unique=True)):
        action = data.draw(st.sampled_from(["dtype", "shape", "drop", "extra"]))
        if action == "drop":
            del arrays[key]
        elif action == "extra":
            arrays[f"x{key}"] = arrays[key]
        else:
            shape = data.draw(st.lists(st.integers(0, 5), max_size=4)) if action == "shape" else arrays[key].shape
            dtype = data.draw(st.sampled_from(DTYPES)) if action == "dtype" else arrays[key].dtype
            arrays[key] = (np.empty(shape, object) if dtype == "object" else np.zeros(shape, dtype))
    got = _judged_without_error(fuzzed, meta=meta, arrays=arrays, missing=missing)
    if arrays.keys() >= honest_arrays.keys() and all(arrays[k].dtype == honest_arrays[k].dtype for k in honest_arrays) \
            and all(arrays[k].shape == honest_arrays[k].shape for k in honest_arrays):
        assert got is not None


@FUZZ
@given(data=st.data())
def test_fuzz_forged_npy_headers_and_zip_fields(fuzzed, missing, data):
    """A member's .npy header, and its zip entry's sizes, CRC and compression, each forged."""
    shape = tuple(data.draw(st.lists(st.integers(0, 2**40), max_size=3)))
    descr = data.draw(st.sampled_from(["<f8", "<f4", "|b1", "|O", ">f8", "<U4", "|V16", "<M8[s]"]))
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": data.draw(st.booleans()),
                                                  "shape": shape})
    body = data.draw(st.binary(max_size=64))
    payload = header.getvalue() + body
    deflate = data.draw(st.booleans())
    stored = zlib.compress(payload)[2:-4] if deflate else payload
    size = data.draw(st.sampled_from([len(payload), 0, 2**32 - 1, len(payload) + 1])) if data.draw(st.booleans()) \
        else len(payload)
    crc = zlib.crc32(payload) if data.draw(st.booleans()) else data.draw(st.integers(0, 2**32 - 1))
    name = data.draw(st.sampled_from(["r0.npy", "r0", "../r0.npy", "r0.npy/"]))
    with tempfile.TemporaryDirectory() as folder:
        forge_zip = Path(folder) / "z.npz"
        _zip_file(forge_zip, [(name, stored, size, crc, deflate)], entries=data.draw(st.sampled_from([None, 0, 9])))
        raw = forge_zip.read_bytes()
    if data.draw(st.booleans()):  # a byte of the archive changed too
        at = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1:]
    meta = {"test": TEST, "probes": [{"status": "ok", "output": {"kind": "tensor", "ref": "r0", "dtype": "float64"}}]}
    _judged_without_error(fuzzed, meta=meta, raw_npz=raw, missing=missing)


@FUZZ
@given(json_bytes=st.binary(max_size=200), npz_bytes=st.binary(max_size=200))
def test_fuzz_random_bytes_for_either_file(fuzzed, missing, json_bytes, npz_bytes):
    meta, arrays = fuzzed[2], fuzzed[3]
    _judged_without_error(fuzzed, raw_json=json_bytes, arrays=arrays, missing=missing)
    _judged_without_error(fuzzed, meta=meta, raw_npz=npz_bytes, missing=missing)


# ------------------------------------------------------------------ the real pipeline

def forging_answer(test_id: str, kind: str) -> str:
    """The reference's answer to ``scaled_dot_product_attention`` that also forges TEST_ID's results
    (``forge``) where the kernel left them, once they are there: its test cell's visible checks call
    it after ``attn_probe.run`` wrote them. Nothing it uses is one of the grader's modules or
    tampering the static check names: only the results change."""
    reference = reference_answers(CHAPTER)["scaled_dot_product_attention"]
    return (f"UNIT = {UNIT}\n_FORGED = []\n\n" + "\n\n".join(inspect.getsource(f) for f in FORGER) + "\n\n"
            + reference.replace("def scaled_dot_product_attention(", "def _reference_answer(", 1)
            + textwrap.dedent(f"""

                def scaled_dot_product_attention(query, key, value, mask=None):
                    import os
                    folder = os.environ.get("ATTN_GRADER_RESULTS", "")
                    if not _FORGED and os.path.exists(os.path.join(folder, "{test_id}.json")):
                        _FORGED.append(True)
                        forge(folder, "{test_id}", "{kind}")
                    return _reference_answer(query, key, value, mask)
            """))


@pytest.mark.pipeline
def test_a_notebook_that_forges_its_own_results_is_graded_and_loses_only_that_test(tmp_path):
    """Sandboxed kernels whose answer overwrites one test's results after they were written, with a
    3 GiB bomb (3.1 MB on disk) or with the results the grader crashed on: each notebook is graded
    and loses that test only, as a test that did not run."""
    notebooks = {kind: submission({"scaled_dot_product_attention": forging_answer(TEST, kind)}, chapter=CHAPTER)
                 for kind in ("inflating", "not_run")}
    graded = grade_notebooks(notebooks, tmp_path)
    points = ChapterInfo(CHAPTER).tests
    for path, result in graded.items():
        assert "error" not in result, result
        lines = scores_by_test(result)
        assert result["score"] == sum(points.values()) - points[TEST], lines
        assert "this test did not run" in lines[TEST], lines[TEST]
        assert all("passed" in line for test, line in lines.items() if test != TEST), lines
