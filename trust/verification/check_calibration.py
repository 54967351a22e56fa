"""Making checks of verifiers (``trust.verification.checks``) out of the
spot-check pool, on the reference model (the beat's pool top-up,
``trust.canarypool.canary_pool_top_up``, and ``canary_calibrate``, with the judge
and sampler of ``refengine.engines.engine_checks``): each row's
own answer must be ``clearly`` plausible and a decoy ``clearly`` implausible,
at the temperature of a recent real job (docs/trust.md "Who checks the
verifiers")."""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable

from jobs.models import CanaryPrompt, Job
from jobs.tokens import token_count

from .calibration import thresholds_of
from .plausibility import Z_MIN_TOKENS, Plausibility, Thresholds
from .records import VERIFY_MAX_TEMPERATURE, VERIFY_MIN_TEMPERATURE

CHECK_TEMPERATURES = (0.0, 0.7, 1.0)
"""The temperatures a check is scored at when the model has no traffic yet."""
DECOY_TEMPERATURE = 1.6
"""The temperature a decoy answer is sampled at: fluent enough not to be told
from a real answer by its look, far enough from the model to be implausible."""
CHECK_MIN_CHARS = 24
"""The shortest reference answer a check is made of (a few tokens are judged
leniently: they may not tell a decoy from the model's answer)."""
OTHERS = 256
"""Answers of other prompts a decoy is drawn from."""
DECOY_OTHERS = 3
"""Other prompts' answers tried as a decoy, before one with words of theirs."""

Judge = Callable[[CanaryPrompt, str, float], Plausibility]
"""The reference model's verdict on an answer of a pool row at a temperature."""
Sampler = Callable[[CanaryPrompt, float], str]
"""The reference model's answer to a pool row sampled at a temperature."""


CHECK_MARGIN_BASE = 2
"""How far past the judge's tolerance a check's answer must be (in tokens
missed or outside the support, in z), plus ``CHECK_MARGIN_SHARE`` of its
tokens: farther than another honest device's arithmetic can move it (near-ties
flipped at up to 4 % of tokens in the calibration, docs/trust.md)."""
CHECK_MARGIN_SHARE = 0.05


def clearly(
    judged: Plausibility, *, temperature: float, plausible: bool, thresholds: Thresholds
) -> bool:
    """Whether the reference model's ``judged`` verdict is ``plausible`` (or
    not) with the margin ``CHECK_MARGIN_BASE + CHECK_MARGIN_SHARE × n`` past
    each of the judge's tolerances (the model's ``thresholds``; a plausible
    answer's misses and outside tokens within the tolerance less the margin,
    none when that is below 0)."""
    n = judged.n
    margin = CHECK_MARGIN_BASE + CHECK_MARGIN_SHARE * n
    misses_max = thresholds.misses_max(n)
    outside_max = thresholds.outside_max(n)
    z_min = thresholds.z_min
    greedy = temperature <= 0
    if plausible:
        return (
            judged.plausible
            and judged.outside <= max(0.0, outside_max - margin)
            and (
                judged.misses <= max(0.0, misses_max - margin)
                if greedy
                else n < Z_MIN_TOKENS or judged.z >= z_min + margin
            )
        )
    return judged.outside >= outside_max + margin or (
        judged.misses >= misses_max + margin
        if greedy
        else n >= Z_MIN_TOKENS and judged.z <= z_min - margin
    )


def substituted(text: str, words: list[str]) -> str:
    """``text`` with every other word (from one drawn with ``secrets``)
    replaced by one of ``words`` drawn with ``secrets`` (a decoy)."""
    out = text.split()
    rng = random.Random(secrets.randbits(64))
    for i in range(rng.randrange(2), len(out), 2):
        out[i] = rng.choice(words)
    return " ".join(out)


TRAFFIC_JOBS = 500
"""Recent real jobs a check's temperature is drawn from."""


def traffic_temperature(model_id: str) -> float:
    """A temperature for a check of ``model_id``: that of one of its
    ``TRAFFIC_JOBS`` latest renters' jobs whose answer could be verified
    (``records.verifiable``'s range), drawn with ``secrets``; else one of
    ``CHECK_TEMPERATURES``. So a check's temperature is one real traffic has."""
    seen = []
    for params in (
        Job.objects.filter(model_id=model_id, is_spot_check=False, renter__isnull=False)
        .order_by("-created_at")
        .values_list("params", flat=True)[:TRAFFIC_JOBS]
    ):
        value = (params or {}).get("temperature")
        t = 1.0 if value is None else float(value)
        if t == 0 or VERIFY_MIN_TEMPERATURE <= t <= VERIFY_MAX_TEMPERATURE:
            seen.append(t)
    return secrets.choice(seen or CHECK_TEMPERATURES)


def decoys(row: CanaryPrompt, *, sample: Sampler, others: list[str]) -> list[str]:
    """Decoy answers for a check of ``row``, the most fluent first: the model's
    answer sampled hotter (``DECOY_TEMPERATURE``), other prompts' answers
    (``others``), then the reference answer with words of theirs in it."""
    words = [w for text in others for w in text.split()] or row.reference_output.split()
    return [
        sample(row, DECOY_TEMPERATURE),
        *others[:DECOY_OTHERS],
        substituted(row.reference_output, words),
    ]


def check_calibrate(
    *,
    row: CanaryPrompt,
    judge: Judge,
    sample: Sampler,
    others: list[str],
    thresholds: Thresholds,
) -> bool:
    """Make a calibrated pool row a check of verifiers: draw its temperature
    (``traffic_temperature``), sample the model's own answer there
    (``check_output``; at 0 the greedy ``reference_output``), keep it when the
    reference model finds that ``clearly`` plausible and one of its ``decoys`` (``others``:
    other prompts' answers; none longer than the row's ``max_tokens``)
    ``clearly`` implausible (by the model's ``thresholds``). Stores
    ``check_temperature`` (tried),
    ``check_output`` and ``decoy_output`` (blank: no check); returns whether
    it became one."""
    temperature = traffic_temperature(row.model_id)
    row.check_temperature, row.decoy_output = temperature, ""
    # the plausible answer: the model's own at that temperature (a greedy one
    # at T > 0 would tell a check from a sampled real answer)
    row.check_output = (
        row.reference_output if temperature <= 0 else sample(row, temperature)
    )
    max_tokens = row.params.get("max_tokens") or 256

    def fits(text: str) -> bool:  # (a verifier scores at most max_tokens of it)
        return bool(text.strip()) and (
            token_count(row.model_id, text) or max_tokens + 1
        ) <= max_tokens

    honest = row.check_output
    if (
        len(honest) >= CHECK_MIN_CHARS
        and fits(honest)
        and clearly(
            judge(row, honest, temperature),
            temperature=temperature,
            plausible=True,
            thresholds=thresholds,
        )
    ):
        for decoy in decoys(row, sample=sample, others=others):
            if decoy == honest or not fits(decoy):
                continue
            if clearly(
                judge(row, decoy, temperature),
                temperature=temperature,
                plausible=False,
                thresholds=thresholds,
            ):
                row.decoy_output = decoy
                break
    row.save(update_fields=["check_temperature", "check_output", "decoy_output"])
    return bool(row.decoy_output)


def checks_calibrate(
    *,
    model_id: str,
    judge: Judge,
    sample: Sampler,
    deadline: float | None = None,
    tries: int | None = None,
) -> int:
    """Calibrate checks from the model's pool rows not tried yet
    (``check_calibrate``, other rows' answers drawn with ``secrets`` as
    ``others``) until ``deadline`` (``time.monotonic()``) or ``tries`` rows
    were tried; returns how many became checks. None while the model's
    verification is not calibrated (``calibration.thresholds_of``): a check's
    verdict is judged by its thresholds."""
    thresholds = thresholds_of(model_id)
    if thresholds is None:
        return 0
    calibrated = CanaryPrompt.objects.filter(
        model_id=model_id, status=CanaryPrompt.Status.CALIBRATED
    )
    answers = list(calibrated.values_list("id", "reference_output")[:OTHERS])
    made = 0
    untried = calibrated.filter(check_temperature__isnull=True).order_by("id")
    for row in untried[:tries].iterator() if tries else untried.iterator():
        if deadline is not None and time.monotonic() >= deadline:
            break
        others = [text for pk, text in answers if pk != row.id and text]
        rng = random.Random(secrets.randbits(64))
        rng.shuffle(others)
        made += check_calibrate(
            row=row, judge=judge, sample=sample, others=others, thresholds=thresholds
        )
    return made
