"""Who verifies and how often, against sybils and exemption farming (issue 32
item 3; docs/trust.md): a drawn share of plausible round-1 verdicts goes to a
second verifier, verifiers are weighted by age and record, a verifier that
recently verified a host's owner is not drawn for it again while others
qualify, and a device whose answers keep leaving something out of
verification is verified more (``rate.exempt_multiplier``).

Verifiers answer through ``verification_scored`` with hand-built scores, as
in tests/trust/test_verifier_checks.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.receipts import receipt_sign
from hosts.models import Device
from hosts.services import machine_create
from jobs.models import Attempt, Job, Verification
from jobs.tokens import token_count
from tests.devices import device_online
from tests.hostsim import MODEL
from trust.verification.plausibility import token_scores_parse
from trust.verification.rate import exempt_multiplier, verification_due, verification_rate
from trust.verification.records import (
    VERIFY_MAX_TOKENS,
    verification_choose,
    verification_scored,
)
from trust.verification.verifiers import verifier_pick, verifier_weight

from .test_verifier_checks import Verifier
from .verifying import IMPLAUSIBLE, PLAUSIBLE

pytestmark = pytest.mark.django_db


@pytest.fixture
def drawing(settings, catalog):
    settings.BALLAST_SPOT_CHECKS = False
    settings.BALLAST_VERIFIER_CHECKS = False
    settings.BALLAST_VERIFY_RATE = 1.0
    settings.BALLAST_VERIFY_EXEMPT_SHARE = 0.05
    return settings


def _host(email="a@example.com", name="a") -> Device:
    machine, _ = machine_create(owner_email=email, name=name)
    return device_online(machine)


def _answer(device, renter, *, exemption: str = "", ended_at=None) -> tuple[Job, Attempt]:
    """A renter's job that succeeded on ``device`` in one fresh attempt."""
    now = timezone.now()
    text = "The capital of France is Paris, a city on the river Seine."
    job = Job.objects.create(
        renter=renter,
        model_id=MODEL,
        endpoint="chat",
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        params={"max_tokens": 32, "temperature": 0.7},
        status=Job.Status.SUCCEEDED,
        output_text=text,
        tokens_billed=14,
    )
    attempt = Attempt.objects.create(
        job=job,
        device=device,
        state=Attempt.State.ENDED,
        outcome=Attempt.Outcome.SUCCEEDED,
        claim_deadline=now,
        ended_at=ended_at or now,
        output_text=text,
        output_chars=len(text),
        tokens_billed=14,
        exemption=exemption,
    )
    return job, attempt


def _scored(verifier: Verifier, ver_id: str, text: str, entry: dict) -> str | None:
    """``verifier`` scores ``text`` with ``entry`` for every token; returns
    the next round's id (hex), if one is asked."""
    n = token_count(MODEL, text)
    return verification_scored(
        verification_id=ver_id,
        machine_id=verifier.machine_id,
        tokens=token_scores_parse([dict(entry)] * n, max_tokens=VERIFY_MAX_TOKENS),
        receipt=receipt_sign(verifier.key, ver_id, n, text),
    )


def test_a_drawn_share_of_plausible_round_1_verdicts_goes_to_a_second_verifier(
    drawing, renter
):
    """With ``BALLAST_VERIFY_SECOND_SHARE`` 0 a plausible round 1 ends it; at
    1 it goes on as an implausible one does: a sybil's plausible word on its
    owner's answer is outvoted by two others, the host fails a check and the
    sybil loses its trust."""
    host = _host()
    verifiers = {
        v.device.id: v
        for v in (Verifier(f"{n}@example.com", n) for n in ("b", "c", "d"))
    }
    Device.objects.filter(id__in=verifiers).update(verifier_passes=3)

    def round_1() -> tuple[Verification, Verifier]:
        job, attempt = _answer(host, renter)
        ver = verification_choose(job=job, attempts=[attempt], now=timezone.now())
        return ver, verifiers[ver.verifier_id]

    drawing.BALLAST_VERIFY_SECOND_SHARE = 0.0
    ver, sybil = round_1()
    assert _scored(sybil, ver.id.hex, ver.job.output_text, PLAUSIBLE) is None
    assert Verification.objects.get(id=ver.id).verdict == "plausible"

    drawing.BALLAST_VERIFY_SECOND_SHARE = 1.0
    ver, sybil = round_1()
    second = _scored(sybil, ver.id.hex, ver.job.output_text, PLAUSIBLE)
    assert second is not None, "a second verifier is asked"
    for _ in range(2):  # two honest verifiers find it implausible
        nxt = Verification.objects.get(id=second)
        assert verifiers[nxt.verifier_id] is not sybil
        second = _scored(
            verifiers[nxt.verifier_id], second, ver.job.output_text, IMPLAUSIBLE
        )
    rounds = Verification.objects.filter(job=ver.job)
    assert {r.verdict for r in rounds} == {"failed"}
    assert Device.objects.get(id=sybil.device.id).verifier_passes == 0, "outvoted"
    assert Device.objects.get(id=host.id).outcomes.filter(success=False).exists()


def test_a_verifier_that_recently_verified_an_owner_is_not_drawn_for_it_again(
    drawing, renter
):
    """Rounds of one owner's answers rotate through the verifiers that qualify
    (the least recently drawn for that owner first); with one verifier left
    it is drawn all the same."""
    host = _host()
    verifiers = [Verifier(f"{n}@example.com", n) for n in ("b", "c", "d")]
    drawn = []
    for _ in range(6):
        job, attempt = _answer(host, renter)
        ver = verification_choose(job=job, attempts=[attempt], now=timezone.now())
        drawn.append(ver.verifier_id)
    ids = {v.device.id for v in verifiers}
    assert set(drawn[:3]) == ids and set(drawn[3:]) == ids, drawn
    owner = host.machine.owner_id
    alone = verifier_pick(
        model_id=MODEL,
        exclude_owners={v.device.machine.owner_id for v in verifiers[1:]},
        now=timezone.now(),
        host_owner_id=owner,
    )
    assert alone.id == verifiers[0].device.id


def test_verifiers_are_weighted_by_age_and_record(drawing):
    """A month-old verifier that passed 30 checks in a row outweighs a new
    account that passed none 961 to 1: fresh sybil accounts are rarely
    drawn."""
    old, new = Verifier("old@example.com", "old"), Verifier("new@example.com", "new")
    now = timezone.now()
    Device.objects.filter(id=old.device.id).update(
        first_seen_at=now - timedelta(days=45), verifier_passes=40
    )
    old_device = Device.objects.get(id=old.device.id)
    assert verifier_weight(old_device, now) == 31 * 31
    assert verifier_weight(Device.objects.get(id=new.device.id), now) == 1
    picks = [
        verifier_pick(model_id=MODEL, exclude_owners=set(), now=now).id
        for _ in range(200)
    ]
    assert picks.count(new.device.id) < 10, picks.count(new.device.id)


def test_a_device_whose_answers_keep_leaving_things_out_is_verified_more(
    drawing, renter
):
    """Exempt answers (a stop's cut last token, a cut character) past
    ``BALLAST_VERIFY_EXEMPT_SHARE`` of a device's last 50 multiply its rate by
    their share over it; an honest share changes nothing."""
    drawing.BALLAST_VERIFY_RATE = 0.05
    drawing.BALLAST_VERIFY_NEW_JOBS = 0
    host = _host()
    now = timezone.now()
    for i in range(60):
        _answer(host, renter, ended_at=now - timedelta(minutes=60 - i))
    _answer(host, renter, exemption="stop_cut")
    _answer(host, renter, exemption="cut_character")
    assert exempt_multiplier(device_id=host.id) == 1.0, "2 of 50: usual"
    assert verification_rate(device_id=host.id) == 0.05
    for _ in range(18):
        _answer(host, renter, exemption="cut_character")
    assert exempt_multiplier(device_id=host.id) == pytest.approx(8.0), "20 of 50"
    assert verification_rate(device_id=host.id) == pytest.approx(0.4)
    assert verification_due(device_id=host.id, draw=0.39)
    assert not verification_due(device_id=host.id, draw=0.41)
