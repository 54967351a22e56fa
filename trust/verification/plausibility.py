"""Is an answer plausible under the model its host claims? The judge of a
``scores`` frame (DESIGN.md "Verifying real answers"; docs/trust.md).

Pure: no Django, no database. The verifier's agent scored each answer token by
prefill under the request's sampler (``agent.engines.sampling``: top-k 40,
top-p, min-p 0.05, then the temperature): its ``rank`` among the raw logits,
``logprob`` (natural log of its probability under the sampling distribution
p_T, None outside the sampler's support), and the position's ``mean`` and
``var`` of log p_T under p_T. This module parses those entries
(``token_scores_parse``) and judges them (``answer_plausible``):

- at temperature 0 the honest answer is the argmax at every position: an
  answer is implausible when more than ``GREEDY_MISSES_BASE +
  GREEDY_MISSES_SHARE × n`` of its n tokens rank below the top (a verifier on
  other hardware may flip a near-tie now and then, and retokenizing the text
  may split it otherwise than generation did);
- at temperature T > 0 an honest token's log p_T has, at its position, the
  expectation ``mean`` and the variance ``var``, so over the answer
  ``z = Σ (logprob − mean) / sqrt(Σ var + Z_VAR_FLOOR)`` (in-support tokens) is
  about standard normal; an answer sampled hotter than asked, or by another
  model, scores its tokens lower than the model expects: implausible when
  ``z < Z_MIN`` over at least ``Z_MIN_TOKENS`` tokens, at the temperatures
  it is calibrated for (``Z_TEMPERATURES``). Also implausible at any temperature: more than
  ``OUTSIDE_BASE + OUTSIDE_SHARE × n`` tokens outside the support, which the
  sampler never draws.

The tolerances are a model's own (``Thresholds``: DESIGN.md "Verifying real
answers", "what honest answers score is calibrated per model and
quantization"): the constants below are SmolLM2-135M-Instruct Q4_1's
(``REFERENCE_THRESHOLDS``, honest answers at T 0, 0.7 and 1 scored by prefill:
``bench/verification.py`` reruns that calibration, its table is in
docs/trust.md); another catalog entry's come from its honest answers
(``trust.verification.calibration``), and an entry without them is not judged.
``Z_MIN_TOKENS`` and ``Z_VAR_FLOOR`` are the statistic's, the same for every
model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GREEDY_MISSES_BASE = 2
"""Tokens below the top an honest answer at temperature 0 may have, plus
``GREEDY_MISSES_SHARE`` of its tokens. Calibrated: honest greedy answers scored
on the same build miss none; evaluating the answer in one batch instead (other
arithmetic, as another device's) flipped near-ties at up to 4 % of tokens;
every cheat's greedy answers missed 29 % or more."""
GREEDY_MISSES_SHARE = 0.10
OUTSIDE_BASE = 2
"""Tokens outside the sampler's support an honest answer may have, plus
``OUTSIDE_SHARE`` of its tokens. Calibrated: honest answers had at most 2 (the
answer's text retokenized otherwise than generation split it), 3 of 6,794
tokens in all."""
OUTSIDE_SHARE = 0.02
Z_MIN = -4.0
"""An answer at T > 0 whose z is below this is implausible. Calibrated: honest
answers' z ranged from −2.1 to 2.1 (90 answers of up to 64 tokens)."""
Z_MIN_TOKENS = 8
"""Fewer scored tokens than this are not judged by ``z`` (only by the support
and, at temperature 0, the misses): one unlikely token an honest sampler drew
weighs too much in so short an answer (an honest 4-token answer at T 0.7
came to z −4.49 in a 900-request run of the honest-host property test)."""
Z_TEMPERATURES = (0.5, 1.0)
"""The temperatures ``z`` is calibrated for (honest answers' z at T 0.1 came
within 0.01 of ``Z_MIN``): an answer sampled outside them (0 < T < 0.5, or
T > 1) is judged by the support alone, which does not depend on the
temperature (the sampler's top-k, top-p and min-p cut the raw distribution)."""
Z_VAR_FLOOR = 1.0
"""Added to Σ var (nats²) under the square root: a short or nearly certain
answer's z is not blown up by a tiny variance."""

SCORE_BOUND = 1e6
"""The largest magnitude a ``logprob`` or ``mean`` may have (nats; at a
temperature of 10⁻⁴ a logit gap of 100 is 10⁶) and, squared, a ``var``: with
at most a few thousand entries every sum stays finite."""

KEYS = frozenset({"rank", "logprob", "mean", "var"})
"""The keys of one ``scores`` entry, exactly."""


@dataclass(frozen=True)
class Thresholds:
    """One catalog entry's tolerances (its pinned weights and quantization):
    at most ``greedy_misses_base + greedy_misses_share × n`` of n tokens below
    the top at temperature 0; at most ``outside_base + outside_share × n``
    outside the support; z (dimensionless) below ``z_min`` implausible at
    temperatures from ``z_low`` to ``z_high`` (None: z judges no temperature,
    the support alone does)."""

    greedy_misses_base: float
    greedy_misses_share: float
    outside_base: float
    outside_share: float
    z_min: float
    z_low: float | None
    z_high: float | None

    def misses_max(self, n: int) -> float:
        """Tokens below the top a greedy answer of ``n`` tokens may have."""
        return self.greedy_misses_base + self.greedy_misses_share * n

    def outside_max(self, n: int) -> float:
        """Tokens outside the support an answer of ``n`` tokens may have."""
        return self.outside_base + self.outside_share * n

    def z_judges(self, temperature: float) -> bool:
        """Whether ``z`` judges an answer sampled at ``temperature``."""
        return (
            self.z_low is not None
            and self.z_high is not None
            and self.z_low <= temperature <= self.z_high
        )


REFERENCE_THRESHOLDS = Thresholds(
    greedy_misses_base=GREEDY_MISSES_BASE,
    greedy_misses_share=GREEDY_MISSES_SHARE,
    outside_base=OUTSIDE_BASE,
    outside_share=OUTSIDE_SHARE,
    z_min=Z_MIN,
    z_low=Z_TEMPERATURES[0],
    z_high=Z_TEMPERATURES[1],
)
"""SmolLM2-135M-Instruct Q4_1's thresholds (the constants above; its catalog
entry's calibration, written by ``trust`` migration 0001)."""


@dataclass(frozen=True)
class TokenScore:
    """One answer token as the verifier scored it (a ``scores`` frame entry):
    ``rank`` >= 0 among the raw logits, ``logprob`` (nats, <= 0) under p_T or
    None outside the support, the position's ``mean`` (nats) and ``var``
    (nats²) of log p_T."""

    rank: int
    logprob: float | None
    mean: float
    var: float


@dataclass(frozen=True)
class Plausibility:
    """The judge's verdict on one answer: ``n`` tokens scored, ``z`` (0.0 when
    no token is in the support), ``misses`` (tokens with rank > 0),
    ``outside`` (tokens outside the support) and ``detail``, a sentence saying
    why (for the device's record and logs)."""

    plausible: bool
    n: int
    z: float
    misses: int
    outside: int
    detail: str


def _number(entry: dict[str, Any], key: str, index: int) -> float:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"tokens[{index}].{key} must be a number")
    if not math.isfinite(value):
        raise ValueError(f"tokens[{index}].{key} must be finite")
    return float(value)


def token_scores_parse(raw: Any, *, max_tokens: int) -> list[TokenScore]:
    """The ``tokens`` of a ``scores`` frame as ``TokenScore``s, in order.

    ``max_tokens``: the most entries accepted (the agent scores at most the
    verified offer's ``max_tokens``). Raises ``ValueError`` naming what is
    wrong: not a list, too many entries, an entry that is not an object with
    exactly ``rank``, ``logprob``, ``mean``, ``var``, a rank that is not an
    integer >= 0, a number that is not finite, a logprob or mean above 0 or a
    negative var (beyond float rounding), a number past ``SCORE_BOUND``.
    """
    if not isinstance(raw, list):
        raise ValueError("tokens must be a list")
    if len(raw) > max_tokens:
        raise ValueError(f"tokens has {len(raw)} entries, more than {max_tokens}")
    scores = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ValueError(f"tokens[{index}] must be an object")
        if set(entry) != KEYS:
            raise ValueError(
                f"tokens[{index}] must have exactly the keys "
                f"{', '.join(sorted(KEYS))} (has {', '.join(sorted(map(str, entry)))})"
            )
        rank = entry["rank"]
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"tokens[{index}].rank must be an integer >= 0")
        logprob = None
        if entry["logprob"] is not None:
            logprob = _number(entry, "logprob", index)
            if logprob > 1e-6:
                raise ValueError(f"tokens[{index}].logprob must be <= 0")
        mean = _number(entry, "mean", index)
        var = _number(entry, "var", index)
        if mean > 1e-6:
            raise ValueError(f"tokens[{index}].mean must be <= 0")
        if var < -1e-6:
            raise ValueError(f"tokens[{index}].var must be >= 0")
        if min(mean, logprob or 0.0) < -SCORE_BOUND or var > SCORE_BOUND**2:
            raise ValueError(
                f"tokens[{index}]: logprob and mean must be >= {-SCORE_BOUND:g},"
                f" var <= {SCORE_BOUND**2:g}"
            )
        scores.append(TokenScore(rank=rank, logprob=logprob, mean=mean, var=var))
    return scores


@dataclass(frozen=True)
class AnswerStats:
    """What a verifier's scores say of an answer, before any threshold:
    ``n`` tokens scored, ``z`` (0.0 with none in the support), ``misses``
    (rank > 0), ``outside`` (outside the support)."""

    n: int
    z: float
    misses: int
    outside: int


def answer_stats(tokens: list[TokenScore]) -> AnswerStats:
    """``tokens``' statistics (the module docstring's z, misses, outside).
    Raises ``ValueError`` when ``z`` is not finite (numbers past what
    ``token_scores_parse`` admits)."""
    n = len(tokens)
    misses = sum(1 for token in tokens if token.rank > 0)
    inside = [token for token in tokens if token.logprob is not None]
    z = 0.0
    if inside:
        gap = sum(t.logprob - t.mean for t in inside)  # type: ignore[operator]
        z = gap / math.sqrt(sum(max(0.0, t.var) for t in inside) + Z_VAR_FLOOR)
        if not math.isfinite(z):
            raise ValueError(f"z is not finite ({z}): scores no model gives")
    return AnswerStats(n=n, z=z, misses=misses, outside=n - len(inside))


def answer_plausible(
    *, temperature: float, tokens: list[TokenScore], thresholds: Thresholds
) -> Plausibility:
    """Judge an answer's ``tokens`` (scored under ``temperature``, the verified
    request's; <= 0 is greedy) by the rules of this module's docstring with
    its model's ``thresholds`` (never another model's: an entry without
    calibration is not judged, ``trust.verification.calibration``). An
    answer with no token scored is plausible (nothing to judge).

    Raises ``ValueError`` when ``z`` is not finite (numbers past what
    ``token_scores_parse`` admits)."""
    stats = answer_stats(tokens)
    n, z, misses, outside = stats.n, stats.z, stats.misses, stats.outside
    outside_max = thresholds.outside_max(n)
    greedy = temperature <= 0
    z_judged = thresholds.z_judges(temperature)
    misses_max = thresholds.misses_max(n)
    z_min = thresholds.z_min
    if n == 0:
        plausible, detail = True, "no token to judge"
    elif outside > outside_max:
        plausible = False
        detail = (
            f"{outside} of {n} tokens outside the sampler's support "
            f"(most {outside_max:g})"
        )
    elif greedy and misses > misses_max:
        plausible = False
        detail = (
            f"{misses} of {n} tokens not the model's top at temperature 0 "
            f"(most {misses_max:g})"
        )
    elif z_judged and n >= Z_MIN_TOKENS and z < z_min:
        plausible = False
        detail = (
            f"z {z:.2f} below {z_min:g} at temperature {temperature:g} "
            f"({n} tokens)"
        )
    else:
        plausible = True
        detail = (
            f"{misses} of {n} tokens below the top (most {misses_max:g})"
            if greedy
            else f"z {z:.2f} at temperature {temperature:g} ({n} tokens)"
        ) + f", {outside} outside the support"
    return Plausibility(
        plausible=plausible, n=n, z=z, misses=misses, outside=outside, detail=detail
    )
