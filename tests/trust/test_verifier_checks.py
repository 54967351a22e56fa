"""Checks of verifiers (issue 22, the fresh-eyes review's F1 and F2): a verifier
that never scores is caught by answers whose verdict the reference model
knows, a round 2 goes to a verifier that passed its checks, a round 1 it
contradicts is distrusted, and only a trusted verifier's word lowers a
device's suspicion (tests/trust/test_verification_rate.py).

Hand-built pool rows stand in for calibrated checks here (the real model makes
them in ``test_checks_are_calibrated_on_the_real_model``); verifiers are
scripted (the agent's prefill is tested with the real model in tests/agent).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.utils import timezone

from agent.receipts import public_key_b64, receipt_sign
from billing.models import Earning
from hosts.models import Device, DeviceOutcome
from hosts.services import machine_create
from jobs.models import CanaryPrompt, Verification
from jobs.tokens import token_count
from refengine.engines import engine_answerer, engine_checks, reference_engine
from tests.devices import device_online
from tests.hostsim import MODEL
from trust.canarypool import canary_pick, canary_pool_fill
from trust.verification.check_calibration import (
    CHECK_TEMPERATURES,
    checks_calibrate,
    clearly,
)
from trust.verification.checks import verifier_checks_plan, verifier_checks_take_due
from trust.verification.plausibility import REFERENCE_THRESHOLDS, token_scores_parse
from trust.verification.records import VERIFY_MAX_TOKENS, verification_scored

from .verifying import IMPLAUSIBLE, PLAUSIBLE

pytestmark = pytest.mark.django_db

REFERENCE = "The capital of France is Paris, a city on the river Seine."
DECOY = "Seine capital river The Paris, the city France on of a is"


@pytest.fixture
def checking(settings, catalog):
    """Checks of verifiers on, planned at every run of the plan while a
    verifier is not trusted and (nearly) never once it is; no spot checks."""
    settings.BALLAST_SPOT_CHECKS = False
    settings.BALLAST_VERIFIER_CHECKS = True
    settings.BALLAST_VERIFIER_TRUST_PASSES = 3
    settings.BALLAST_VERIFIER_CHECK_NEW_EVERY_S = 1.0
    settings.BALLAST_VERIFIER_CHECK_EVERY_S = 1e12
    return settings


def _pool(count: int, temperature: float = 0.0) -> list[CanaryPrompt]:
    """``count`` pool rows made checks (as ``checks.check_calibrate`` leaves them)."""
    return [
        CanaryPrompt.objects.create(
            model_id=MODEL,
            index=1000 + i,
            messages=[{"role": "user", "content": f"Question {i}: which city is the capital of France?"}],
            params={"max_tokens": 64, "temperature": 0},
            expected="Paris",
            status="calibrated",
            reference_output=REFERENCE,
            check_temperature=temperature,
            check_output=REFERENCE,
            decoy_output=DECOY,
        )
        for i in range(count)
    ]


class Verifier:
    """A verifying device of its own owner, with the key its receipts sign with."""

    def __init__(self, email: str, name: str):
        machine, _ = machine_create(owner_email=email, name=name)
        self.key = Ed25519PrivateKey.generate()
        self.device = device_online(
            machine, verifies=True, public_key=public_key_b64(self.key)
        )
        self.machine_id = str(machine.id)

    def checks(self) -> list[tuple[str, dict]]:
        """Run the plan as beat does (every second here), and take what is
        due a second later as the lease loop's poke does."""
        now = timezone.now()
        verifier_checks_plan(now=now, every_s=1.0)
        return verifier_checks_take_due(
            machine_id=self.machine_id, now=now + timedelta(seconds=1.1)
        )

    def answer(self, ver_id: str, frame: dict, entry: dict) -> None:
        """Scores of ``entry`` for every token of the frame's answer."""
        n = token_count(MODEL, frame["answer"])
        tokens = token_scores_parse([dict(entry)] * n, max_tokens=VERIFY_MAX_TOKENS)
        verification_scored(
            verification_id=ver_id,
            machine_id=self.machine_id,
            tokens=tokens,
            receipt=receipt_sign(self.key, ver_id, n, frame["answer"]),
        )

    def passes(self) -> int:
        return Device.objects.get(id=self.device.id).verifier_passes


def test_a_verifier_is_checked_until_it_is_trusted_and_paid_for_each_pass(checking):
    pool = _pool(6, temperature=0.7)
    honest = Verifier("b@example.com", "b")
    for expected_passes in (1, 2, 3):
        [(ver_id, frame)] = honest.checks()
        ver = Verification.objects.get(id=ver_id)
        assert ver.job_id is None and ver.canary in pool and ver.sent_at is not None
        # a verify like any other: nothing names the pool or the kind of answer
        assert set(frame) == {"type", "job", "device", "model", "params", "messages", "answer"}
        assert frame["params"]["temperature"] == 0.7
        assert frame["answer"] == (REFERENCE if ver.expected_plausible else DECOY)
        honest.answer(ver_id, frame, PLAUSIBLE if ver.expected_plausible else IMPLAUSIBLE)
        ver.refresh_from_db()
        assert (ver.status, ver.verdict) == ("scored", "passed")
        assert ver.paid_nano > 0
        assert honest.passes() == expected_passes
    assert not honest.checks(), "trusted: checked every BALLAST_VERIFIER_CHECK_EVERY_S"
    checking.BALLAST_VERIFIER_CHECK_EVERY_S = 1.0
    assert len(honest.checks()) == 1
    assert Earning.objects.filter(device=honest.device, status="held").count() == 3
    assert not DeviceOutcome.objects.filter(device=honest.device, success=False).exists()


@pytest.mark.parametrize(
    "says, caught_on",
    [(PLAUSIBLE, "the decoy"), (IMPLAUSIBLE, "the model's own answer")],
    ids=["all plausible, never scored", "all implausible"],
)
def test_a_verifier_that_does_not_score_fails_a_check(checking, says, caught_on):
    checking.BALLAST_VERIFIER_CHECK_EVERY_S = 1.0  # checked still once trusted
    _pool(40)
    lazy = Verifier("b@example.com", "b")
    for _ in range(40):  # each check is a decoy at 1 in 2: missed 40 times at 1e-12
        [(ver_id, frame)] = lazy.checks()
        lazy.answer(ver_id, frame, says)
        ver = Verification.objects.get(id=ver_id)
        if ver.verdict == "failed":
            break
        assert ver.expected_plausible == (says is PLAUSIBLE)
    assert ver.verdict == "failed" and ver.expected_plausible == (caught_on != "the decoy")
    assert ver.paid_nano == 0 and lazy.passes() == 0
    failure = DeviceOutcome.objects.get(device=lazy.device, success=False)
    assert failure.source == "spot_check", "a failed check of its honesty"
    assert not Earning.objects.filter(device=lazy.device, status="held").exists(), (
        "what its passed checks earned is reversed"
    )


def test_a_check_is_never_a_prompt_its_owner_saw_and_never_one_sent_to_it_later(
    checking,
):
    [only] = _pool(1)
    verifier = Verifier("b@example.com", "b")
    [(ver_id, _)] = verifier.checks()
    assert Verification.objects.get(id=ver_id).canary_id == only.id
    assert verifier.checks() == [], "the owner has seen the pool's only check"
    other_device = Verifier("b@example.com", "b2").device
    assert canary_pick(device=other_device, model_id=MODEL) is None, (
        "nor is it ever the owner's spot check"
    )
    stranger = Verifier("c@example.com", "c").device
    assert canary_pick(device=stranger, model_id=MODEL) == only


def test_checks_are_calibrated_on_the_real_model(catalog, settings):
    """The reference model makes checks of its pool: its own answer clearly
    plausible and a decoy clearly implausible at the check's temperature, as
    the reference model itself judges them again."""
    settings.BALLAST_CANARY_SECRET = "checks"
    engine = reference_engine(catalog.id)
    asyncio.run(engine.load())
    try:
        judge, sample = engine_checks(engine)
        made = 0
        for _ in range(12):  # about half the rows become checks (docs/trust.md)
            canary_pool_fill(model_id=catalog.id, keep=2, tries=8, answer=engine_answerer(engine))
            made += checks_calibrate(model_id=catalog.id, judge=judge, sample=sample)
            if made >= 2:
                break
        rows = list(CanaryPrompt.objects.filter(model_id=catalog.id, status="calibrated"))
        assert rows and all(row.check_temperature in CHECK_TEMPERATURES for row in rows)
        checks = [row for row in rows if row.decoy_output]
        assert made == len(checks) >= 2
        for row in checks:
            t = row.check_temperature
            assert row.decoy_output != row.check_output
            if t == 0:
                assert row.check_output == row.reference_output
            ref = REFERENCE_THRESHOLDS
            honest, decoy = judge(row, row.check_output, t), judge(row, row.decoy_output, t)
            assert clearly(honest, temperature=t, plausible=True, thresholds=ref)
            assert clearly(decoy, temperature=t, plausible=False, thresholds=ref)
    finally:
        asyncio.run(engine.close())


def test_a_verifier_is_drawn_by_owner_and_must_take_jobs(checking):
    """Six devices of one owner buy it no more say than one device of another
    (the second fresh-eyes review: 261 of 300 rounds went to the six); a
    device without a slot (never a job, never a spot check) never verifies."""
    from trust.verification.verifiers import verifier_pick

    many = [Verifier("x@example.com", f"x{i}") for i in range(6)]
    one = Verifier("y@example.com", "y")
    machine, _ = machine_create(owner_email="z@example.com", name="z")
    slotless = device_online(machine, verifies=True, slots=0)
    picks = [
        verifier_pick(model_id=MODEL, exclude_owners=set(), now=timezone.now())
        for _ in range(300)
    ]
    share = sum(p.id == one.device.id for p in picks) / len(picks)
    assert 0.3 < share < 0.7, share  # half, drawn: outside at about 1e-12
    assert {p.id for p in picks} <= {v.device.id for v in (*many, one)}
    assert slotless.id not in {p.id for p in picks}
