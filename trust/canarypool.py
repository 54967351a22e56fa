"""The spot-check pool of each model: drawn, calibrated on the reference model,
kept ahead of the fleet's need, and picked so no host sees a prompt twice
(DESIGN.md "Spot checks").

Prompts come from ``trust.canarygen`` under the deployment's secret, each in the
shape of one recent real job of the model (``shape_sample``: its endpoint,
message count, system prompt, length, ``max_tokens``, ``top_p``, ``stop``,
``seed`` and ``stream``), always at temperature 0 so that the right answer is
exact. A prompt joins the pool only once the reference model gives its right
answer: the engine registered by the ``refengine`` app (the agent's own
llama.cpp engine, on the Celery worker; ``ReferenceEngines``), the one seam
through which coordinator-side code runs a model (issue 31 item 4 replaces it
with answers agreed by the fleet). Celery beat
tops the pool up (``canary_pool_top_up``) so that each model keeps at least a
day's checks (and ``BALLAST_CANARY_POOL_AHEAD``) never sent.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.db.models.functions import Coalesce
from django.utils import timezone

from catalog.models import CatalogModel
from hosts.models import Device
from jobs.models import CanaryPrompt, Job, SpotCheck, Verification

from .canaries import answer_right
from .canarygen import MAX_CHARS, Shape, canary_draw
from .canaryvocab import vocab_load
from .verification.check_calibration import Judge, Sampler, checks_calibrate

log = logging.getLogger("ballast.spotchecks")

CALIBRATION_MAX_TOKENS = 160
"""Tokens the reference model generates at most per calibration (a prompt whose
judging needs more of its answer than that is rejected)."""
BATCH = 4
"""Prompts drawn at a time by a top-up (then calibrated before the next batch)."""

Answerer = Callable[[CanaryPrompt], tuple[str, str]]
"""Gives the reference model's answer to a pool row: (text, finish_reason)."""


def canary_secret() -> bytes:
    """The pool's secret: ``BALLAST_CANARY_SECRET``, else one derived from
    ``SECRET_KEY`` (HMAC-SHA256), which production requires to be set."""
    if settings.BALLAST_CANARY_SECRET:
        return settings.BALLAST_CANARY_SECRET.encode()
    return hmac.new(
        settings.SECRET_KEY.encode(), b"ballast canary pool", hashlib.sha256
    ).digest()


def shape_of(job: Job) -> Shape:
    """The shape of one real job (``trust.canarygen.Shape``)."""
    params = job.params or {}
    messages = job.messages or []
    text = job.prompt or "".join(str(m.get("content", "")) for m in messages)
    temperature = params.get("temperature")
    return Shape(
        endpoint=job.endpoint,
        messages=sum(1 for m in messages if m.get("role") != "system") or 1,
        system=any(m.get("role") == "system" for m in messages),
        chars=min(len(text), MAX_CHARS),
        max_tokens=params.get("max_tokens") or 256,
        top_p=params.get("top_p", 1.0),
        stop=params.get("stop"),
        seed=params.get("seed"),
        zero=0.0 if isinstance(temperature, float) else 0,
        stream=job.stream,
    )


def shape_default(rng: random.Random) -> Shape:
    """A shape for a model no renter has used yet (the documented distribution):
    one user message (70 %), three (20 %) or five (10 %); a system prompt 40 %;
    no padding 70 %, else 100–1200 characters; ``max_tokens`` the API's default
    256 (half), else 64, 128 or 512; ``stop`` none 85 %, else ``"\\n\\n"`` or
    ``"###"``; a seed 10 %; ``top_p`` 1.0; streamed half the time."""
    return Shape(
        endpoint="chat",
        messages=rng.choices([1, 3, 5], [70, 20, 10])[0],
        system=rng.random() < 0.4,
        chars=0 if rng.random() < 0.7 else rng.randint(100, 1200),
        max_tokens=256 if rng.random() < 0.5 else rng.choice([64, 128, 512]),
        top_p=1.0,
        stop=rng.choices([None, ["\n\n"], ["###"]], [85, 10, 5])[0],
        seed=rng.randint(0, 2**31 - 1) if rng.random() < 0.1 else None,
        zero=0,
        stream=rng.random() < 0.5,
    )


def shape_sample(*, model_id: str, rng: random.Random) -> Shape:
    """The shape of one of the model's last ``BALLAST_CANARY_SHAPE_JOBS`` real
    jobs (renters', not checks), chosen at random; ``shape_default`` without any."""
    recent = list(
        Job.objects.filter(model_id=model_id, is_spot_check=False, renter__isnull=False)
        .order_by("-created_at")
        .values_list("id", flat=True)[: settings.BALLAST_CANARY_SHAPE_JOBS]
    )
    if not recent:
        return shape_default(rng)
    return shape_of(Job.objects.get(id=rng.choice(recent)))


def canary_pool_need(*, model_id: str, now: datetime | None = None) -> int:
    """How many more calibrated prompts the model's pool needs now: it keeps
    never-sent prompts for the last 24 h of checks of the model, and at least
    ``BALLAST_CANARY_POOL_AHEAD``. 0 when it has them."""
    now = now or timezone.now()
    day = SpotCheck.objects.filter(
        job__model_id=model_id, created_at__gt=now - timedelta(days=1)
    ).count()
    unused = CanaryPrompt.objects.filter(
        model_id=model_id, status=CanaryPrompt.Status.CALIBRATED, sent_count=0
    ).count()
    return max(0, max(settings.BALLAST_CANARY_POOL_AHEAD, day) - unused)


def canary_pool_draw(
    *, model_id: str, count: int, rng: random.Random | None = None
) -> list[CanaryPrompt]:
    """Draw ``count`` new prompts of the model (status ``drawn``), each in a
    real job's shape, at the model's next draw indexes (a concurrent drawer
    takes others: the index is unique per model)."""
    rng = rng or random.Random(secrets.randbits(64))
    vocab = vocab_load(settings.BALLAST_CANARY_VOCAB_FILE)
    secret = canary_secret()
    rows = []
    for _ in range(count):
        shape = shape_sample(model_id=model_id, rng=rng)
        for attempt in range(10):
            top = CanaryPrompt.objects.filter(model_id=model_id).aggregate(
                top=Max("index")
            )["top"]
            index = (top or 0) + 1 + attempt  # past the indexes drawers race for
            draw = canary_draw(
                secret=secret, model_id=model_id, index=index, shape=shape, vocab=vocab
            )
            try:
                with transaction.atomic():
                    rows.append(
                        CanaryPrompt.objects.create(
                            model_id=model_id,
                            index=index,
                            family=draw.family,
                            endpoint=shape.endpoint,
                            messages=draw.messages,
                            prompt=draw.prompt,
                            params=draw.params,
                            stream=draw.stream,
                            expected=draw.expected,
                            distractors=draw.distractors,
                        )
                    )
                break
            except IntegrityError:
                continue  # another drawer took this index
        else:
            raise RuntimeError(f"no free draw index for {model_id} in 10 tries")
    return rows


def canary_calibrate(
    *, row: CanaryPrompt, answer: Answerer, now: datetime | None = None
) -> bool:
    """Calibrate one drawn prompt on the reference model: ``calibrated`` when
    ``answer(row)`` (the model's text and finish reason, at most
    ``CALIBRATION_MAX_TOKENS`` tokens) is right (``trust.canaries.answer_right``)
    and complete enough to judge (it ended, or its ``max_tokens`` fit the
    calibration, or the prompt has no distractor a later token could name),
    else ``rejected``. Returns whether it joined the pool."""
    text, finish_reason = answer(row)
    max_tokens = row.params.get("max_tokens") or 256
    whole = (
        finish_reason == "stop"
        or max_tokens <= CALIBRATION_MAX_TOKENS
        or not row.distractors
    )
    kept = whole and answer_right(row.expected, row.distractors, text)
    row.status = (
        CanaryPrompt.Status.CALIBRATED if kept else CanaryPrompt.Status.REJECTED
    )
    row.reference_output = text[:2000]
    row.calibrated_at = now or timezone.now()
    row.save(update_fields=["status", "reference_output", "calibrated_at"])
    return kept


def _checks_untried(model_id: str) -> bool:
    return CanaryPrompt.objects.filter(
        model_id=model_id,
        status=CanaryPrompt.Status.CALIBRATED,
        check_temperature__isnull=True,
    ).exists()


@dataclass(frozen=True)
class ReferenceEngines:
    """How this process runs a model to calibrate its pool: registered by the
    ``refengine`` app (the one coordinator-side package that imports the
    agent's engines, ``reference_engines_register``); none registered, no pool
    is calibrated here.

    - ``engine_for(model_id)``: an engine of the model (unloaded), or None.
    - ``answerer_for(engine)``: an ``Answerer`` running a loaded engine.
    - ``checks_for(engine)``: the ``Judge`` and ``Sampler`` of checks of
      verifiers on a loaded engine, or None when it cannot score by prefill.
    """

    engine_for: Callable[[str], Any | None]
    answerer_for: Callable[[Any], Answerer]
    checks_for: Callable[[Any], tuple[Judge, Sampler] | None]


_reference: list[ReferenceEngines] = []


def reference_engines_register(engines: ReferenceEngines) -> None:
    """Make ``engines`` this process's reference engines (replacing any)."""
    _reference[:] = [engines]
    reference_engine_kept.cache_clear()


def reference_engines() -> ReferenceEngines | None:
    """This process's reference engines, or None (none registered)."""
    return _reference[0] if _reference else None


def reference_engine(model_id: str) -> Any | None:
    """The reference engine of a model on this coordinator (unloaded), or None:
    ``ReferenceEngines.engine_for`` of the registered ones (SmolLM2-135M-Instruct
    through the agent's llama.cpp engine, ``refengine.engines``)."""
    engines = reference_engines()
    return engines.engine_for(model_id) if engines is not None else None


@functools.lru_cache(maxsize=32)
def reference_engine_kept(model_id: str) -> bool:
    """Whether this coordinator has the model's reference engine (asked once
    per model per process; cleared when engines are registered)."""
    return reference_engine(model_id) is not None


def canary_pool_fill(
    *,
    model_id: str,
    keep: int,
    answer: Answerer,
    tries: int | None = None,
    deadline: float | None = None,
) -> int:
    """Draw and calibrate prompts of the model (prompts left ``drawn`` by an
    interrupted fill first) until ``keep`` joined the pool, ``tries`` were
    calibrated, or ``deadline`` (``time.monotonic()``) passed; returns how many
    joined."""
    kept = tried = 0

    def more() -> bool:
        return (
            kept < keep
            and (tries is None or tried < tries)
            and (deadline is None or time.monotonic() < deadline)
        )

    while more():
        batch = min(BATCH, keep - kept, (tries - tried) if tries else BATCH)
        rows = list(
            CanaryPrompt.objects.filter(
                model_id=model_id, status=CanaryPrompt.Status.DRAWN
            ).order_by("index")[:batch]
        ) or canary_pool_draw(model_id=model_id, count=batch)
        for row in rows:
            if not more():
                break
            kept += canary_calibrate(row=row, answer=answer)
            tried += 1
    return kept


def canary_pool_top_up(
    *,
    budget_s: float | None = None,
    engine_for: Callable[[str], Any | None] | None = None,
    answerer_for: Callable[[Any], Answerer] | None = None,
    checks_for: Callable[[Any], tuple[Judge, Sampler] | None] | None = None,
) -> dict[str, int]:
    """Top up the pool of every active catalog model that has a reference
    engine (Celery beat): draw and calibrate until it has what it needs
    (``canary_pool_need``) or ``budget_s`` (``BALLAST_CANARY_POOL_BUDGET_S``)
    is spent, then make checks of verifiers of the calibrated prompts not
    tried yet (``trust.verification.check_calibration.checks_calibrate``, with
    ``checks_for(engine)``'s judge and sampler; None from it: none).
    ``engine_for``, ``answerer_for`` and ``checks_for`` not given are the
    registered ``ReferenceEngines``' (without them, nothing is calibrated).
    Returns {model id: prompts calibrated}; nothing with
    ``BALLAST_SPOT_CHECKS`` off."""
    if not settings.BALLAST_SPOT_CHECKS:
        return {}
    registered = reference_engines()
    engine_for = engine_for or (registered.engine_for if registered else None)
    answerer_for = answerer_for or (registered.answerer_for if registered else None)
    if engine_for is None or answerer_for is None:
        return {}
    checks_for = checks_for or (registered.checks_for if registered else _no_checks)
    budget_s = settings.BALLAST_CANARY_POOL_BUDGET_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget_s
    added: dict[str, int] = {}
    for model_id in CatalogModel.objects.filter(active=True).values_list(
        "id", flat=True
    ):
        need = canary_pool_need(model_id=model_id)
        if time.monotonic() >= deadline:
            continue
        engine = engine_for(model_id) if need or _checks_untried(model_id) else None
        checks_possible = getattr(engine, "verifies", False)
        if engine is None or not (need or checks_possible):
            continue
        asyncio.run(engine.load())
        try:
            if need:
                added[model_id] = canary_pool_fill(
                    model_id=model_id,
                    keep=need,
                    answer=answerer_for(engine),
                    deadline=deadline,
                )
            checks = checks_for(engine)
            if checks is not None:
                judge, sample = checks
                checks_calibrate(
                    model_id=model_id, judge=judge, sample=sample, deadline=deadline
                )
        finally:
            asyncio.run(engine.close())
        if not need:
            continue
        log.info("spot-check pool of %s: %d calibrated", model_id, added[model_id])
    return added


def _no_checks(engine: Any) -> None:
    return None


@transaction.atomic
def canary_pick(
    *, device: Device, model_id: str, now: datetime | None = None
) -> CanaryPrompt | None:
    """A calibrated prompt of the model for this device, counted as sent; None
    when the pool has none left for it.

    Never one sent to any device of the same owner, as a spot check or as a
    check of a verifier (a host never sees a prompt twice); a never-sent one first, else the least sent. The row is locked
    (``SKIP LOCKED`` on PostgreSQL), so two checks picking at once get two.
    """
    now = now or timezone.now()
    owner = device.machine.owner_id
    seen = SpotCheck.objects.filter(device__machine__owner_id=owner).values("canary_id")
    checked = Verification.objects.filter(  # sent to the owner as a verifier's check
        canary__isnull=False, verifier__machine__owner_id=owner
    ).values("canary_id")
    pool = (
        CanaryPrompt.objects.filter(
            model_id=model_id, status=CanaryPrompt.Status.CALIBRATED
        )
        .exclude(id__in=seen)
        .exclude(id__in=checked)
        .select_for_update(skip_locked=True, no_key=True)
    )
    canary = pool.filter(sent_count=0).order_by("id").first() or pool.order_by(
        "sent_count", "id"
    ).first()
    if canary is None:
        return None
    CanaryPrompt.objects.filter(id=canary.id).update(
        sent_count=F("sent_count") + 1, first_sent_at=Coalesce("first_sent_at", now)
    )
    return canary
