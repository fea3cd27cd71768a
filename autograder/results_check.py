"""A test's results as the kernel left them, checked before anything is decoded: bounded, and shaped as
the kernel writes them, or nothing.

The kernel writes one test's results (``attn_probe.run``): a JSON file of one result per probe
(``probe.call_one``, its values described by ``wire.Writer``) and an ``.npz`` of their tensors.
Code in the sandbox can rewrite both before the grader takes them, and the grader decodes them in
its own process, outside the sandbox's memory limit. ``transfer.MAX_RESULT_BYTES`` bounds the
bytes taken, not what they unpack to (a 3 MB ``.npz`` can hold a member that inflates to GiBs),
so this module bounds what is decoded:

* the JSON (``parsed``): at most ``MAX_JSON_BYTES`` and (by its commas, colons and brackets)
  ``MAX_NODES`` values before it is parsed, then walked without recursion: at most ``MAX_DEPTH``
  levels;
* its shape (``validated``): each result rebuilt from the fields the judge reads, each of the type
  the kernel writes, every tensor named once, at most ``MAX_PROBES`` results;
* the ``.npz`` (``arrays``): read as a zip here (no ``np.load``, no pickle), its central directory
  bounded before ``zipfile`` reads it, only the members the JSON names decoded, each a ``.npy``
  whose header (read from a stream that cannot read further) gives an allowed dtype, at most
  ``wire.MAX_ELEMENTS`` elements and the very size its zip entry declares, inflated up to that size
  and no further; all of them together at most ``MAX_DECODED_BYTES``.

Anything else is ``Malformed``: the test's results count as missing ("did not run"), never an error
of the grading. The bounds leave room for every chapter's honest results (measured on the
reference notebooks of chapters 1-8, see each bound) and are checked against them by
``tests/test_exchange_bombs.py``.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
import zipfile

import numpy as np

from .sandboxed import wire

# Honest maxima of one test's results, over the reference notebooks of chapters 1-8 and the 267
# correct styles and judged mistakes of their catalogs: decoded tensors 8.0 MiB (chapter 6; arrays
# of at most 262,160 elements, 1.0 MiB), JSON 74.7 KB, 3,603 JSON values and 48 model calls
# (chapter 5, a correct greedy decoder), 588 arrays and 8 probes (chapter 5), 11 levels (chapter 7).
MAX_DECODED_BYTES = 64 * 2**20  # 8x the largest; np.savez stores its members, so an honest .npz under
                                # transfer.MAX_RESULT_BYTES never decodes to more
MAX_JSON_BYTES = 2 * 2**20      # 28x the largest
MAX_NODES = 100_000             # 28x
MAX_DEPTH = 48                  # 4x
MAX_PROBES = 256                # 32x
MAX_MEMBERS = 4096              # 7x
MAX_TEXT = 2000                 # an error as the judge quotes it (the kernel cuts it to about 450)
MAX_NAME = 1000                 # a type's, a function's or a parameter's name
_DIRECTORY_ENTRY = 46 + 68 + 46  # a central directory entry: fixed part, the longest name allowed, slack
MAX_DIRECTORY_BYTES = MAX_MEMBERS * _DIRECTORY_ENTRY
MAX_HEADER_BYTES = 4096         # a .npy header (numpy writes 128 for the shapes the kernel returns)
_CHUNK = 1 << 20

_REF = re.compile(r"[A-Za-z0-9_]{1,64}")
STATUSES = ("ok", "error", "timeout", "missing")
# numpy's name -> torch's, for every dtype a tensor may come back in: numeric and bool, in this
# machine's byte order (the kernel's).
DTYPES = {np.dtype(name).str: name for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}


class Malformed(ValueError):
    """Results no honest kernel writes, or past a bound."""


# ------------------------------------------------------------------ the JSON

def parsed(path) -> object:
    """The JSON at ``path``, refused before it is parsed if it is too large, and after if too deep or too wide."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size > MAX_JSON_BYTES:
            raise Malformed("results JSON too large")
        text = f.read(MAX_JSON_BYTES + 1)
    if len(text) > MAX_JSON_BYTES:
        raise Malformed("results JSON too large")
    # Every value but the first follows a comma, a colon or an opening bracket: at most this many
    # values (more when strings hold them), counted before parsing makes them (2 MiB of "[]," would
    # be 700,000 lists, 60 MB).
    if 1 + text.count(b",") + text.count(b":") + text.count(b"[") > MAX_NODES:
        raise Malformed("results JSON too wide")
    value = json.loads(text)  # the C parser stops itself past about a thousand levels (RecursionError)
    stack, nodes = [(value, 1)], 0
    while stack:
        item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES or depth > MAX_DEPTH:
            raise Malformed("results JSON too wide or too deep")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value


def validated(meta, test_id: str) -> tuple[list[dict], set[str]]:
    """The results of test ``test_id`` from its parsed JSON, each rebuilt from the fields the kernel
    writes (``probe.call_one``) that the judge reads (``judge.verdict``, ``judge.cells``), each of its
    type; and the names of the arrays they refer to. Raises ``Malformed`` for anything else: an
    unknown status, a field missing or of the wrong type, a tensor named twice, another test's
    results. (The calls of model arguments are the grader's own record, ``session.with_model_calls``.)"""
    meta = _dict(meta)
    if meta.get("test") != test_id:
        raise Malformed("results of another test")
    probes = _list(meta.get("probes"))
    if len(probes) > MAX_PROBES:
        raise Malformed("too many results")
    refs: set[str] = set()
    return [_result(r, refs) for r in probes], refs


def _result(raw, refs: set) -> dict:
    raw = _dict(raw)
    status = raw.get("status")
    if status not in STATUSES:
        raise Malformed("unknown status")
    out: dict = {"status": status, "torch_functions": _names(raw.get("torch_functions", []))}
    if "submodules" in raw:
        out["submodules"] = _names(raw["submodules"])
    if status == "error":
        out["error"] = _text(raw.get("error"))
        if "error_message" in raw:
            out["error_message"] = _text(raw["error_message"])
    if status == "ok":
        if "output" not in raw:
            raise Malformed("a result without its output")
        out["output"] = _described(raw["output"], refs)
        out["inputs_after"] = [None if d is None else _described(d, refs) for d in _list(raw.get("inputs_after", []))]
        if "grads" in raw:
            out["grads"] = {_name(k): _described(v, refs) for k, v in _dict(raw["grads"]).items()}
        if "grad_error" in raw:
            out["grad_error"] = _text(raw["grad_error"])
        seconds = raw.get("seconds")
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds):
            out["seconds"] = float(seconds)
    return out


def _described(desc, refs: set) -> dict:
    """A returned value's description (``wire.Writer.put``), rebuilt from its known fields."""
    desc = _dict(desc)
    kind = desc.get("kind")
    if kind == "tensor":
        ref = desc.get("ref")
        if not isinstance(ref, str) or not _REF.fullmatch(ref) or ref in refs:
            raise Malformed("a tensor's name is missing, malformed or used twice")
        refs.add(ref)
        return {"kind": kind, "ref": ref, "dtype": _name(desc.get("dtype")),
                "requires_grad": desc.get("requires_grad") is True}
    if kind in ("tuple", "list"):
        return {"kind": kind, "items": [_described(d, refs) for d in _list(desc.get("items"))]}
    if kind == "module":
        return {"kind": kind, "type": _name(desc.get("type")),
                "state": {_name(k): _described(v, refs) for k, v in _dict(desc.get("state")).items()}}
    if kind == "tensor-too-large":
        shape = _list(desc.get("shape"))
        if not all(type(n) is int and n >= 0 for n in shape):
            raise Malformed("a shape that is not a list of sizes")
        return {"kind": kind, "shape": shape}
    if kind in ("tensor-subclass", "python", "other"):
        return {"kind": kind, "type": _name(desc.get("type"))}
    # Another sequence (a named tuple, torch.return_types.max) is described by its class's name: the
    # judge reads it as a value it cannot compare, its items unread.
    return {"kind": _name(kind)}


def _dict(value) -> dict:
    if not isinstance(value, dict):
        raise Malformed("not an object")
    return value


def _list(value) -> list:
    if not isinstance(value, list):
        raise Malformed("not a list")
    return value


def _text(value) -> str:
    if not isinstance(value, str):
        raise Malformed("not a string")
    return value[:MAX_TEXT]


def _name(value) -> str:
    if not isinstance(value, str):
        raise Malformed("not a string")
    return value[:MAX_NAME]


def _names(value) -> list[str]:
    return [_name(v) for v in _list(value)]


# ------------------------------------------------------------------ the .npz

def arrays(path, wanted: set[str]) -> dict[str, np.ndarray]:
    """The arrays named ``wanted`` from the ``.npz`` at ``path``, decoded within the bounds (module doc)."""
    with open(path, "rb") as f:
        _check_directory(f)
        with zipfile.ZipFile(f) as zf:
            members = zf.infolist()
            names = [m.filename for m in members]
            if len(members) > MAX_MEMBERS or len(set(names)) != len(names):
                raise Malformed("too many or repeated members")
            if not all(n.endswith(".npy") and _REF.fullmatch(n[:-4]) for n in names):
                raise Malformed("a member's name is not an array's")
            by_name = {m.filename[:-4]: m for m in members}
            if not wanted <= by_name.keys():
                raise Malformed("an array the results name is not there")
            chosen = [by_name[k] for k in sorted(wanted)]  # the others are never read
            for m in chosen:
                if m.flag_bits & 0x1 or m.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise Malformed("an encrypted member or an unknown compression")
            # What the entries declare, before inflating anything (each is checked against its header below).
            if sum(m.file_size for m in chosen) > MAX_DECODED_BYTES + len(chosen) * MAX_HEADER_BYTES:
                raise Malformed("the arrays decode to more than allowed")
            decoded, out = 0, {}
            for m in chosen:
                with zf.open(m) as stream:
                    shape, fortran_order, dtype = _header(stream, m.file_size)
                    size = math.prod(shape) * dtype.itemsize
                    decoded += size
                    if decoded > MAX_DECODED_BYTES:
                        raise Malformed("the arrays decode to more than allowed")
                    flat = _filled(stream, np.empty(math.prod(shape), dtype))
                out[m.filename[:-4]] = (flat.reshape(shape[::-1]).transpose() if fortran_order
                                        else flat.reshape(shape))
            return out


def _check_directory(f) -> None:
    """Bound what ``zipfile`` reads before it reads it: the end record must close the file (no comment,
    as zipfile then takes the same record) and the central directory it announces be small."""
    size = os.fstat(f.fileno()).st_size
    if size < 22:
        raise Malformed("not a zip")
    f.seek(size - 22)
    end = f.read(22)
    signature, _, _, _, entries, directory, _, comment = struct.unpack("<4s4H2LH", end)
    if signature != b"PK\x05\x06" or comment:
        raise Malformed("a zip whose end record is not last")
    if size >= 42:
        f.seek(size - 42)
        if f.read(4) == b"PK\x06\x07":  # a zip64 locator: the directory's size would be read from elsewhere
            raise Malformed("a zip64 archive")
    if entries > MAX_MEMBERS or directory > MAX_DIRECTORY_BYTES:
        raise Malformed("a central directory too large")
    f.seek(0)


class _Bounded:
    """A stream that refuses to read past ``limit`` bytes (numpy's header reader reads what the header
    claims: up to 4 GiB for a version 2 header)."""

    def __init__(self, stream, limit: int):
        self.stream, self.left = stream, limit

    def read(self, n: int = -1) -> bytes:
        if n < 0 or n > self.left:
            raise Malformed("a .npy header longer than allowed")
        data = self.stream.read(n)
        self.left -= len(data)
        return data


def _header(stream, declared: int) -> tuple[tuple, bool, np.dtype]:
    """(shape, fortran_order, dtype) of a ``.npy`` member from its header, read from a stream that cannot
    read past ``MAX_HEADER_BYTES``: an allowed dtype, at most ``wire.MAX_ELEMENTS`` elements, and
    header and data together exactly the size the zip entry declares."""
    fmt = np.lib.format
    header = _Bounded(stream, MAX_HEADER_BYTES)
    version = fmt.read_magic(header)
    read_header = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
    if read_header is None:
        raise Malformed("an unknown .npy version")
    shape, fortran_order, dtype = read_header(header, max_header_size=MAX_HEADER_BYTES)
    if dtype.str not in DTYPES or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise Malformed("a dtype that is not numeric or bool")
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise Malformed("a malformed shape")
    if math.prod(shape) > wire.MAX_ELEMENTS:
        raise Malformed("an array with more elements than the kernel returns")
    if MAX_HEADER_BYTES - header.left + math.prod(shape) * dtype.itemsize != declared:
        raise Malformed("a member whose size is not what its header says")
    return shape, bool(fortran_order), dtype


def _filled(stream, flat: np.ndarray) -> np.ndarray:
    """FLAT (one dimension) with its data read from STREAM in bounded chunks, then nothing more (at the
    end of a member zipfile checks its CRC)."""
    view = memoryview(flat.view(np.uint8))
    at = 0
    while at < len(view):
        chunk = stream.read(min(_CHUNK, len(view) - at))
        if not chunk:
            raise Malformed("a member shorter than its header says")
        view[at:at + len(chunk)] = chunk
        at += len(chunk)
    if stream.read(1):
        raise Malformed("a member longer than its header says")
    return flat
