"""Whether an answer is plausible under the model, from its tokens' scores by
prefill (DESIGN.md "Verifying real answers"; /work/notes/verify-contract.md).

PROVISIONAL (branch i22b): the coordinator's side needs this module's
signatures; the calibrated judge (branch i22a) replaces this file whole at
merge. Pure: no database, no settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# T == 0: an honest greedy answer has (almost) every token the argmax; ties and
# GPU non-determinism allow a few misses
GREEDY_MISSES_FREE = 1
GREEDY_MISSES_SHARE = 0.05
# T > 0: the standardised sum of log-probabilities of an honest sample is about
# N(0, 1); a far lower one is not a sample of this distribution
Z_MIN = -4.0
VAR_FLOOR = 1e-6
# tokens outside the sampler's support (top-k / top-p / min-p) are impossible
OUTSIDE_FREE = 1
OUTSIDE_SHARE = 0.02


@dataclass(frozen=True)
class TokenScore:
    """One answer token scored by prefill: ``rank`` among the raw logits (0 =
    the argmax), ``logprob`` log p_T(token) (None: outside the support),
    ``mean`` E[log p_T] and ``var`` Var[log p_T] over the support."""

    rank: int
    logprob: float | None
    mean: float
    var: float


@dataclass(frozen=True)
class Plausibility:
    """The judge's verdict on one answer: ``n`` tokens, ``z`` (T > 0; 0.0 at
    T = 0), ``misses`` (T = 0: tokens not the argmax), ``outside`` (tokens out
    of the support), ``detail`` in words."""

    plausible: bool
    n: int
    z: float
    misses: int
    outside: int
    detail: str


def token_scores_parse(value: object) -> list[TokenScore]:
    """The ``tokens`` of a ``scores`` frame as ``TokenScore``s; ValueError naming
    the first bad entry (not a list, an entry that is not ``{"rank": int >= 0,
    "logprob": finite float <= 0 or null, "mean": finite float <= 0, "var":
    finite float >= 0}``)."""
    if not isinstance(value, list):
        raise ValueError("scores: tokens must be a list")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise ValueError(f"scores: tokens[{i}] must be an object")
        rank = entry.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"scores: tokens[{i}].rank must be an integer >= 0")
        logprob = entry.get("logprob")
        if logprob is not None and not _number(logprob, high=0.0):
            raise ValueError(f"scores: tokens[{i}].logprob must be a number <= 0 or null")
        mean, var = entry.get("mean"), entry.get("var")
        if not _number(mean, high=0.0):
            raise ValueError(f"scores: tokens[{i}].mean must be a number <= 0")
        if not _number(var, low=0.0):
            raise ValueError(f"scores: tokens[{i}].var must be a number >= 0")
        out.append(
            TokenScore(
                rank=rank,
                logprob=None if logprob is None else float(logprob),
                mean=float(mean),
                var=float(var),
            )
        )
    return out


def _number(value: object, *, low: float = -math.inf, high: float = math.inf) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and low <= value <= high
    )


def answer_plausible(*, temperature: float, tokens: list[TokenScore]) -> Plausibility:
    """Judge an answer from its tokens' scores at the request's ``temperature``."""
    n = len(tokens)
    outside = sum(1 for t in tokens if t.logprob is None)
    if outside > OUTSIDE_FREE + OUTSIDE_SHARE * n:
        return Plausibility(
            False, n, 0.0, 0, outside, f"{outside} of {n} tokens outside the sampler's support"
        )
    if temperature == 0:
        misses = sum(1 for t in tokens if t.rank > 0)
        plausible = misses <= GREEDY_MISSES_FREE + GREEDY_MISSES_SHARE * n
        return Plausibility(
            plausible, n, 0.0, misses, outside, f"{misses} of {n} tokens not the argmax"
        )
    inside = [t for t in tokens if t.logprob is not None]
    total = sum(t.logprob - t.mean for t in inside)
    z = total / math.sqrt(sum(t.var for t in inside) + VAR_FLOOR)
    return Plausibility(
        z >= Z_MIN, n, z, 0, outside, f"z = {z:.2f} over {len(inside)} tokens"
    )
