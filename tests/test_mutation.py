"""Smoke test of the mutation benchmark (benchmarks/mutation.py): in process, a few seconds."""
from __future__ import annotations

import sys

from support import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import mutation  # noqa: E402


def test_obvious_chapter2_mutants_are_killed_with_the_named_mistake():
    report = mutation.run_chapter("02_self_attention", only=[
        "/ math.sqrt(d_k)` -> `query @ key.transpose(-2, -1)`",     # no scale
        "`-1` -> `-2` in `torch.softmax(scores, dim=-1)`",         # softmax over the queries
        "remove `scores = scores.masked_fill(",                    # mask ignored
        "`~mask` -> `mask`",                                       # polarity inverted
        "`max_len` -> `int(lengths.max())`",                       # width from the data
    ])
    killed = dict(report.killed)
    assert report.mutants >= 5 and not report.survivors, report.survivors
    by_fragment = {
        "-> `query @ key.transpose(-2, -1)`": "not scaled by 1/sqrt(d_k)",
        "remove `scores = scores.masked_fill(": "mask ignored",
        "`~mask` -> `mask`": "mask polarity inverted",
        "`max_len` -> `int(lengths.max())`": "width taken from lengths.max()",
    }
    for fragment, message in by_fragment.items():
        hits = [why for desc, why in killed.items() if fragment in desc]
        assert hits and all(message in why for why in hits), (fragment, hits)
    softmax_dim = [why for desc, why in killed.items() if "in `torch.softmax(scores, dim=-1)`" in desc]
    assert softmax_dim and all("softmax taken over the queries" in why for why in softmax_dim), softmax_dim


def test_a_sample_of_chapter2_mutants_runs_and_the_reference_survives():
    chapter = mutation.load_chapter("02_self_attention")
    assert mutation.first_problem(chapter, mutation.mutant_namespace(chapter, None)) is None
    report = mutation.run_chapter("02_self_attention", limit=15, seed=1)
    assert report.mutants == 15
    assert len(report.killed) + len(report.survivors) == 15
    assert not report.gaps, report.gaps
    assert report.kill_rate >= 0.95


def test_a_sample_of_chapter10_kernel_mutants_is_killed_in_forked_children():
    """Chapter 10's mutants are mutated @triton.jit kernels and wrappers, each run by Triton's interpreter in a
    forked child (a mutated offset can crash the process: a death is a kill)."""
    chapter = mutation.load_chapter("10_attention_kernels")
    assert mutation.first_problem(chapter, mutation.mutant_namespace(chapter, None)) is None
    report = mutation.run_chapter("10_attention_kernels", limit=12, seed=2)
    assert report.mutants == 12 and len(report.killed) + len(report.survivors) == 12
    assert not report.gaps, report.gaps
    assert report.kill_rate >= 0.95, report.survivors
