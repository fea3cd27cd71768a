"""Hints: what a chapter's checks add to a verdict, and the checks the course offers chapters."""
from __future__ import annotations

import torch

from ..messages import from_tests, msg


def hints(probe, student, got=None) -> list:
    """The probe's checks on the returned values; with ``got``, its checks of the model calls too."""
    found = [from_tests(hint) for hint in (check(probe, student) for check in probe.checks) if hint]
    if got is not None:
        found += [from_tests(hint) for hint in (check(probe, got.get("model_calls")) for check in probe.call_checks)
                  if hint]
    return found


def rows_sum_to_one(probe, value):
    """Hint for (output, weights) results whose weights are not distributions."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], torch.Tensor):
        weights = value[1]
        if weights.is_floating_point() and weights.numel():
            sums = weights.sum(-1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                return msg("weights rows do not sum to 1: take the softmax over the last dimension (the keys)")
    return None


