"""The reference, answering the kernel's calls of given exercises, in a process of its own.

When a test grades an exercise on its own, the exercises it uses and its model arguments
are the reference's: the kernel holds only stand-ins (``sandboxed.standin``), and each of
their calls comes here as data. ``Answerer`` runs the reference on it, for one test at a
time and only for the names that test may use (its dependencies whose own tests have run,
its model arguments), and notes how each model argument was called: that record is the
grader's, not the kernel's. ``StandInService`` runs an ``Answerer`` in a child forked from
the grading process, behind a Unix socket in the exchange folder, under memory and
processor limits of its own: whatever a submission sends, the grading process neither
allocates nor computes it.
"""
from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import socket
import struct
from pathlib import Path

import torch

from .sandboxed import standin as S
from .sandboxed.wire import ModelArg

MAX_REQUESTS = 50_000      # calls of one test
MAX_KEPT_GRAPHS = 4_000    # calls of one test whose gradients may still be asked for
MAX_HANDLES = 2_000        # given modules built in one test
MAX_RECORDS = 10_000       # calls of one model argument noted
MEMORY = 3 * 2**30         # bytes the answering process may add to what it had when forked
PROCESSOR_SECONDS = 600    # processor seconds it may use in one grading
REPLY_SECONDS = 30         # how long the grader waits for it to start or end a test


def model_arguments(probes):
    """(handle, probe index, ModelArg) for every model argument of a test, in the order the
    grader encodes them (``wire.encode_call``)."""
    found = []
    for index, probe in enumerate(probes):
        for value in values_in([*probe.args, *probe.kwargs.values()]):
            if isinstance(value, ModelArg):
                found.append((f"m{index}.{sum(1 for f in found if f[1] == index)}", index, value))
    return found


def values_in(values):
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from values_in(value)
        elif isinstance(value, dict):
            yield from values_in(value.values())
        else:
            yield value


def methods_of(cls) -> list[str]:
    """The methods a stand-in of ``cls`` answers: those its own classes define (not torch's)."""
    if cls.__module__.startswith("torch."):
        return ["forward"] if "forward" in dir(cls) else []
    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("torch.") or klass is object:
            continue
        names |= {n for n, v in vars(klass).items() if callable(v) and not n.startswith("_")}
    return sorted(names | ({"forward"} if "forward" in dir(cls) else set()))


def given(reference, names) -> dict:
    """How the kernel stands in for each given exercise: a function, or a class and its methods."""
    out = {}
    for name in names:
        value = getattr(reference, name)
        if isinstance(value, type) and issubclass(value, torch.nn.Module):
            out[name] = {"kind": "class", "methods": methods_of(value)}
        else:
            out[name] = {"kind": "function"}
    return out


def describe(module: torch.nn.Module, put) -> dict:
    """A module as a stand-in tree: each submodule's type, methods and plain attributes, each
    parameter and buffer by name (``put(tensor)`` stores its value and says where), tied names;
    never code."""
    tree = {"modules": {}, "params": {}, "buffers": {}, "nonpersistent": [], "tied": {}}
    for path, sub in module.named_modules(remove_duplicate=False):
        tree["modules"][path] = {"type": type(sub).__name__, "methods": methods_of(type(sub)),
                                 "attrs": _plain_attributes(sub), "training": sub.training}
        prefix = f"{path}." if path else ""
        tree["nonpersistent"] += [prefix + n for n in sub._non_persistent_buffers_set]
    first: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tree["tied"][name] = first[id(p)]
            continue
        first[id(p)] = name
        tree["params"][name] = put(p.detach())
    for name, b in module.named_buffers(remove_duplicate=False):
        tree["buffers"][name] = put(b.detach())
    return tree


def _plain_attributes(module) -> dict:
    out = {}
    for key, value in vars(module).items():
        if key.startswith("_") or key == "training":
            continue
        try:
            packer = S.Packer()
            encoded = packer.put(value)
        except S.StandInError:
            continue
        if not packer.tensors and len(json.dumps(encoded)) < 10_000:
            out[key] = encoded
    return out


class _Method(torch.nn.Module):
    """One method of a module, as a module's forward (``functional_call`` calls only forward)."""

    def __init__(self, inner, method):
        super().__init__()
        self.inner, self.method = inner, method

    def forward(self, *args, **kwargs):
        return getattr(self.inner, self.method)(*args, **kwargs)


class Answerer:
    """Answers stand-in requests (``sandboxed.standin`` frames) with the reference."""

    def __init__(self, hidden):
        self.hidden, self.reference = hidden, hidden.reference
        self.test_id, self.allowed = None, {}
        self.handles: dict[str, torch.nn.Module] = {}
        self.models: dict[str, int] = {}  # model argument handle -> its probe's index
        self.records: dict[str, list] = {}
        self.graphs: dict[int, tuple] = {}
        self.requests = 0
        self._next = 0

    # ---------------------------------------------------------- a test's scope
    def begin(self, test_id: str, deps, probes=None) -> None:
        """Answer for ``test_id``: the given exercises ``deps`` and the model arguments of its
        probes (default: the test's, as ``HiddenTests.probes`` builds them)."""
        self.end()
        self.test_id = test_id
        self.allowed = {name: info["kind"] for name, info in given(self.reference, deps).items()}
        for handle, index, arg in model_arguments(self.hidden.probes(test_id) if probes is None else probes):
            self.handles[handle], self.models[handle] = arg.module, index
            self.records[handle] = []

    def end(self) -> dict[int, list]:
        """Close the test's scope; probe index -> the calls of its model arguments, in order."""
        by_probe: dict[int, list] = {}
        for handle, index in self.models.items():
            by_probe.setdefault(index, []).extend(self.records.get(handle, []))
        self.test_id, self.allowed = None, {}
        self.handles, self.models, self.records, self.graphs = {}, {}, {}, {}
        self.requests = 0
        return by_probe

    # ---------------------------------------------------------- one request
    def answer(self, data: bytes) -> bytes:
        """The reply to one request frame; errors are replies too, named without any source line."""
        try:
            header, arrays = S.unframe(data)
            self.requests += 1
            if self.test_id is None or self.requests > MAX_REQUESTS:
                raise PermissionError("no given exercise can be called here")
            reply, tensors = self._dispatch(header, [S.as_tensor(a) for a in arrays])
            return S.frame(reply, [S.as_array(t) for t in tensors])
        except Exception as err:  # noqa: BLE001 - told to the kernel as its call's error
            text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
            return S.frame({"error": f"{type(err).__name__}: {text}" if text else type(err).__name__}, [])

    def _dispatch(self, header, tensors):
        op = header.get("op")
        if op == "construct":
            return self._construct(header)
        if op == "call":
            return self._call(header, tensors)
        if op == "backward":
            return self._backward(header, tensors)
        raise ValueError("an unknown request")

    def _construct(self, header):
        name = header.get("class")
        if self.allowed.get(name) != "class" or len(self.handles) >= MAX_HANDLES:
            raise PermissionError(f"{name} is not given in this test")
        args, kwargs = S.unpack(header.get("args"), []), S.unpack(header.get("kwargs"), [])
        torch.manual_seed(0)
        module = getattr(self.reference, name)(*args, **kwargs)
        handle = f"c{self._next}"
        self._next += 1
        self.handles[handle] = module
        tensors: list = []
        return {"handle": handle, "tree": describe(module, lambda t: tensors.append(t) or len(tensors) - 1)}, tensors

    def _call(self, header, tensors):
        count = header.get("arrays")
        names = header.get("state")
        if not isinstance(count, int) or not isinstance(names, list) or count + len(names) != len(tensors):
            raise ValueError("a malformed call")
        grad = bool(header.get("grad"))
        if grad:
            tensors = [t.requires_grad_(True) if t.is_floating_point() else t for t in tensors]
        args = S.unpack(header.get("args"), tensors[:count])
        kwargs = S.unpack(header.get("kwargs"), tensors[:count])
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError("a malformed call")
        target, restore = self._target(header, dict(zip(names, tensors[count:])))
        try:
            with torch.enable_grad() if grad else torch.no_grad():
                out = target(*args, **kwargs)
        finally:
            restore()
        packer = S.Packer()
        value = packer.put(out)
        reply = {"value": value}
        if grad:
            if len(self.graphs) >= MAX_KEPT_GRAPHS:
                raise MemoryError("too many calls of given exercises keep their gradients")
            reply["call"] = self._next
            self.graphs[self._next] = (tensors, packer.tensors)
            self._next += 1
        return reply, [t.detach() for t in packer.tensors]

    def _target(self, header, state):
        """What the call runs, and how to put back what running it changed (a module's mode)."""
        if "function" in header:
            name = header["function"]
            if self.allowed.get(name) != "function":
                raise PermissionError(f"{name} is not given in this test")
            return getattr(self.reference, name), lambda: None
        handle, path, method = header.get("handle"), header.get("path", ""), header.get("method")
        if handle not in self.handles or not isinstance(path, str) or not isinstance(method, str):
            raise PermissionError("no such given module in this test")
        root = self.handles[handle]
        node = root.get_submodule(path)
        if method not in methods_of(type(node)):
            raise PermissionError(f"{type(node).__name__}.{method} is not given")
        prefix = f"{path}." if path else ""
        if any(not isinstance(n, str) or not n.startswith(prefix) for n in state):
            raise ValueError("a malformed call")
        modes = [(m, m.training) for m in node.modules()]
        node.train(bool(header.get("training", False)))
        local = {"inner." + n[len(prefix):]: t for n, t in state.items()}
        record = self.records.get(handle)

        def run(*args, **kwargs):
            if record is not None and len(record) < MAX_RECORDS:  # the grader's own record of the call
                record.append(_record(path or method, args, kwargs))
            return torch.func.functional_call(_Method(node, method), local, tuple(args), kwargs, strict=False)

        def restore():
            for m, mode in modes:
                m.training = mode
        return run, restore

    def _backward(self, header, tensors):
        kept = self.graphs.pop(header.get("call"), None)
        given = header.get("given")
        if kept is None or not isinstance(given, list) or len(given) != len(tensors):
            raise ValueError("no such call to differentiate")
        inputs, outputs = kept
        pairs = [(outputs[i], g) for i, g in zip(given, tensors)
                 if isinstance(i, int) and 0 <= i < len(outputs) and outputs[i].requires_grad]
        wrt = [(i, t) for i, t in enumerate(inputs) if t.requires_grad]
        if not pairs or not wrt:
            return {"returned": []}, []
        grads = torch.autograd.grad([o for o, _ in pairs], [t for _, t in wrt],
                                    [g.to(o.dtype).reshape(o.shape) for o, g in pairs], allow_unused=True)
        returned = [(i, g) for (i, _), g in zip(wrt, grads) if g is not None]
        return {"returned": [i for i, _ in returned]}, [g for _, g in returned]


def _record(method, args, kwargs) -> dict:
    """What the grader notes of one call of a model argument: the method, the batch rows and the
    tokens of its first tensor, and whether a cache (``past``: the second argument) came with it."""
    first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
    past = args[1] if len(args) > 1 else kwargs.get("past")
    return {"method": method,
            "rows": int(first.shape[0]) if first is not None and first.dim() else None,
            "tokens": int(first.shape[1]) if first is not None and first.dim() > 1 else None,
            "past": past is not None}


# ------------------------------------------------------------------ the answering process

class StandInService:
    """An ``Answerer`` in a child process forked from this one, listening on ``address`` (a path
    in the exchange folder); this process tells it which test is on, over a pipe."""

    def __init__(self, hidden, address: Path):
        self.hidden, self.address = hidden, Path(address)
        self.pid = None
        self._control = None

    def begin(self, test_id: str, deps) -> None:
        if self.pid is None:
            self._start()
        if not self._ask({"op": "begin", "test": test_id, "deps": list(deps)}):
            self.close()

    def end(self) -> dict[int, list]:
        if self.pid is None:
            return {}
        reply = self._ask({"op": "end"})
        if reply is None:
            self.close()
            return {}
        return {int(k): v for k, v in reply.get("records", {}).items()}

    def close(self) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self._control.close()
        self.pid, self._control = None, None
        try:
            self.address.unlink()
        except OSError:
            pass

    def _ask(self, message: dict) -> dict | None:
        try:
            self._control.settimeout(REPLY_SECONDS)
            data = json.dumps(message).encode()
            self._control.sendall(struct.pack("<Q", len(data)) + data)
            return json.loads(S.read_message(self._control))
        except (OSError, ValueError, ConnectionError):
            return None

    def _start(self) -> None:
        try:
            self.address.unlink()
        except OSError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.address))
        os.chmod(self.address, 0o666)
        listener.listen(8)
        parent, child = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the answering process: never returns
            code = 0
            try:
                parent.close()
                _serve(Answerer(self.hidden), listener, child)
            except BaseException:  # noqa: BLE001 - it ends here, whatever happened
                code = 1
            finally:
                os._exit(code)
        listener.close()
        child.close()
        self.pid, self._control = pid, parent


def _limit_self() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grading process decides when this one ends
    torch.set_num_threads(1)
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY, size + MEMORY))
    except (OSError, ValueError):
        pass
    used = resource.getrusage(resource.RUSAGE_SELF)
    seconds = int(used.ru_utime + used.ru_stime) + PROCESSOR_SECONDS
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))


def _serve(answerer: Answerer, listener, control) -> None:
    """Answer the kernel's connections and the grading process's control messages, one at a time."""
    _limit_self()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    selector.register(control, selectors.EVENT_READ, "control")
    kernels: list = []
    while True:
        for key, _ in selector.select():
            if key.data == "control":
                try:
                    message = json.loads(S.read_message(control))
                except (OSError, ValueError, ConnectionError):
                    return  # the grading process is gone
                if message.get("op") == "begin":
                    answerer.begin(message["test"], message.get("deps", []))
                    reply = {"ok": True}
                else:
                    reply = {"records": {str(k): v for k, v in answerer.end().items()}}
                    for conn in kernels:  # a connection of one test never serves the next
                        selector.unregister(conn)
                        conn.close()
                    kernels.clear()
                data = json.dumps(reply).encode()
                control.sendall(struct.pack("<Q", len(data)) + data)
            elif key.data == "listen":
                conn, _ = listener.accept()
                if len(kernels) >= 8:
                    conn.close()
                    continue
                conn.settimeout(10)
                kernels.append(conn)
                selector.register(conn, selectors.EVENT_READ, "kernel")
            else:
                conn = key.fileobj
                try:
                    reply = answerer.answer(S.read_message(conn))
                    conn.sendall(struct.pack("<Q", len(reply)) + reply)
                except (OSError, ValueError, ConnectionError):
                    selector.unregister(conn)
                    kernels.remove(conn)
                    conn.close()


class LocalClient:
    """The kernel's ``standin.Client`` for a call run in this process (``autograder.inprocess``):
    the same frames, answered by an ``Answerer`` here, without a socket."""

    def __init__(self, answerer: Answerer):
        self.answerer = answerer

    def request(self, header: dict, tensors=()) -> tuple:
        data = S.frame(header, [S.as_array(t) for t in tensors])
        reply, arrays = S.unframe(self.answerer.answer(data))
        if "error" in reply:
            raise S.StandInError(str(reply["error"])[:500])
        return reply, [S.as_tensor(a) for a in arrays]

    def close(self):
        pass
