"""Checks of verifiers: verifications whose verdict the coordinator knows
(DESIGN.md "Verifying real answers"; docs/trust.md "Who checks the verifiers").

A verifier's word decides whether a host fails, and its pay does not depend
on having scored anything; so its word is checked as a host's work is. A check
is a ``verify`` like any other, on the conversation of a calibrated spot-check
prompt never sent to the verifier's owner, with either the reference model's
own answer (plausible) or a decoy (``decoys``: the model's answer sampled
hotter, another prompt's answer, or its answer with other words in it), at the
check's temperature
(``CHECK_TEMPERATURES``); the reference model judged both at calibration
(``check_calibrate``) with a margin (``clearly``). Which of the two is sent is
drawn with ``secrets``; a verifier that judges as the reference model passed,
otherwise it fails a check of its honesty (``services.device_check_failed``:
score, held earnings reversed, quarantine judged).

Checks are planned on their own clock (``verifier_checks_plan``, Celery
beat): a verifying device is sent one every ``BALLAST_VERIFIER_CHECK_NEW_EVERY_S``
on average while it has passed fewer than ``BALLAST_VERIFIER_TRUST_PASSES``
in a row, then every ``BALLAST_VERIFIER_CHECK_EVERY_S``, at random moments
(the lease loop's poke sends them, ``verifier_checks_take_due``), so nothing
in their timing, or in a quiet spell, tells them from real ones. A trusted verifier (``trusted``) is the only kind a
round 2 goes to while one is live (``records.verification_open``), and the only
kind whose plausible verdicts lower a device's suspicion (``rate``).
"""

from __future__ import annotations

import copy
import logging
import random
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from hosts.liveness import live_q
from hosts.models import Device, DeviceModel
from hosts.services import device_outcome_record

from ..models import CanaryPrompt, Job, SpotCheck, Verification
from ..tokens import token_count
from ..services.checks import device_check_failed
from .offers import verify_frame
from .plausibility import (
    GREEDY_MISSES_BASE,
    GREEDY_MISSES_SHARE,
    OUTSIDE_BASE,
    OUTSIDE_SHARE,
    Z_MIN,
    Plausibility,
)

log = logging.getLogger("ballast.jobs")

CHECK_TEMPERATURES = (0.0, 0.7, 1.0)
"""The temperatures a check is scored at when the model has no traffic yet."""
DECOY_TEMPERATURE = 1.6
"""The temperature a decoy answer is sampled at: fluent enough not to be told
from a real answer by its look, far enough from the model to be implausible."""
CHECK_MIN_CHARS = 24
"""The shortest reference answer a check is made of (a few tokens are judged
leniently: they may not tell a decoy from the model's answer)."""
CANDIDATES = 256
"""Prompts considered for one check (the least used first, then one at random),
and answers of other prompts a decoy is drawn from."""
DECOY_OTHERS = 3
"""Other prompts' answers tried as a decoy, before one with words of theirs."""

Judge = Callable[[CanaryPrompt, str, float], Plausibility]
"""The reference model's verdict on an answer of a pool row at a temperature."""
Sampler = Callable[[CanaryPrompt, float], str]
"""The reference model's answer to a pool row sampled at a temperature."""


def trusted(device: Device) -> bool:
    """Whether ``device`` has passed ``BALLAST_VERIFIER_TRUST_PASSES`` checks
    as a verifier since its last failed one."""
    return device.verifier_passes >= settings.BALLAST_VERIFIER_TRUST_PASSES


CHECK_MARGIN_BASE = 2
"""How far past the judge's tolerance a check's answer must be (in tokens
missed or outside the support, in z), plus ``CHECK_MARGIN_SHARE`` of its
tokens: farther than another honest device's arithmetic can move it (near-ties
flipped at up to 4 % of tokens in the calibration, docs/trust.md)."""
CHECK_MARGIN_SHARE = 0.05


def clearly(judged: Plausibility, *, temperature: float, plausible: bool) -> bool:
    """Whether the reference model's ``judged`` verdict is ``plausible`` (or
    not) with the margin ``CHECK_MARGIN_BASE + CHECK_MARGIN_SHARE × n`` past
    each of the judge's tolerances (``plausibility``; a plausible answer's
    misses and outside tokens within the tolerance less the margin, none when
    that is below 0)."""
    n = judged.n
    margin = CHECK_MARGIN_BASE + CHECK_MARGIN_SHARE * n
    misses_max = GREEDY_MISSES_BASE + GREEDY_MISSES_SHARE * n
    outside_max = OUTSIDE_BASE + OUTSIDE_SHARE * n
    greedy = temperature <= 0
    if plausible:
        return (
            judged.plausible
            and judged.outside <= max(0.0, outside_max - margin)
            and (
                judged.misses <= max(0.0, misses_max - margin)
                if greedy
                else judged.z >= Z_MIN + margin
            )
        )
    return judged.outside >= outside_max + margin or (
        judged.misses >= misses_max + margin if greedy else judged.z <= Z_MIN - margin
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
    from .records import VERIFY_MAX_TEMPERATURE, VERIFY_MIN_TEMPERATURE

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
    *, row: CanaryPrompt, judge: Judge, sample: Sampler, others: list[str]
) -> bool:
    """Make a calibrated pool row a check of verifiers: draw its temperature
    (``traffic_temperature``), keep it when the reference model finds its own
    answer ``clearly`` plausible there and one of its ``decoys`` (``others``:
    other prompts' answers; none longer than the row's ``max_tokens``)
    ``clearly`` implausible. Stores
    ``check_temperature`` (tried) and ``decoy_output`` (blank: no check);
    returns whether it became one."""
    temperature = traffic_temperature(row.model_id)
    row.check_temperature, row.decoy_output = temperature, ""
    reference = row.reference_output
    max_tokens = row.params.get("max_tokens") or 256
    if len(reference) >= CHECK_MIN_CHARS and clearly(
        judge(row, reference, temperature), temperature=temperature, plausible=True
    ):
        for decoy in decoys(row, sample=sample, others=others):
            if not decoy.strip() or decoy == reference:
                continue
            if (token_count(row.model_id, decoy) or max_tokens + 1) > max_tokens:
                continue  # (a verifier scores at most max_tokens of it)
            if clearly(
                judge(row, decoy, temperature), temperature=temperature, plausible=False
            ):
                row.decoy_output = decoy
                break
    row.save(update_fields=["check_temperature", "decoy_output"])
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
    were tried; returns how many became checks."""
    import time

    calibrated = CanaryPrompt.objects.filter(
        model_id=model_id, status=CanaryPrompt.Status.CALIBRATED
    )
    answers = list(calibrated.values_list("id", "reference_output")[:CANDIDATES])
    made = 0
    untried = calibrated.filter(check_temperature__isnull=True).order_by("id")
    for row in untried[:tries].iterator() if tries else untried.iterator():
        if deadline is not None and time.monotonic() >= deadline:
            break
        others = [text for pk, text in answers if pk != row.id and text]
        rng = random.Random(secrets.randbits(64))
        rng.shuffle(others)
        made += check_calibrate(row=row, judge=judge, sample=sample, others=others)
    return made


def engine_judge(engine) -> Judge:
    """A ``Judge`` scoring with ``engine`` (the agent's llama.cpp engine,
    loaded) by prefill, judged by ``plausibility.answer_plausible`` (its own
    event loop: call it from synchronous code)."""
    import asyncio

    from agent.engines.base import GenerationRequest

    from .plausibility import answer_plausible, token_scores_parse

    def judge(row: CanaryPrompt, answer: str, temperature: float) -> Plausibility:
        params = {**row.params, "temperature": temperature}
        request = GenerationRequest(
            model=row.model_id, messages=row.messages, prompt=row.prompt, params=params
        )
        scores = asyncio.run(engine.score(request, answer))
        entries = [token.frame() for token in scores.tokens]
        tokens = token_scores_parse(entries, max_tokens=len(entries))
        return answer_plausible(temperature=temperature, tokens=tokens)

    return judge


def engine_sampler(engine) -> Sampler:
    """A ``Sampler`` generating with ``engine`` (loaded)."""
    from ..canarypool import engine_answerer

    answer = engine_answerer(engine)

    def sample(row: CanaryPrompt, temperature: float) -> str:
        hot = copy.copy(row)
        hot.params = {**row.params, "temperature": temperature, "seed": None}
        return answer(hot)[0]

    return sample


PLAN_EVERY_S = 60.0
"""How often Celery beat runs ``verifier_checks_plan`` (ballast/celery.py)."""


def verifier_checks_plan(*, now: datetime | None = None, every_s: float = PLAN_EVERY_S) -> int:
    """Plan checks of verifiers on their own clock (Celery beat, every
    ``every_s``): each live device whose machine says it verifies, with no
    check planned, gets one with the chance ``every_s`` over its mean gap
    (``BALLAST_VERIFIER_CHECK_NEW_EVERY_S`` while it is not trusted,
    ``BALLAST_VERIFIER_CHECK_EVERY_S`` once it is), drawn with ``secrets``,
    due at a moment drawn within the next ``every_s``. Real verifications play
    no part, so neither a check's timing nor a quiet spell tells a verifier
    which ``verify`` is real. Returns how many were planned (nothing with
    ``BALLAST_VERIFIER_CHECKS`` off)."""
    if not settings.BALLAST_VERIFIER_CHECKS:
        return 0
    now = now or timezone.now()
    trust = settings.BALLAST_VERIFIER_TRUST_PASSES
    planned = 0
    for device_id, passes in Device.objects.filter(
        live_q(now, prefix="machine__"),
        machine__verifies=True,
        retired_at__isnull=True,
        quarantined=False,
        verifier_check_due_at__isnull=True,
    ).values_list("id", "verifier_passes"):
        gap = (
            settings.BALLAST_VERIFIER_CHECK_EVERY_S
            if passes >= trust
            else settings.BALLAST_VERIFIER_CHECK_NEW_EVERY_S
        )
        if secrets.randbelow(10**6) >= min(1.0, every_s / gap) * 10**6:
            continue
        delay = timedelta(milliseconds=secrets.randbelow(int(every_s * 1000) + 1))
        planned += Device.objects.filter(
            id=device_id, verifier_check_due_at__isnull=True
        ).update(verifier_check_due_at=now + delay)
    return planned


def check_canary_pick(*, verifier: Device) -> CanaryPrompt | None:
    """A check for ``verifier``: a pool row of a model it has loaded, made a
    check, never sent to its owner (as a spot check or a check), one of the
    ``CANDIDATES`` least used drawn with ``secrets``; counted as sent."""
    owner = verifier.machine.owner_id
    models = DeviceModel.objects.filter(device=verifier, loaded=True).values("model_id")
    seen_checks = Verification.objects.filter(
        canary__isnull=False, verifier__machine__owner_id=owner
    ).values("canary_id")
    seen_spot = SpotCheck.objects.filter(device__machine__owner_id=owner).values(
        "canary_id"
    )
    ids = list(
        CanaryPrompt.objects.filter(
            model_id__in=models,
            status=CanaryPrompt.Status.CALIBRATED,
            check_temperature__isnull=False,
        )
        .exclude(decoy_output="")
        .exclude(id__in=seen_checks)
        .exclude(id__in=seen_spot)
        .order_by("sent_count", "id")
        .values_list("id", flat=True)[:CANDIDATES]
    )
    if not ids:
        return None
    chosen = secrets.choice(ids)
    CanaryPrompt.objects.filter(id=chosen).update(sent_count=F("sent_count") + 1)
    return CanaryPrompt.objects.get(id=chosen)


@transaction.atomic
def verifier_checks_take_due(
    *, machine_id: str, now: datetime | None = None
) -> list[tuple[str, dict]]:
    """The checks due on machine ``machine_id``'s devices (their
    ``verifier_check_due_at`` passed; each taken once, compare-and-set),
    stored ``offered`` and sent now: [(verification id hex, ``verify``
    frame)]. A device with no check left for it, retired, or whose machine
    no longer says it verifies gets none (its next verification plans again)."""
    now = now or timezone.now()
    taken = []
    for device in Device.objects.filter(
        machine_id=machine_id, verifier_check_due_at__lte=now
    ).select_related("machine"):
        if not Device.objects.filter(
            id=device.id, verifier_check_due_at=device.verifier_check_due_at
        ).update(verifier_check_due_at=None):
            continue
        if not device.machine.verifies or device.retired_at is not None:
            continue  # (its latest hello no longer says it verifies)
        canary = check_canary_pick(verifier=device)
        if canary is None:
            continue
        ver = Verification.objects.create(
            canary=canary,
            expected_plausible=secrets.randbelow(2) == 1,
            verifier=device,
            verifier_trusted=trusted(device),
            status=Verification.Status.OFFERED,
            offered_at=now,
            sent_at=now,
        )
        taken.append((ver.id.hex, verify_frame(ver=ver, device_index=device.index)))
    return taken


def check_judged(ver: Verification, judged: Plausibility, now: datetime) -> bool:
    """A check ``ver``'s scores were judged ``judged``: passed when the verdict
    is the reference model's (``expected_plausible``): a success on the
    verifier's score and one more pass; else a failed check of its honesty
    and its passes back to 0. Saves ``ver``; returns whether it passed."""
    passed = judged.plausible == ver.expected_plausible
    ver.verdict = Verification.Verdict.PASSED if passed else Verification.Verdict.FAILED
    ver.save()
    model_id = ver.canary.model_id
    if passed:
        Device.objects.filter(id=ver.verifier_id).update(
            verifier_passes=F("verifier_passes") + 1
        )
        device_outcome_record(  # (not a spot check: no suspicion decays by it)
            device_id=ver.verifier_id,
            success=True,
            reason="verifier_check_passed",
            model_id=model_id,
            now=now,
        )
        return True
    verifier_distrust(
        verifier_id=ver.verifier_id,
        model_id=model_id,
        detail=f"a check of its verifying: judged {'plausible' if judged.plausible else 'implausible'}"
        f" an answer the reference model finds {'plausible' if ver.expected_plausible else 'implausible'}"
        f" ({judged.detail})",
        now=now,
    )
    return False


def verifier_distrust(*, verifier_id: int, model_id: str, detail: str, now: datetime) -> None:
    """A verifier's word was found false (a failed check, or a round 1
    contradicted by a trusted round 2): a failed check of its honesty
    (``services.device_check_failed``) and its passes back to 0."""
    Device.objects.filter(id=verifier_id).update(verifier_passes=0)
    device_check_failed(device_id=verifier_id, model_id=model_id, detail=detail, now=now)
