"""Verification's thresholds are calibrated per catalog entry from honest
answers, and verification of a model waits until it has them (issue 31 item
4; ``trust.verification.calibration``): SmolLM2's entry keeps the thresholds
it was judged by; another entry's answers are not verified (recorded so)
until trusted devices' answers, scored by trusted verifiers of other owners,
give its own; staff see which. The thresholds' derivation runs on the real
tiny Llama 3 model's honest answers too (``tests/models/build.py``)."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.contrib.auth import get_user_model
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from agent.receipts import public_key_b64, receipt_sign
from catalog.models import CatalogModel
from hosts.models import Device
from hosts.services import machine_create
from jobs.models import Attempt, Job, Verification
from tests.devices import device_online
from trust.models import CalibrationSample, ModelCalibration
from trust.verification.calibration import (
    SAMPLES_GREEDY,
    SAMPLES_SAMPLED,
    Sample,
    thresholds_derive,
    thresholds_of,
)
from trust.verification.plausibility import (
    REFERENCE_THRESHOLDS,
    answer_plausible,
    answer_stats,
    token_scores_parse,
)
from trust.verification.records import (
    VERIFY_MAX_TOKENS,
    verification_choose,
    verification_scored,
)

from .verifying import IMPLAUSIBLE, PLAUSIBLE

OTHER = "tiny-llama-3"
"""A catalog entry with no calibration (and no reference engine here)."""
TEXT = "The capital of France is Paris, a city on the river Seine."
N = 12
"""Tokens the hand-built scores give ``TEXT`` (no tokenizer for ``OTHER``)."""
Q4_1 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture
def calibrating(settings, catalog):
    """Every answer drawn for verification; no spot checks, no checks of
    verifiers; ``OTHER`` in the catalog, pinned to a digest."""
    settings.BALLAST_VERIFY_RATE = 1.0
    settings.BALLAST_VERIFY_SECOND_SHARE = 0.0
    settings.BALLAST_SPOT_CHECKS = False
    settings.BALLAST_VERIFIER_CHECKS = False
    return CatalogModel.objects.create(
        id=OTHER,
        family="llama",
        context_length=512,
        vram_per_request_mb=64,
        price_completion_nano=100,
        quantization="F16",
    )


class Host:
    """A device of its own owner serving ``OTHER`` (``reference``: marked a
    reference device by staff, so trusted), verifying with a key of its own
    when ``verifies``."""

    def __init__(self, name: str, *, reference: bool = False, verifies: bool = False):
        machine, _ = machine_create(owner_email=f"{name}@example.com", name=name)
        self.key = Ed25519PrivateKey.generate()
        self.device = device_online(
            machine,
            models=(OTHER,),
            verifies=verifies,
            public_key=public_key_b64(self.key),
        )
        Device.objects.filter(id=self.device.id).update(reference=reference)
        self.machine_id = str(machine.id)

    def scores(self, ver_id: str, entry: dict) -> str | None:
        """Scores of ``entry`` for each of ``N`` tokens of ``TEXT``."""
        return verification_scored(
            verification_id=ver_id,
            machine_id=self.machine_id,
            tokens=token_scores_parse([dict(entry)] * N, max_tokens=VERIFY_MAX_TOKENS),
            receipt=receipt_sign(self.key, ver_id, N, TEXT),
        )


def _answered(host: Host, renter, temperature: float) -> Verification | None:
    """A renter's answer of ``OTHER`` by ``host`` at ``temperature``, ended
    (``verification_choose``); its round 1, if drawn."""
    now = timezone.now()
    job = Job.objects.create(
        renter=renter,
        model_id=OTHER,
        endpoint="chat",
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        params={"max_tokens": 32, "temperature": temperature},
        status=Job.Status.SUCCEEDED,
        output_text=TEXT,
        tokens_billed=N,
    )
    attempt = Attempt.objects.create(
        job=job,
        device=host.device,
        state=Attempt.State.ENDED,
        outcome=Attempt.Outcome.SUCCEEDED,
        claim_deadline=now,
        ended_at=now,
        output_text=TEXT,
        output_chars=len(TEXT),
        tokens_billed=N,
    )
    return verification_choose(job=job, attempts=[attempt], now=now)


def _fleet_row(client) -> str:
    staff = get_user_model().objects.create_superuser(
        username="staff", email="staff@example.com", password="x"
    )
    client.force_login(staff)
    html = client.get(reverse("staff:fleet")).content.decode()
    row = html[html.index(f'id="fleet-{OTHER}"') :]
    return row[: row.index("</tr>")]


def _samples(greedy: int, sampled: int) -> list[Sample]:
    """Honest-looking samples of 40 tokens: greedy ones missing at most one,
    sampled ones at 0.7 or 1 with z from −2 to 2; at most 2 outside."""
    rng = random.Random(7)
    out = [
        Sample(0.0, 40, 0.0, rng.randrange(2), rng.randrange(3)) for _ in range(greedy)
    ]
    return out + [
        Sample(rng.choice((0.7, 1.0)), 40, rng.uniform(-2.0, 2.0), 9, rng.randrange(3))
        for _ in range(sampled)
    ]


def test_it_derives_thresholds_covering_every_honest_sample() -> None:
    """None until enough greedy and sampled samples; then each tolerance
    covers every sample and is never tighter than SmolLM2's."""
    assert thresholds_derive(_samples(SAMPLES_GREEDY - 1, 40)) is None
    assert thresholds_derive(_samples(40, SAMPLES_SAMPLED - 1)) is None
    samples = _samples(SAMPLES_GREEDY, SAMPLES_SAMPLED)
    derived = thresholds_derive(samples)
    assert derived is not None
    assert derived.z_min == REFERENCE_THRESHOLDS.z_min  # z from −2 on: −4 stands
    assert (derived.z_low, derived.z_high) == (0.7, 1.0)
    for s in samples:
        assert s.outside < derived.outside_max(s.n)
        if s.temperature == 0:
            assert s.misses <= derived.misses_max(s.n)
        else:
            assert s.z >= derived.z_min
    assert derived.outside_base >= REFERENCE_THRESHOLDS.outside_base
    assert derived.greedy_misses_share >= REFERENCE_THRESHOLDS.greedy_misses_share
    # a model whose honest answers spread wider gets wider tolerances
    wide = samples + [Sample(0.7, 40, -5.0, 9, 6), Sample(0.0, 20, 0.0, 8, 0)]
    wider = thresholds_derive(wide)
    assert wider.z_min == pytest.approx(-6.5)
    assert wider.outside_base >= 7
    assert wider.misses_max(20) >= 8


@pytest.mark.django_db
def test_smollm2s_entry_keeps_the_thresholds_it_was_judged_by(catalog) -> None:
    """The data migration gives the reference entry (pinned Q4_1) today's
    constants; a re-pinned entry is not calibrated until its new weights are."""
    from importlib import import_module

    migration = import_module("trust.migrations.0001_initial")
    ModelCalibration.objects.all().delete()
    CatalogModel.objects.filter(id=catalog.id).update(
        weights_sha256=Q4_1, quantization="Q4_1"
    )
    from django.apps import apps

    migration.reference_calibrate(apps, SimpleNamespace(connection=connection))
    assert thresholds_of(catalog.id) == REFERENCE_THRESHOLDS
    assert ModelCalibration.objects.get(model_id=catalog.id).samples == 120
    CatalogModel.objects.filter(id=catalog.id).update(
        weights_sha256="0" * 64, quantization="Q4_0"
    )
    assert thresholds_of(catalog.id) is None


@pytest.mark.django_db
def test_an_uncalibrated_models_answers_stay_unverified_and_say_so(
    calibrating, renter, client
) -> None:
    """An untrusted host's answer of a model with no calibration is drawn but
    not verified: recorded ``uncalibrated``, offered to no verifier, nothing
    for anyone; staff see the model not calibrated, the answers left
    unverified."""
    host = Host("a")
    Host("b", verifies=True)  # a verifier is there: it is not asked
    ver = _answered(host, renter, 0.7)
    assert (ver.status, ver.verifier_id, ver.verdict) == ("uncalibrated", None, "")
    assert "not calibrated" in ver.detail
    assert not host.device.outcomes.exists()
    row = _fleet_row(client)
    assert '<span class="badge bad">not calibrated</span>' in row
    assert "0 of 15 greedy, 0 of 15 sampled" in row
    assert "1 answer left unverified" in row


@pytest.mark.django_db
def test_trusted_answers_calibrate_a_model_then_its_answers_are_judged(
    calibrating, renter, client
) -> None:
    """A trusted host's answers are samples scored by a trusted verifier of
    another owner (never an untrusted one), judged by nobody: scores that
    would be implausible fail no one. Once enough are kept the model is
    calibrated from them, and the next answer is judged by its own
    thresholds: an implausible one goes to a second round, then fails."""
    trusted_host = Host("a", reference=True)
    trusted_verifier = Host("b", reference=True, verifies=True)
    untrusted_verifier = Host("c", verifies=True)
    for i in range(SAMPLES_GREEDY + SAMPLES_SAMPLED):
        temperature = 0.0 if i < SAMPLES_GREEDY else 0.7
        ver = _answered(trusted_host, renter, temperature)
        assert ver.verdict == "sample" and ver.status == "offered"
        assert ver.verifier_id == trusted_verifier.device.id
        entry = IMPLAUSIBLE if i == 0 else PLAUSIBLE
        assert trusted_verifier.scores(ver.id.hex, entry) is None
        ver.refresh_from_db()
        assert (ver.status, ver.verdict, ver.plausible) == ("scored", "sample", None)
        assert ver.paid_nano > 0
        assert (thresholds_of(OTHER) is None) == (
            i < SAMPLES_GREEDY + SAMPLES_SAMPLED - 1
        )
    assert not trusted_host.device.outcomes.filter(success=False).exists()
    assert CalibrationSample.objects.filter(model_id=OTHER).count() == 30
    calibration = ModelCalibration.objects.get(model_id=OTHER)
    assert (calibration.source, calibration.samples) == ("fleet", 30)
    assert calibration.quantization == "F16"
    # the implausible-looking sample (7 of 12 misses at T 0) is covered
    assert calibration.thresholds.misses_max(N) >= N
    assert '<span class="badge ok">calibrated</span> from 30 honest answers' in (
        _fleet_row(client)
    )

    # judged from now on, by its own thresholds: outside the support is
    # implausible at any temperature (12 of 12 here)
    outside = {"rank": 90, "logprob": None, "mean": -1.0, "var": 1.0}
    host = Host("d")
    ver = _answered(host, renter, 0.7)
    assert ver.status == "offered" and ver.verdict == ""
    verifiers = {v.device.id: v for v in (trusted_verifier, untrusted_verifier)}
    second = verifiers[ver.verifier_id].scores(ver.id.hex, outside)
    assert second is not None, "implausible: a second round"
    nxt = Verification.objects.get(id=second)
    verifiers[nxt.verifier_id].scores(second, outside)
    verdicts = Verification.objects.filter(job=ver.job).values_list("verdict")
    assert set(verdicts) == {("failed",)}
    assert host.device.outcomes.filter(success=False).exists()


@pytest.mark.django_db
def test_a_repinned_model_waits_for_samples_of_its_new_weights(
    calibrating, renter
) -> None:
    """Samples and the calibration belong to the weights the entry pinned
    then: after a re-pin the answers are unverified again, and the samples of
    the old weights count for nothing."""
    trusted_host = Host("a", reference=True)
    verifier = Host("b", reference=True, verifies=True)
    for i in range(SAMPLES_GREEDY + SAMPLES_SAMPLED):
        ver = _answered(trusted_host, renter, 0.0 if i < SAMPLES_GREEDY else 1.0)
        verifier.scores(ver.id.hex, PLAUSIBLE)
    assert thresholds_of(OTHER) is not None
    CatalogModel.objects.filter(id=OTHER).update(quantization="Q8_0")
    assert thresholds_of(OTHER) is None
    ver = _answered(Host("c"), renter, 0.7)
    assert ver.status == "uncalibrated"
    ver = _answered(trusted_host, renter, 0.0)
    assert ver.verdict == "sample"  # (its device loaded no other weights here)
    verifier.scores(ver.id.hex, PLAUSIBLE)
    assert thresholds_of(OTHER) is None, "one sample of the new weights"


def test_the_tiny_llama3_models_honest_answers_calibrate_it() -> None:
    """On the second family's real model (Llama 3's tokenizer, random weights
    fixed by a seed): its honest answers at T 0 and 0.7, scored by prefill as
    a verifier scores them, give thresholds; by them every honest answer is
    plausible and random words are not."""
    from agent.engines.base import GenerationRequest, GenerationResult
    from agent.engines.llamacpp import LlamaCppEngine
    from tests.modeldata.vectors import VectorsUnavailable
    from tests.models.build import tiny_llama3

    try:
        path = tiny_llama3()
    except VectorsUnavailable as exc:
        pytest.skip(f"llama.cpp's vocabulary files cannot be downloaded: {exc}")
    engine = LlamaCppEngine(model=OTHER, model_path=path, n_ctx=512)
    prompts = [f"Tell me about the number {i} and what it means." for i in range(16)]

    def request(prompt: str, temperature: float) -> GenerationRequest:
        return GenerationRequest(
            model=OTHER,
            messages=[{"role": "user", "content": prompt}],
            params={"temperature": temperature, "top_p": 1.0, "max_tokens": 24},
        )

    async def scored(temperature: float, answer: str | None, prompt: str):
        asked = request(prompt, temperature)
        ids = None
        if answer is None:
            result = GenerationResult()
            answer = "".join([p async for p in engine.stream(asked, result)])
            ids = result.token_ids
        scores = await engine.score(asked, answer, token_ids=ids)
        entries = [token.frame() for token in scores.tokens]
        return token_scores_parse(entries, max_tokens=VERIFY_MAX_TOKENS)

    async def run():
        await engine.load()
        try:
            honest = [
                (t, await scored(t, None, p)) for t in (0.0, 0.7) for p in prompts
            ]
            words = "river apple seven quietly window bright under table".split()
            rng = random.Random(3)
            junk = [
                (t, await scored(t, " ".join(rng.choices(words, k=16)), p))
                for t in (0.0, 0.7)
                for p in prompts[:6]
            ]
            return honest, junk
        finally:
            await engine.close()

    honest, junk = asyncio.run(run())
    samples = []
    for t, tokens in honest:
        stats = answer_stats(tokens)
        samples.append(Sample(t, stats.n, stats.z, stats.misses, stats.outside))
    thresholds = thresholds_derive(samples)
    assert thresholds is not None, samples
    for t, tokens in honest:
        verdict = answer_plausible(temperature=t, tokens=tokens, thresholds=thresholds)
        assert verdict.plausible, verdict
    for t, tokens in junk:
        verdict = answer_plausible(temperature=t, tokens=tokens, thresholds=thresholds)
        assert not verdict.plausible, verdict
