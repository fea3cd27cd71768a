"""Given exercises in the kernel, answered by the grader (imported in the kernel as ``attn_standin``).

When a later exercise is graded on its own, the exercises it uses (``deps``) and its model
arguments stand in for the learner's, as the reference computes them. No line of the
reference reaches the kernel: a stand-in here is only a name, and every call of it is
sent across the exchange (a Unix socket) to the grader's stand-in process, which runs the
reference there and sends back the values (and, for gradients, the vector-Jacobian
products). A stand-in module is a tree of plain parameters and buffers with the
reference's names, built from a description the grader sends; its methods are calls.

Framing, both directions: ``frame(header, arrays)`` and the bounded ``unframe``, which never
allocates more than its limits allow and never unpickles. Only the standard library, numpy
and torch.
"""
import io
import json
import signal
import socket
import struct

import numpy as np
import torch

MAGIC = b"ATSI"
MAX_FRAME = 64 * 1024 * 1024      # bytes of one message
MAX_ELEMENTS = 2_000_000          # elements of one array
MAX_HEADER = 4 * 1024 * 1024      # bytes of one message's JSON
MAX_DEPTH = 24                    # nesting of one encoded value
WAIT_SECONDS = 120               # how long the kernel waits for one answer
DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"}


class StandInError(RuntimeError):
    """A given exercise's stand-in could not answer (its reference raised, or the call could not be sent)."""


# ------------------------------------------------------------------ framing

def frame(header: dict, arrays: list) -> bytes:
    """One message: MAGIC, the JSON header's length and bytes, then each array in ``.npy`` format."""
    head = json.dumps(header).encode()
    parts = [MAGIC, struct.pack("<II", len(head), len(arrays)), head]
    for array in arrays:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
        data = buffer.getvalue()
        parts += [struct.pack("<Q", len(data)), data]
    return b"".join(parts)


def unframe(data: bytes, max_elements: int = MAX_ELEMENTS, max_total: int = MAX_FRAME):
    """(header, arrays) of one message; ValueError for anything malformed or over a limit."""
    view = memoryview(data)
    if len(view) < 12 or bytes(view[:4]) != MAGIC:
        raise ValueError("not a stand-in message")
    head_len, count = struct.unpack("<II", view[4:12])
    if head_len > MAX_HEADER or count > 10_000 or 12 + head_len > len(view):
        raise ValueError("a stand-in message over its limits")
    header = json.loads(bytes(view[12:12 + head_len]))
    if not isinstance(header, dict):
        raise ValueError("a stand-in message without a header")
    at, arrays, total = 12 + head_len, [], 0
    for _ in range(count):
        if at + 8 > len(view):
            raise ValueError("a stand-in message cut short")
        (size,) = struct.unpack("<Q", view[at:at + 8])
        at += 8
        if at + size > len(view):
            raise ValueError("a stand-in message cut short")
        array = _read_npy(bytes(view[at:at + size]), max_elements)
        total += array.nbytes
        if total > max_total:
            raise ValueError("a stand-in message over its limits")
        arrays.append(array)
        at += size
    return header, arrays


def _read_npy(data: bytes, max_elements: int):
    """One ``.npy`` array, its header checked (dtype, size) before anything is allocated."""
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise ValueError("an array of an unknown format")
    shape, fortran, dtype = read_header(stream, max_header_size=10_000)
    if dtype.hasobject or dtype.name not in DTYPES or len(shape) > 16:
        raise ValueError("an array of a type that cannot be passed")
    elements = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if elements < 0 or elements > max_elements:
        raise ValueError("an array over its size limit")
    body = data[stream.tell():]
    if len(body) != elements * dtype.itemsize:
        raise ValueError("an array whose size does not match its header")
    array = np.frombuffer(body, dtype=dtype, count=elements)
    return array.reshape(shape, order="F" if fortran else "C").copy()


# ------------------------------------------------------------------ values

class Packer:
    """Encodes a value as plain JSON; its tensors go, in order, into ``tensors``."""

    def __init__(self):
        self.tensors = []

    def put(self, value, depth=0):
        if depth > MAX_DEPTH:
            raise StandInError("a value nested too deeply to pass")
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter):
                raise StandInError(f"a tensor subclass ({type(value).__name__}) cannot be passed to a given exercise")
            self.tensors.append(value)
            return {"t": len(self.tensors) - 1}
        if isinstance(value, (tuple, list)):
            return {"l" if isinstance(value, list) else "u": [self.put(v, depth + 1) for v in value]}
        if isinstance(value, dict):
            return {"d": [[self.put(k, depth + 1), self.put(v, depth + 1)] for k, v in value.items()]}
        if isinstance(value, torch.dtype):
            return {"dtype": str(value).replace("torch.", "")}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"v": value}
        raise StandInError(f"a {type(value).__name__} cannot be passed to a given exercise")


def unpack(desc, tensors, depth=0):
    """A value from its ``Packer`` description; ValueError for anything else."""
    if depth > MAX_DEPTH or not isinstance(desc, dict) or len(desc) != 1:
        raise ValueError("a malformed value")
    (kind, body), = desc.items()
    if kind == "t" and isinstance(body, int) and 0 <= body < len(tensors):
        return tensors[body]
    if kind in ("l", "u") and isinstance(body, list):
        items = [unpack(v, tensors, depth + 1) for v in body]
        return items if kind == "l" else tuple(items)
    if kind == "d" and isinstance(body, list):
        pairs = [(unpack(k, tensors, depth + 1), unpack(v, tensors, depth + 1)) for k, v in body]
        if any(not isinstance(k, (str, int, float, bool, tuple, type(None))) for k, _ in pairs):
            raise ValueError("a malformed value")
        return dict(pairs)
    if kind == "dtype" and body in DTYPES:
        return getattr(torch, body)
    if kind == "v" and (body is None or isinstance(body, (bool, int, float, str))):
        return body
    raise ValueError("a malformed value")


def as_array(t: torch.Tensor):
    return t.detach().cpu().resolve_conj().resolve_neg().contiguous().numpy()


def as_tensor(array) -> torch.Tensor:
    return torch.from_numpy(np.array(array, copy=True))


# ------------------------------------------------------------------ the connection

class Client:
    """The kernel's end of the stand-in socket: one request, one reply, in order."""

    def __init__(self, address: str):
        self.address, self.sock = address, None

    def request(self, header: dict, tensors=()) -> tuple:
        """(reply header, reply tensors); StandInError for a reply that reports an error.

        The wait for the grader's answer does not count on the call's clock (``ITIMER_REAL``,
        which stops a call that waits instead of computing): the stand-in computes what the
        learner's own code used to compute in the kernel, and a busy machine must not time out
        a correct call. Every request still costs this process processor time, which the call's
        processor limit counts, and the socket gives up after ``WAIT_SECONDS``."""
        data = frame(header, [as_array(t) for t in tensors])
        left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(WAIT_SECONDS)
                self.sock.connect(self.address)
            self.sock.sendall(struct.pack("<Q", len(data)) + data)
            message = read_message(self.sock)
        finally:
            if left > 0:
                signal.setitimer(signal.ITIMER_REAL, left)
        reply, arrays = unframe(message)
        if "error" in reply:
            raise StandInError(str(reply["error"])[:500])
        return reply, [as_tensor(a) for a in arrays]

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def read_message(sock) -> bytes:
    size = struct.unpack("<Q", _read_exactly(sock, 8))[0]
    if size > MAX_FRAME + 1024:
        raise ValueError("a stand-in message over its limits")
    return _read_exactly(sock, size)


def _read_exactly(sock, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the stand-in connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------ calls, with gradients

class _Remote(torch.autograd.Function):
    """A call answered by the grader: forward sends the inputs, backward the output gradients."""

    @staticmethod
    def forward(ctx, call, *inputs):
        reply, outputs = call.client.request(call.header, inputs)
        call.reply = reply
        ctx.client, ctx.call_id = call.client, reply.get("call")
        ctx.float_inputs = [t.is_floating_point() for t in inputs]
        ctx.mark_non_differentiable(*[o for o in outputs if not o.is_floating_point()])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        wanted = [g if g is not None else None for g in grads]
        present = [i for i, g in enumerate(wanted) if g is not None]
        reply, tensors = ctx.client.request({"op": "backward", "call": ctx.call_id, "given": present},
                                            [wanted[i].contiguous() for i in present])
        back = dict(zip(reply.get("returned", []), tensors))
        return (None, *(back.get(i) if is_float else None for i, is_float in enumerate(ctx.float_inputs)))


class _Call:
    def __init__(self, client, header):
        self.client, self.header, self.reply = client, header, None


def call(client, header: dict, args, kwargs, state=()):
    """Send one call (``header`` names what is called) with its arguments and the module state it
    reads; the values it returns, through autograd when any float input requires gradients."""
    packer = Packer()
    header = dict(header, args=packer.put(list(args)), kwargs=packer.put(dict(kwargs)),
                  state=[name for name, _ in state])
    tensors = [*packer.tensors, *(t for _, t in state)]
    header["arrays"] = len(packer.tensors)
    wants = torch.is_grad_enabled() and any(t.requires_grad and t.is_floating_point() for t in tensors)
    header["grad"] = bool(wants)
    box = _Call(client, header)
    if wants:
        outputs = _Remote.apply(box, *tensors)
    else:
        box.reply, outputs = client.request(header, [t.detach() for t in tensors])
    return unpack(box.reply["value"], list(outputs))


# ------------------------------------------------------------------ stand-ins

def function(client, name: str):
    """A given function: every call is answered by the grader."""
    def stand_in(*args, **kwargs):
        return call(client, {"op": "call", "function": name}, args, kwargs)
    stand_in.__name__ = stand_in.__qualname__ = name
    return stand_in


def module_class(client, name: str, methods=("forward",)):
    """A given class: constructing it asks the grader for the reference module's description,
    and builds the same tree of parameters and buffers here; its methods are calls."""
    def __init__(self, *args, **kwargs):
        torch.nn.Module.__init__(self)
        reply, tensors = client.request({"op": "construct", "class": name,
                                         **_packed_plain(args, kwargs)})
        _fill(self, reply["tree"], tensors, client, reply["handle"])
    body = {m: _remote_method(m) for m in methods if isinstance(m, str) and m.isidentifier()}
    return type(name, (torch.nn.Module,), {**body, "__init__": __init__})


def _packed_plain(args, kwargs) -> dict:
    packer = Packer()
    encoded = {"args": packer.put(list(args)), "kwargs": packer.put(dict(kwargs))}
    if packer.tensors:
        raise StandInError("a given class is built from plain values only (numbers, strings, None)")
    return encoded


def model(client, tree: dict, tensors: list, handle: str) -> torch.nn.Module:
    """A model argument, from the description the grader sent with the test's inputs."""
    root = _node(tree["modules"][""]["type"], tree["modules"][""].get("methods", []))()
    _fill(root, tree, tensors, client, handle)
    return root


_CONTAINERS = {"ModuleList": torch.nn.ModuleList, "ModuleDict": torch.nn.ModuleDict}
_NODE_TYPES = {}


def _node(type_name: str, methods) -> type:
    """The class of one module of a stand-in tree: named as the reference's, its methods calls."""
    key = (type_name, tuple(methods))
    if key not in _NODE_TYPES:
        body = {m: _remote_method(m) for m in methods if isinstance(m, str) and m.isidentifier()}
        if type_name in _CONTAINERS:
            _NODE_TYPES[key] = _CONTAINERS[type_name]
        else:
            _NODE_TYPES[key] = type(str(type_name), (torch.nn.Module,), body)
    return _NODE_TYPES[key]


def _remote_method(method: str):
    def remote(self, *args, **kwargs):
        root, path = self._attn_standin
        prefix = f"{path}." if path else ""
        state = [(prefix + n, t) for n, t in _state_of(self)]
        return call(root.client, {"op": "call", "handle": root.handle, "path": path, "method": method,
                                  "training": self.training}, args, kwargs, state)
    remote.__name__ = method
    return remote


def _state_of(module):
    """Parameters and buffers, each tensor once (tied weights under their first name)."""
    seen, out = set(), []
    for name, t in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


class _Root:
    """Where a stand-in tree's calls go. A copy of the tree (``copy.deepcopy``) calls the same
    handle with its own parameters: every call sends the state it reads."""

    def __init__(self, client, handle):
        self.client, self.handle = client, handle

    def __deepcopy__(self, memo):
        return self


def _fill(root_module, tree, tensors, client, handle):
    """Give ``root_module`` the described submodules, parameters, buffers and plain attributes."""
    root = _Root(client, handle)
    nodes = {"": root_module}
    for path, info in sorted(tree["modules"].items(), key=lambda kv: kv[0].count(".") if kv[0] else -1):
        if path:
            parent_path, _, leaf = path.rpartition(".")
            nodes[path] = _node(info["type"], info.get("methods", []))()
            nodes[parent_path].add_module(leaf, nodes[path])
        node = nodes[path]
        object.__setattr__(node, "_attn_standin", (root, path))
        for key, value in info.get("attrs", {}).items():
            if isinstance(key, str) and key.isidentifier() and not key.startswith("_") and key != "training":
                object.__setattr__(node, key, unpack(value, []))
        node.train(bool(info.get("training", False)))

    def place(name):
        parent_path, _, leaf = name.rpartition(".")
        return nodes[parent_path], leaf

    for name, index in tree.get("params", {}).items():
        owner, leaf = place(name)
        owner.register_parameter(leaf, torch.nn.Parameter(tensors[index], requires_grad=True))
    for name, index in tree.get("buffers", {}).items():
        owner, leaf = place(name)
        owner.register_buffer(leaf, tensors[index], persistent=name not in tree.get("nonpersistent", []))
    for alias, name in tree.get("tied", {}).items():
        owner, leaf = place(alias)
        source_owner, source_leaf = place(name)
        owner.register_parameter(leaf, getattr(source_owner, source_leaf))
