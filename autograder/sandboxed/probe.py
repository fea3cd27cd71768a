"""Kernel side of the hidden tests (imported in the kernel as ``attn_probe``).

A hidden test cell calls ``run(test_id, globals())``. The grader has just written the
cases for that test (inputs only, never expected values) to ``$ATTN_GRADER_CASES``;
this module calls the submitted code on them and writes what came back to
``$ATTN_GRADER_RESULTS``. All comparisons happen later, in the grader's own process,
which never runs submitted code: nothing done here can award points by itself.

``call_one`` is the one routine that calls submitted code on a probe, ``call_all`` the one
that calls a test's probes in order, and ``stop_after_a_timeout`` the one rule that ends the
cells after a call ran out of time: the kernel runs them from ``run``, and the grader's tools
(the mutation benchmark, the in-process catalog tier, the protocol tests) run the very same
routines in process through ``autograder.inprocess``.
The format of what it reads and writes is ``wire`` (``attn_wire`` in the kernel).
"""
import contextlib
import json
import os
import signal
import time
import traceback

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

try:
    from . import standin, wire   # in the grader's process: autograder.sandboxed.probe
except ImportError:
    import attn_standin as standin  # in the kernel: top-level modules beside attn_probe
    import attn_wire as wire


class ProbeTimeout(BaseException):
    """Raised inside submitted code that runs past its time limit."""


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


class _Tensors:
    """The arrays of a call, as tensors, by key."""

    def __init__(self, arrays):
        self.arrays = arrays

    def __getitem__(self, key):
        return wire.tensor(self.arrays, key)


def _stand_ins(call, ns, client):
    """Put the given exercises' stand-ins in ``ns``; what they replaced, to put back."""
    saved = {}
    for name, info in ((call.get("deps") or {}).get("given") or {}).items():
        saved[name] = ns.get(name, _MISSING)
        if info.get("kind") == "class":
            ns[name] = standin.module_class(client, name, info.get("methods", ["forward"]))
        else:
            ns[name] = standin.function(client, name)
    return saved


def _error_text(err):
    tb = traceback.extract_tb(err.__traceback__)
    where = ""
    for frame in reversed(tb):  # innermost frame of submitted code
        if frame.filename.startswith("<ipython-input") or "ipykernel_" in frame.filename:
            where = f" (line {frame.lineno}: {frame.line.strip()[:120]})" if frame.line else ""
            break
    message = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    return f"{type(err).__name__}: {message}{where}" if message else f"{type(err).__name__}{where}"


def _on_alarm(signum, frame):
    raise ProbeTimeout()


# A call's limit counts processor time (user and system, all its threads): a busy machine, or a
# class run with more workers than cores, slows a correct call down but does not time it out. A
# call that waits instead of computing (a sleep, a lock) is stopped on the clock, after this many
# times its limit.
WAITING_FACTOR = 3
_TIMERS = ((signal.ITIMER_PROF, signal.SIGPROF, 1), (signal.ITIMER_REAL, signal.SIGALRM, WAITING_FACTOR))


def call_one(probe, arrays, ns, writer, connect=None):
    """Call the submitted code in ``ns`` on one probe (a ``wire`` call); the result (a ``wire`` result).

    connect: address -> the stand-in client (``standin.Client``, the kernel's socket; in the
    grader's tools, a client answered in that process)."""
    client = (connect or standin.Client)(probe["standins"]) if probe.get("standins") else None
    deps_saved = _stand_ins(probe, ns, client) if client is not None else {}
    recorder = _Recorder()
    try:
        with _time_limit(float(probe.get("time_limit", 10))):
            try:
                target = ns.get(probe["target"], _MISSING)
                if target is _MISSING:
                    return {"status": "missing"}
                result = _called(target, probe, arrays, writer, client, recorder)
            except ProbeTimeout:
                result = {"status": "timeout"}
            except Exception as err:  # noqa: BLE001
                result = {"status": "error", "error": _error_text(err)}
                if probe.get("expects_error"):  # the judge reads the message itself (e.g. does it name a key?)
                    result["error_message"] = str(err)[:1000]
    finally:
        _put_back(ns, deps_saved)
        if client is not None:
            client.close()
    result["torch_functions"] = sorted(recorder.names)
    return result


@contextlib.contextmanager
def _time_limit(seconds):
    """``ProbeTimeout`` raised in the code that runs past SECONDS of processor time (or
    ``WAITING_FACTOR`` times that on the clock); the alarms put back as they were after."""
    handlers = [signal.signal(number, _on_alarm) for _, number, _ in _TIMERS]
    for timer, _, factor in _TIMERS:
        signal.setitimer(timer, seconds * factor)
    try:
        yield
    finally:
        for (timer, number, _), handler in zip(_TIMERS, handlers):
            signal.setitimer(timer, 0)
            signal.signal(number, handler)


def _put_back(ns, saved):
    """Undo ``_stand_ins``: each name as it was before the call (or gone, if it was not there)."""
    for name, value in saved.items():
        if value is _MISSING:
            ns.pop(name, None)
        else:
            ns[name] = value


def _called(target, probe, arrays, writer, client, recorder) -> dict:
    """The probe's call of ``target`` (a function, or a class to construct first) and what it gave."""
    result = {"status": "ok"}
    tensors = _Tensors(arrays)

    def build_model(desc, _arrays):
        return standin.model(client, desc["tree"], tensors, desc["handle"])
    args = [wire.decode_value(a, arrays, build_model) for a in probe["args"]]
    kwargs = {k: wire.decode_value(v, arrays, build_model) for k, v in probe["kwargs"].items()}
    for i in probe.get("grad_args", []):
        args[i].requires_grad_(True)
    params = {}
    if probe.get("init") is not None:
        target, params = _constructed(target, probe, arrays, result)
    started = time.perf_counter()
    with recorder:
        out = target(*args, **kwargs)
    result["seconds"] = time.perf_counter() - started
    result["output"] = writer.put(out)
    # The inputs as they are after the call: the grader compares them with what it sent.
    result["inputs_after"] = [writer.put(a) if isinstance(a, (torch.Tensor, torch.nn.Module)) else None
                              for a in args]
    result.update(_gradients(out, args, params, probe, arrays, writer))
    return result


def _constructed(cls, probe, arrays, result):
    """The module the probe builds (seeded, in its dtype, its state copied in, in train or eval
    mode): the method to call, and the parameters whose gradients the probe asks for. Its
    submodules' class names go into ``result``."""
    torch.manual_seed(0)
    obj = cls(**probe["init"])
    if probe.get("dtype"):
        obj = obj.to(getattr(torch, probe["dtype"]))
    with torch.no_grad():
        for name, ref in probe.get("state", {}).items():
            obj.get_parameter(name).copy_(wire.tensor(arrays, ref))
    params = {name: obj.get_parameter(name) for name in probe.get("state", {})}
    if hasattr(obj, "modules"):
        result["submodules"] = sorted({type(m).__name__ for m in obj.modules()})
    if probe.get("train") is not None and hasattr(obj, "train"):
        obj.train(probe["train"])
    return getattr(obj, probe.get("method") or "forward"), params


def _gradients(out, args, params, probe, arrays, writer) -> dict:
    """``{"grads": ...}``: the gradients of the output against the probe's cotangents, by input
    and by parameter (``{"grad_error": ...}`` if backward failed; nothing without cotangents)."""
    cotangents = [wire.tensor(arrays, c) for c in probe.get("cotangents", [])]
    if not cotangents:
        return {}
    outs = out if isinstance(out, (tuple, list)) else (out,)
    try:
        loss = sum((o * c).sum() for o, c in zip(outs, cotangents)
                   if isinstance(o, torch.Tensor) and o.requires_grad)
        if isinstance(loss, torch.Tensor):
            loss.backward()
        grads = {f"arg{i}": args[i].grad for i in probe.get("grad_args", [])}
        grads.update({f"param:{n}": p.grad for n, p in params.items()})
        return {"grads": {k: writer.put(g) for k, g in grads.items()}}
    except Exception as err:  # noqa: BLE001 - reported, judged outside
        return {"grad_error": _error_text(err)}


def call_all(probes, arrays, ns, writer, connect=None) -> list[dict]:
    """``call_one`` of each of a test's probes, in order. A call that runs out of time ends the
    test: the same code would loop again, so the calls after it are left unrun (a shorter list)."""
    results = []
    for probe in probes:
        results.append(call_one(probe, arrays, ns, writer, connect))
        if results[-1]["status"] == "timeout":
            break
    return results


def stop_after_a_timeout(test_id, results, timed_out):
    """Once a call of this notebook has run past its time limit (``timed_out``: the tests it
    happened in, this one's RESULTS added), end this test's cell and every later one's: their
    visible checks earn nothing (the verdicts come from the results) and would likely call the
    looping code again, costing a cell time limit each."""
    if any(r["status"] == "timeout" for r in results):
        timed_out.append(test_id)
    if timed_out:
        raise SystemExit("a call ran past its time limit")


_MISSING = object()
# Tests in which a call of this kernel ran past its time limit.
_TIMED_OUT = []


def run(test_id, ns):
    cases_dir, results_dir = os.environ["ATTN_GRADER_CASES"], os.environ["ATTN_GRADER_RESULTS"]
    with open(os.path.join(cases_dir, f"{test_id}.json")) as f:
        spec = json.load(f)
    with np.load(os.path.join(cases_dir, f"{test_id}.npz"), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    writer = wire.Writer("r")
    results = call_all(spec["probes"], arrays, ns, writer)
    np.savez(os.path.join(results_dir, f"{test_id}.npz"), **writer.arrays)
    with open(os.path.join(results_dir, f"{test_id}.json"), "w") as f:
        json.dump({"test": test_id, "probes": results}, f)
    stop_after_a_timeout(test_id, results, _TIMED_OUT)
