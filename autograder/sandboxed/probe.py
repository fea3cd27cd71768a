"""Kernel side of the hidden tests (imported in the kernel as ``attn_probe``).

A hidden test cell calls ``run(test_id, globals())``. The grader has just written the
cases for that test (inputs only, never expected values) to ``$ATTN_GRADER_CASES``;
this module calls the submitted code on them and writes what came back to
``$ATTN_GRADER_RESULTS``. All comparisons happen later, in the grader's own process,
which never runs submitted code: nothing done here can award points by itself.

``call_one`` is the one routine that calls submitted code on a probe: the kernel runs it
from ``run``, and the grader's tools (the mutation benchmark, the in-process catalog tier,
the protocol tests) run the very same routine in process through ``autograder.inprocess``.
The format of what it reads and writes is ``wire`` (``attn_wire`` in the kernel).
"""
import json
import os
import signal
import time
import traceback

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

try:
    from . import wire            # in the grader's process: autograder.sandboxed.probe
except ImportError:
    import attn_wire as wire      # in the kernel: a top-level module beside attn_probe


class ProbeTimeout(BaseException):
    """Raised inside submitted code that runs past its time limit."""


class _Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


def _model(desc, arrays):
    """A model argument: the reference class, built here with the parameters the grader sent."""
    env = {"__name__": "attn_reference_model"}
    exec(compile(desc["source"], "<reference model>", "exec"), env)
    torch.manual_seed(0)
    model = env[desc["name"]](**desc["init"])
    if desc.get("dtype"):
        model = model.to(getattr(torch, desc["dtype"]))
    with torch.no_grad():
        for name, ref in desc["state"].items():
            model.get_parameter(name).copy_(wire.tensor(arrays, ref))
    _record_calls(model)
    return model.eval()


_MODEL_CALLS = []  # this probe's calls of its model arguments' methods, for the judge (plain data)
RECORDED_METHODS = ("forward", "encode", "decode")


def _record_calls(model):
    """Note every call of the model's forward, encode, decode and out, with the batch rows it got."""
    def rows(args, kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        return int(first.shape[0]) if first is not None and first.dim() else None

    def wrap(name, method):
        def recorded(*args, **kwargs):
            _MODEL_CALLS.append({"method": name, "rows": rows(args, kwargs)})
            return method(*args, **kwargs)
        return recorded

    for name in RECORDED_METHODS:
        if callable(getattr(model, name, None)):
            object.__setattr__(model, name, wrap(name, getattr(model, name)))  # instance attribute
    out = getattr(model, "out", None)
    if isinstance(out, torch.nn.Module):
        out.register_forward_pre_hook(
            lambda module, args: _MODEL_CALLS.append({"method": "out", "rows": rows(args, {})}))


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


def call_one(probe, arrays, ns, writer):
    """Call the submitted code in ``ns`` on one probe (a ``wire`` call); the result (a ``wire`` result)."""
    result = {"status": "ok"}
    deps_saved = {}
    deps = probe.get("deps") or {}
    if deps:
        env = {"__name__": "attn_reference_dependency"}
        exec(compile(deps["source"], "<reference dependencies>", "exec"), env)
        for name in deps["names"]:
            deps_saved[name] = ns.get(name, _MISSING)
            ns[name] = env[name]
    recorder = _Recorder()
    _MODEL_CALLS.clear()
    limit = float(probe.get("time_limit", 10))
    handlers = [signal.signal(number, _on_alarm) for _, number, _ in _TIMERS]
    for timer, _, factor in _TIMERS:
        signal.setitimer(timer, limit * factor)
    try:
        target = ns.get(probe["target"], _MISSING)
        if target is _MISSING:
            return {"status": "missing"}
        args = [wire.decode_value(a, arrays, _model) for a in probe["args"]]
        kwargs = {k: wire.decode_value(v, arrays, _model) for k, v in probe["kwargs"].items()}
        for i in probe.get("grad_args", []):
            args[i].requires_grad_(True)
        params = {}
        if probe.get("init") is not None:
            torch.manual_seed(0)
            obj = target(**probe["init"])
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
            target = getattr(obj, probe.get("method") or "forward")
        started = time.perf_counter()
        with recorder:
            out = target(*args, **kwargs)
        result["seconds"] = time.perf_counter() - started
        if wire.has_model_argument(probe):
            result["model_calls"] = list(_MODEL_CALLS)
        result["output"] = writer.put(out)
        # The inputs as they are after the call: the grader compares them with what it sent.
        result["inputs_after"] = [writer.put(a) if isinstance(a, (torch.Tensor, torch.nn.Module)) else None
                                  for a in args]
        cotangents = [wire.tensor(arrays, c) for c in probe.get("cotangents", [])]
        if cotangents:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            try:
                loss = sum((o * c).sum() for o, c in zip(outs, cotangents)
                           if isinstance(o, torch.Tensor) and o.requires_grad)
                if isinstance(loss, torch.Tensor):
                    loss.backward()
                grads = {f"arg{i}": args[i].grad for i in probe.get("grad_args", [])}
                grads.update({f"param:{n}": p.grad for n, p in params.items()})
                result["grads"] = {k: writer.put(g) for k, g in grads.items()}
            except Exception as err:  # noqa: BLE001 - reported, judged outside
                result["grad_error"] = _error_text(err)
    except ProbeTimeout:
        result = {"status": "timeout"}
    except Exception as err:  # noqa: BLE001
        result = {"status": "error", "error": _error_text(err)}
        if probe.get("expects_error"):  # the judge reads the message itself (e.g. does it name a key?)
            result["error_message"] = str(err)[:1000]
    finally:
        for (timer, number, _), handler in zip(_TIMERS, handlers):
            signal.setitimer(timer, 0)
            signal.signal(number, handler)
        for name, saved in deps_saved.items():
            if saved is _MISSING:
                ns.pop(name, None)
            else:
                ns[name] = saved
    result["torch_functions"] = sorted(recorder.names)
    return result


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
    results = []
    for probe in spec["probes"]:
        outcome = call_one(probe, arrays, ns, writer)
        results.append(outcome)
        if outcome["status"] == "timeout":
            break  # the same code would loop again: leave the rest unrun
    np.savez(os.path.join(results_dir, f"{test_id}.npz"), **writer.arrays)
    with open(os.path.join(results_dir, f"{test_id}.json"), "w") as f:
        json.dump({"test": test_id, "probes": results}, f)
    if any(r["status"] == "timeout" for r in results):
        _TIMED_OUT.append(test_id)
    if _TIMED_OUT:
        # Skip the visible checks below, in this test and every later one: they earn nothing (the
        # verdicts come from the results above) and would likely call the looping code again,
        # costing a cell time limit each.
        raise SystemExit("a call ran past its time limit")
