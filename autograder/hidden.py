"""The hidden-test authoring API that chapters use: describe probes; the judge is ``autograder.judge``.

A chapter's hidden module (generated from its ``# %% [hidden]`` cells) creates one
``HiddenTests`` and registers a builder per test cell::

    hidden = HiddenTests(ref, from_scratch={"scaled_dot_product_attention"})

    @hidden.test("test_scaled_dot_product_attention_values")
    def _(t):
        q, k, v = t.randn(2, 5, 8), t.randn(2, 7, 8), t.randn(2, 7, 6)
        t.function("scaled_dot_product_attention", q, k, v, grad=True, mistakes=MISTAKES)

Builders only describe calls. The grader writes the inputs for the kernel, the kernel
calls the submission, and ``autograder.judge`` compares the returned values with the
reference's (computed once per probe, ``judge.reference``), in a process that never ran
submitted code. Chapters import from here only: ``HiddenTests``, ``Mistake`` and the checks
``close`` and ``rows_sum_to_one``.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import torch

from .judge.compare import close, tolerance  # noqa: F401 - for chapters' checks
from .judge.hints import rows_sum_to_one  # noqa: F401 - for chapters' checks
from .judge.reference import call_reference, float_tensor_indices, reference_call
from . import settings
from .sandboxed.wire import ModelArg

@dataclasses.dataclass
class Mistake:
    """A common wrong implementation: if the submission matches it, say so."""
    message: str
    compute: Callable[..., Any]  # same call as the reference (module mistakes get the module first)


def call_time_limit() -> float:
    """Processor seconds one call of submitted code may use, the grading's ``call_timeout`` setting
    (the kernel side stops a call that waits instead, on the clock: ``probe.WAITING_FACTOR``)."""
    return settings.current().call_timeout


@dataclasses.dataclass
class Probe:
    target: str
    args: tuple
    kwargs: dict
    init: dict | None = None
    state: dict | None = None
    grad_args: tuple = ()
    grad_params: bool = False
    deps: tuple = ()
    mistakes: tuple = ()
    checks: tuple = ()  # callables (probe, outputs) -> message or None, run on passing values
    label: str = ""
    method: str = "forward"  # for modules: the method under test
    dtype: str | None = None  # for modules: parameters cast to this dtype (e.g. "float64")
    # Processor seconds for its call; None: the setting at grading time (``call_limit``), since probes
    # are built once per process and serve every grading after.
    time_limit: float | None = None
    strict: bool = False  # float64 outputs must agree to float64 precision (see ``tolerance``)
    # (student, expected) -> bool, for results whose spec leaves some parts open; default ``values_match``
    equivalent: Callable[[Any, Any], bool] | None = None
    reference: Callable | None = None  # filled by the builder
    cotangents: tuple = ()
    # Names of the returned values, for messages ("`logits` differs"); default (output, weights) for pairs.
    returns: tuple = ()
    # Judge in-place changes to tensor inputs: only for an exercise whose spec text forbids them
    # (``HiddenTests(inputs_kept=...)``); otherwise changing an input in place is a correct style.
    keep_inputs: bool = False
    # The call must raise an error whose message contains one of these strings (e.g. a missing key).
    raises: tuple = ()
    # callables (probe, model_calls) -> message or None: how the code used its model arguments,
    # from the kernel's record (``attn_probe``: one {"method", "rows"} per call of encode, decode,
    # forward or out); run on passing values, as ``checks`` are
    call_checks: tuple = ()
    # The reference's results, computed once when first asked for (``judge.reference``); a copy
    # made with ``dataclasses.replace`` starts without them.
    computed: dict | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def call_limit(self) -> float:
        """The processor seconds its call may use in the grading in progress."""
        return self.time_limit if self.time_limit is not None else call_time_limit()


class Builder:
    """Seeded input factory handed to each hidden-test builder."""

    def __init__(self, tests: "HiddenTests", test_id: str):
        self.tests, self.test_id, self.probes = tests, test_id, []
        # A course-private seed (README, "Public answers") gives every test other inputs than the public ones.
        private = settings.current().private_seed
        seed = int(hashlib.sha256((f"{private}\0{test_id}" if private else test_id).encode()).hexdigest()[:8], 16)
        self.gen = torch.Generator().manual_seed(seed)

    def randn(self, *shape, dtype=torch.float32):
        return torch.randn(*shape, generator=self.gen, dtype=torch.float64).to(dtype)

    def randint(self, low, high, shape):
        return torch.randint(low, high, shape, generator=self.gen)

    def rand_bool(self, *shape, p=0.7):
        return torch.rand(*shape, generator=self.gen) < p

    def function(self, name, *args, grad=False, mistakes=(), checks=(), label="", deps=(), strict=False,
                 equivalent=None, call_checks=(), returns=(), raises=(), **kwargs):
        """Probe ``name(*args, **kwargs)``.

        strict: compare float64 results to float64 precision. Only for an exercise whose
        spec text requires float64 precision (see ``tolerance``); none does today.
        equivalent: ``(student, expected) -> bool`` replacing ``values_match``, for results
        whose spec leaves some parts ungraded (e.g. tokens after a row's end).
        returns: names of the returned values, for messages (e.g. ``("logits", "presents")``).
        raises: the call must raise an error whose message contains one of these strings
        (the reference must raise too); nothing else of the probe is judged.
        """
        probe = Probe(target=name, args=args, kwargs=kwargs, mistakes=tuple(mistakes),
                      checks=tuple(checks), label=label, deps=tuple(deps), strict=strict,
                      equivalent=equivalent, reference=getattr(self.tests.reference, name),
                      call_checks=tuple(call_checks), returns=tuple(returns), raises=tuple(raises))
        if grad:
            probe.grad_args = float_tensor_indices(args)
        self._finish(probe, grad)
        return probe

    def module(self, name, init, *args, grad=False, mistakes=(), checks=(), label="", deps=(),
               method="forward", dtype=None, strict=False, returns=(), equivalent=None, **kwargs):
        """Probe ``name(**init).method(*args, **kwargs)`` with the reference's parameter values.

        deps: exercises this one uses (called or constructed); while it is tested the
        reference versions stand in for the learner's (answered across the exchange,
        ``autograder.standins``), so earlier mistakes cost nothing here.
        Mistake models are called as ``compute(reference_module, *args, **kwargs)``.
        dtype: run the module in this dtype (``torch.float64``), parameters included.
        """
        module = self._reference_module(name, init, dtype).eval()  # as the kernel runs it: dropout off
        probe = Probe(target=name, args=args, kwargs=kwargs, init=dict(init),
                      state={n: p.detach().clone() for n, p in module.named_parameters()},
                      grad_params=grad, mistakes=tuple(mistakes), checks=tuple(checks),
                      label=label, deps=tuple(deps), reference=module, method=method, strict=strict,
                      dtype=None if dtype is None else str(dtype).replace("torch.", ""),
                      returns=tuple(returns), equivalent=equivalent)
        if grad:
            probe.grad_args = float_tensor_indices(args)
        self._finish(probe, grad)
        return probe

    def model(self, name, init, dtype=None) -> ModelArg:
        """A model argument: reference class ``name(**init)`` with random non-default parameters, in eval mode.

        The exercise that receives it is graded on its own: in the kernel, the model is a
        stand-in whose calls the reference answers in the grader (``autograder.standins``).
        """
        module = self._reference_module(name, init, dtype).eval()
        return ModelArg(name, dict(init), {n: p.detach().clone() for n, p in module.named_parameters()},
                        None if dtype is None else str(dtype).replace("torch.", ""), module)

    def _reference_module(self, name, init, dtype):
        cls = getattr(self.tests.reference, name)
        torch.manual_seed(int(self.gen.initial_seed()) % 2**31 + len(self.probes))
        module = cls(**init)
        if dtype is not None:
            module = module.to(dtype)
        with torch.no_grad():  # non-default values so that a wrong parameter shows
            for p in module.parameters():
                p.copy_(self.randn(*p.shape, dtype=p.dtype) * 0.5)
        return module

    def _finish(self, probe, grad):
        probe.keep_inputs = probe.target in self.tests.inputs_kept
        if probe.raises:
            try:
                call_reference(probe)
            except Exception:  # noqa: BLE001 - as it should
                pass
            else:
                raise ValueError(f"{self.test_id}: the reference does not raise on a probe that expects an error")
        if grad:
            outs = reference_call(probe)[0]
            outs = outs if isinstance(outs, tuple) else (outs,)
            probe.cotangents = tuple(self.randn(*o.shape, dtype=o.dtype) for o in outs
                                     if isinstance(o, torch.Tensor) and o.is_floating_point())
        self.probes.append(probe)


class HiddenTests:
    def __init__(self, reference, from_scratch=(), inputs_kept=(), kernel_only=()):
        """inputs_kept: exercises whose spec text says they must not change their inputs in place;
        only their probes judge that (any other exercise may change them: a correct style).
        kernel_only: exercises that compute in @triton.jit kernels only (Chapter 10): the static check
        refuses torch or numpy computing outside kernels and anything but triton inside them; they are
        from-scratch exercises too (no built-in, no tampering)."""
        self.reference = reference
        self.kernel_only = set(kernel_only)
        self.from_scratch = set(from_scratch) | self.kernel_only
        self.inputs_kept = set(inputs_kept)
        self.builders: dict[str, Callable[[Builder], None]] = {}
        self.memory_rules: dict[str, tuple[int, str]] = {}
        self._built: dict[str, list[Probe]] = {}

    def test(self, test_id, max_memory: tuple[int, str] | None = None):
        """Register a test's builder.

        max_memory: (bytes, message). The grader reads, from outside the sandbox, how far
        the kernel's peak resident memory rose during this test cell above its memory just
        before; above the limit the test fails with the message (and the figure).
        """
        def register(fn):
            self.builders[test_id] = fn
            if max_memory is not None:
                self.memory_rules[test_id] = (int(max_memory[0]), str(max_memory[1]))
            return fn
        return register

    def build(self, test_id) -> list[Probe]:
        """The test's probes, built anew (``probes`` keeps one build)."""
        builder = Builder(self, test_id)
        self.builders[test_id](builder)
        return builder.probes

    def probes(self, test_id) -> list[Probe]:
        """The test's probes, built once per process: a build is seeded, so every build is the same,
        and the reference's results each probe keeps (``judge.reference``) serve every grading after
        the first. Nothing of a submission is kept on a probe: the judge only reads them."""
        if test_id not in self._built:
            self._built[test_id] = self.build(test_id)
        return self._built[test_id]


__all__ = ["HiddenTests", "Builder", "Mistake", "ModelArg", "Probe", "close", "rows_sum_to_one", "tolerance"]
