"""The verification judge's pure rules (``trust.verification.plausibility``) on
hand-built scores, and its parser's refusals. The real model's scores are in
tests/agent/test_verify.py; the calibration in bench/verification.py."""

from __future__ import annotations

import math

import pytest

from trust.verification.plausibility import (
    GREEDY_MISSES_BASE,
    GREEDY_MISSES_SHARE,
    OUTSIDE_BASE,
    OUTSIDE_SHARE,
    REFERENCE_THRESHOLDS,
    Z_MIN,
    Plausibility,
    TokenScore,
    token_scores_parse,
)
from trust.verification.plausibility import answer_plausible as judged


def answer_plausible(*, temperature: float, tokens: list[TokenScore]) -> Plausibility:
    """The judge with SmolLM2's thresholds (the constants these tests name)."""
    return judged(temperature=temperature, tokens=tokens, thresholds=REFERENCE_THRESHOLDS)


def greedy_tokens(n: int, misses: int) -> list[TokenScore]:
    """``n`` tokens at temperature 0, the first ``misses`` ranked 1 (in the
    support), the rest the top."""
    return [
        TokenScore(rank=1 if i < misses else 0, logprob=-1.0 if i < misses else -0.1,
                   mean=-0.5, var=0.5)
        for i in range(n)
    ]  # fmt: skip


def test_greedy_answers_are_judged_by_their_misses() -> None:
    n = 40
    allowed = math.floor(GREEDY_MISSES_BASE + GREEDY_MISSES_SHARE * n)
    ok = answer_plausible(temperature=0, tokens=greedy_tokens(n, allowed))
    assert ok.plausible and ok.misses == allowed and ok.n == n, ok
    bad = answer_plausible(temperature=0, tokens=greedy_tokens(n, allowed + 1))
    assert not bad.plausible and "not the model's top" in bad.detail


def test_an_answer_outside_the_support_is_implausible_at_any_temperature() -> None:
    n = 40
    allowed = math.floor(OUTSIDE_BASE + OUTSIDE_SHARE * n)
    for temperature in (0, 0.2, 0.7, 1.0, 1.8):
        tokens = [
            TokenScore(rank=0 if i >= allowed + 1 else 99, mean=-1.0, var=1.0,
                       logprob=-1.0 if i >= allowed + 1 else None)
            for i in range(n)
        ]  # fmt: skip
        verdict = answer_plausible(temperature=temperature, tokens=tokens)
        assert not verdict.plausible and verdict.outside == allowed + 1, verdict
        assert "outside the sampler's support" in verdict.detail


def test_sampled_answers_are_judged_by_z() -> None:
    """z = Σ(logprob − mean) / sqrt(Σ var + floor): tokens as likely as the
    model expects give z 0; tokens each one standard deviation below give
    z ≈ −sqrt(n), implausible for a long answer."""
    n = 64
    typical = [TokenScore(rank=1, logprob=-2.0, mean=-2.0, var=1.0)] * n
    verdict = answer_plausible(temperature=0.7, tokens=typical)
    assert verdict.plausible and verdict.z == 0.0, verdict
    low = [TokenScore(rank=3, logprob=-3.0, mean=-2.0, var=1.0)] * n
    verdict = answer_plausible(temperature=0.7, tokens=low)
    assert verdict.z == pytest.approx(-n / math.sqrt(n + 1.0))
    assert verdict.z < Z_MIN and not verdict.plausible
    assert "below" in verdict.detail
    # the same tokens at temperature 0 are judged by rank, not z
    assert not answer_plausible(temperature=0, tokens=low).plausible


def test_outside_the_calibrated_temperatures_only_the_support_judges() -> None:
    """z is calibrated from 0.5 to 1 (``Z_TEMPERATURES``): an answer sampled
    at 0.2 or 1.8 (verified with its host's ids since fresh-eyes review 3)
    is judged by the support alone, which the temperature does not move."""
    low = [TokenScore(rank=3, logprob=-3.0, mean=-2.0, var=1.0)] * 64
    for temperature in (0.2, 1.8):
        verdict = answer_plausible(temperature=temperature, tokens=low)
        assert verdict.z < Z_MIN and verdict.plausible, verdict


def test_a_short_answer_is_not_condemned_by_a_tiny_variance() -> None:
    """A nearly certain position (var ≈ 0): the floor keeps z finite and small."""
    tokens = [TokenScore(rank=1, logprob=-0.5, mean=-0.01, var=1e-6)] * 3
    verdict = answer_plausible(temperature=1.0, tokens=tokens)
    assert verdict.plausible and verdict.z > Z_MIN, verdict


def test_no_token_is_plausible() -> None:
    verdict = answer_plausible(temperature=0.7, tokens=[])
    assert verdict.plausible and verdict.n == 0


def entry(**change) -> dict:
    return {"rank": 0, "logprob": -0.25, "mean": -0.5, "var": 0.75, **change}


def test_it_parses_the_scores_entries() -> None:
    tokens = token_scores_parse([entry(), entry(rank=3, logprob=None)], max_tokens=2)
    assert tokens == [
        TokenScore(rank=0, logprob=-0.25, mean=-0.5, var=0.75),
        TokenScore(rank=3, logprob=None, mean=-0.5, var=0.75),
    ]


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"rank": 0}, "tokens must be a list"),
        ([entry()] * 3, "tokens has 3 entries, more than 2"),
        (["x"], "tokens[0] must be an object"),
        ([entry(), {"rank": 0, "logprob": 0.0, "mean": 0.0}], "tokens[1] must have exactly"),
        ([entry(extra=1)], "tokens[0] must have exactly"),
        ([entry(rank=-1)], "tokens[0].rank must be an integer >= 0"),
        ([entry(rank=1.5)], "tokens[0].rank must be an integer >= 0"),
        ([entry(rank=True)], "tokens[0].rank must be an integer >= 0"),
        ([entry(logprob="x")], "tokens[0].logprob must be a number"),
        ([entry(mean=float("nan"))], "tokens[0].mean must be finite"),
        ([entry(var=float("inf"))], "tokens[0].var must be finite"),
        ([entry(logprob=float("-inf"))], "tokens[0].logprob must be finite"),
        ([entry(logprob=0.5)], "tokens[0].logprob must be <= 0"),
        ([entry(mean=0.5)], "tokens[0].mean must be <= 0"),
        ([entry(var=-1.0)], "tokens[0].var must be >= 0"),
    ],
)
def test_it_refuses_malformed_scores_naming_what_is_wrong(raw, named) -> None:
    with pytest.raises(ValueError) as refused:
        token_scores_parse(raw, max_tokens=2)
    assert named in str(refused.value)


def test_a_short_sampled_answer_is_not_judged_by_z() -> None:
    """One unlikely token an honest sampler drew weighs too much in an
    answer of fewer than ``Z_MIN_TOKENS`` tokens (an honest 4-token answer at
    T 0.7 came to z −4.49): only the support judges it; from
    ``Z_MIN_TOKENS`` on, z does."""
    from trust.verification.plausibility import Z_MIN_TOKENS

    unlikely = TokenScore(rank=30, logprob=-9.0, mean=-1.0, var=1.5)
    usual = TokenScore(rank=0, logprob=-0.5, mean=-1.0, var=1.5)
    short = [unlikely, unlikely, usual]
    verdict = answer_plausible(temperature=0.7, tokens=short)
    assert verdict.z < Z_MIN and verdict.plausible, verdict
    long_low = [unlikely] * Z_MIN_TOKENS
    assert not answer_plausible(temperature=0.7, tokens=long_low).plausible
