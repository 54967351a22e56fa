"""The receipt of an attempt's ``done`` is judged and stored once
(``billing.services.receipt_check``, PROTOCOL.md §2, DESIGN.md "Money")."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from billing.models import ReceiptCheck
from billing.services import receipt_check
from jobs.models import Attempt

pytestmark = pytest.mark.django_db

VALID = ReceiptCheck.Verdict.VALID
REPLAYED = ReceiptCheck.Verdict.REPLAYED


def attempt_made(rig, renter) -> tuple[Attempt, object]:
    """An open attempt of a new job, and the host that claimed it."""
    job = rig.job(renter=renter, model="test-13b")
    return rig.attempt(job)


def checked(attempt, host, *, signature: str | None = None, text: str = "abc"):
    """``receipt_check`` of ``attempt`` for ``text`` (2 tokens); ``signature``
    defaults to the host's valid one."""
    pinned = Attempt.objects.select_related("device__machine").get(id=attempt.id)
    return receipt_check(
        attempt_id=attempt.id,
        device_id=attempt.device_id,
        public_key_b64=pinned.device.machine.public_key,
        signature_b64=(
            host.sign(str(attempt.id), 2, text) if signature is None else signature
        ),
        completion_tokens=2,
        text=text,
    )


def test_it_stores_one_check_per_attempt_and_keeps_the_first_verdict(rig, renter):
    attempt, host = attempt_made(rig, renter)
    assert checked(attempt, host) == VALID
    signature = ReceiptCheck.objects.get(attempt_id=attempt.id).signature
    # a second done of the same attempt (another text, no signature, the same one)
    assert checked(attempt, host, signature="") == VALID
    assert checked(attempt, host, text="other") == VALID
    assert checked(attempt, host, signature=signature) == VALID
    check = ReceiptCheck.objects.get(attempt_id=attempt.id)
    assert (check.verdict, check.signature, check.device_id) == (
        VALID,
        signature,
        attempt.device_id,
    )
    assert ReceiptCheck.objects.count() == 1


@pytest.mark.parametrize(
    ("signature", "verdict"),
    [("", ReceiptCheck.Verdict.MISSING), ("AAAA", ReceiptCheck.Verdict.INVALID)],
)
def test_it_stores_a_missing_or_invalid_receipt(rig, renter, signature, verdict):
    attempt, host = attempt_made(rig, renter)
    assert checked(attempt, host, signature=signature) == verdict
    check = ReceiptCheck.objects.get(attempt_id=attempt.id)
    assert (check.verdict, check.signature) == (verdict, signature or None)


def test_a_signature_presented_again_is_a_replay_stored_as_null(rig, renter):
    first, host = attempt_made(rig, renter)
    second, _ = attempt_made(rig, renter)
    assert checked(first, host) == VALID
    signature = ReceiptCheck.objects.get(attempt_id=first.id).signature
    assert checked(second, host, signature=signature) == REPLAYED
    checks = {c.attempt_id: c for c in ReceiptCheck.objects.all()}
    assert (checks[first.id].verdict, checks[first.id].signature) == (VALID, signature)
    assert (checks[second.id].verdict, checks[second.id].signature) == (REPLAYED, None)


def test_it_works_inside_the_caller_s_transaction(rig, renter):
    """A replay inside a caller's transaction rolls back only its own insert: the
    caller's writes before and after it stand."""
    first, host = attempt_made(rig, renter)
    second, _ = attempt_made(rig, renter)
    checked(first, host)
    signature = ReceiptCheck.objects.get(attempt_id=first.id).signature
    with transaction.atomic():
        Attempt.objects.filter(id=second.id).update(output_text="before")
        assert checked(second, host, signature=signature) == REPLAYED
        Attempt.objects.filter(id=second.id).update(output_chars=6)
    second.refresh_from_db()
    assert (second.output_text, second.output_chars) == ("before", 6)
    assert ReceiptCheck.objects.count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_attempts_racing_with_one_signature_pay_once(catalog, settings):
    """Two connections present the same signature for two attempts; the second
    is judged while the first is stored but not committed: one ends replayed."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL; SQLite has a single writer")
    from billing.services import renter_top_up
    from hosts.services import user_get_or_create
    from tests.billing.helpers import Rig, untokenized_model

    untokenized_model()
    settings.BALLAST_SPOT_CHECKS = False
    renter = user_get_or_create(email="receipt-racer@example.com")
    renter_top_up(user=renter, amount_nano=10**9, key="receipt-race-top-up")
    rig = Rig(models=["test-13b"])
    rig.host_add("receipt-racer")
    first, host = attempt_made(rig, renter)
    second, _ = attempt_made(rig, renter)
    signature = host.sign(str(first.id), 2, "abc")
    stored, verdicts, errors = threading.Event(), {}, []

    def check(attempt, wait: threading.Event | None):
        try:
            with transaction.atomic():
                if wait is not None:
                    wait.wait(10)
                verdicts[attempt.id] = checked(attempt, host, signature=signature)
                if wait is None:
                    stored.set()
                    time.sleep(0.5)  # the other is judged and blocks meanwhile
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=check, args=(first, None)),
        threading.Thread(target=check, args=(second, stored)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert verdicts == {first.id: VALID, second.id: REPLAYED}
    assert list(
        ReceiptCheck.objects.order_by("verdict").values_list("verdict", "signature")
    ) == [(REPLAYED, None), (VALID, signature)]
