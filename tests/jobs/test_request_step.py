"""Admitting a request (``jobs.services.job_open``): one transaction checks the
key, the model, the prompt and the credit, stores the job and claims its first
slot; what it refuses leaves nothing behind and sends nothing to any host, and
parallel requests cannot overspend (DESIGN.md "Money": the worst case is held
before the offer)."""

from __future__ import annotations

import contextlib
import threading

import pytest
from django.db import connection, connections

from billing.money import usd_to_nano
from billing.services import renter_top_up
from hosts.models import Device, DeviceModel
from hosts.services import user_get_or_create
from jobs import services
from jobs.errors import ApiError
from jobs.models import Attempt, Job, Rental
from jobs.services import api_key_authenticate
from tests.jobs.helpers import key_of, open_job, sessions_waiting_on_locks

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="row locks of another connection: SQLite has one writer",
)


def transaction_idle() -> bool:
    return connection.connection.info.transaction_status == 0  # psycopg: IDLE


def test_a_request_is_stored_and_claimed_in_one_step(renter, live_device, settings):
    settings.BALLAST_CANARY_RATE = 0  # no random spot check marked on the device
    device = live_device()
    tiebreak = DeviceModel.objects.get(device=device).tiebreak
    key = key_of(renter)
    job, model, dispatch = open_job(key)
    if connection.vendor == "postgresql":
        assert transaction_idle()
    stored = Job.objects.get(id=job.id)
    assert stored.status == Job.Status.RUNNING == job.status
    assert stored.renter_id == renter.id
    assert stored.api_key_id == api_key_authenticate(plain=key).id
    assert stored.waiting_channel == "w.1" and stored.params["max_tokens"] == 16
    attempt = Attempt.objects.get(job=job)
    assert attempt.id == dispatch.attempt.id and attempt.device_id == device.id
    assert attempt.state == Attempt.State.OFFERED
    assert dispatch.offer["job"] == str(attempt.id)
    assert dispatch.machine_channel == device.machine.channel_name
    assert Device.objects.get(id=device.id).slots_used == 1
    assert DeviceModel.objects.get(device=device).tiebreak > tiebreak


def test_a_revoked_key_or_an_inactive_renter_is_refused_401_with_nothing_stored(
    renter, live_device
):
    from django.utils import timezone

    from jobs.models import ApiKey

    live_device()
    key = key_of(renter)
    ApiKey.objects.filter(user=renter).update(revoked_at=timezone.now())
    with pytest.raises(ApiError) as refused:
        open_job(key)
    assert refused.value.status == 401
    live = key_of(renter)
    renter.is_active = False
    renter.save()
    with pytest.raises(ApiError) as refused:
        open_job(live)
    assert refused.value.status == 401
    assert not Job.objects.exists() and not Attempt.objects.exists()


def test_the_key_and_the_model_are_read_by_one_statement(renter, live_device):
    """``api_key_with_model``: the live key and the request's active model in one
    round trip; an unknown or inactive model is None beside the key, and the
    request for it a 404 with nothing stored and no slot held."""
    from django.test.utils import CaptureQueriesContext

    from catalog.models import CatalogModel
    from jobs.services import api_key_with_model
    from tests.conftest import REFERENCE_MODEL

    device = live_device()
    key = key_of(renter)
    with CaptureQueriesContext(connection) as captured:
        found, model = api_key_with_model(plain=key, model_id=REFERENCE_MODEL["id"])
    assert len(captured.captured_queries) == 1
    assert found.user_id == renter.id and model.id == REFERENCE_MODEL["id"]
    assert (
        model.price_completion_nano
        == CatalogModel.objects.get(id=model.id).price_completion_nano
    )
    assert api_key_with_model(plain=key, model_id="no-such-model")[0].id == found.id
    assert api_key_with_model(plain=key, model_id="no-such-model")[1] is None
    assert api_key_with_model(plain="bk_not-a-key", model_id=model.id) == (None, None)
    CatalogModel.objects.filter(id=model.id).update(active=False)
    assert api_key_with_model(plain=key, model_id=model.id) == (found, None)
    with pytest.raises(ApiError) as refused:
        open_job(key)
    assert (refused.value.status, refused.value.code) == (404, "model_not_found")
    assert not Job.objects.exists() and not Attempt.objects.exists()
    assert Device.objects.get(id=device.id).slots_used == 0


def test_the_empty_answers_limit_is_asked_only_after_an_empty_answer(
    renter, live_device, settings
):
    """A key's requests ask ``BALLAST_EMPTY_ANSWER_RATE``'s counter only while
    an empty answer of the key (``ApiKey.last_empty_answer_at``) is within the
    rate's window: one round trip to Redis less for every other request; once
    one is recorded and the counter is full, the key is refused 429."""
    from datetime import timedelta

    from django.utils import timezone

    from ballast.ratelimits import limit_hit
    from jobs.models import ApiKey
    from jobs.services.requests import key_empty_answer_record

    settings.BALLAST_EMPTY_ANSWER_RATE = "1/hour"
    live_device()
    key = key_of(renter)
    key_id = api_key_authenticate(plain=key).id
    limit_hit("1/hour", "key.empty", key_id)  # the counter full, no empty answer noted
    open_job(key)
    key_empty_answer_record(key_id=key_id)
    assert ApiKey.objects.get(id=key_id).last_empty_answer_at is not None
    with pytest.raises(ApiError) as refused:
        open_job(key)
    assert refused.value.status == 429 and "empty answer" in refused.value.message
    an_hour_ago = timezone.now() - timedelta(hours=1, seconds=1)
    ApiKey.objects.filter(id=key_id).update(last_empty_answer_at=an_hour_ago)
    open_job(key)
    assert Job.objects.count() == 2


def test_an_empty_answer_is_noted_after_its_count_and_never_moved_back(
    renter, settings
):
    """The key's time (``last_empty_answer_at``) is taken after the counter's
    hit, so the counter holds that hit no longer than the key's time says; a
    later time already noted (another end committed first) stays."""
    from datetime import timedelta

    import limits
    from django.utils import timezone

    from ballast.ratelimits import limiter
    from jobs.models import ApiKey
    from jobs.services.requests import key_empty_answer_record

    settings.BALLAST_EMPTY_ANSWER_RATE = "5/hour"
    key_id = api_key_authenticate(plain=key_of(renter)).id
    key_empty_answer_record(key_id=key_id)
    noted = ApiKey.objects.get(id=key_id).last_empty_answer_at
    held_until, remaining = limiter().get_window_stats(
        limits.parse("5/hour"), "key.empty", str(key_id)
    )
    assert remaining == 4
    assert noted.timestamp() + 3600 >= held_until
    later = timezone.now() + timedelta(minutes=5)
    ApiKey.objects.filter(id=key_id).update(last_empty_answer_at=later)
    key_empty_answer_record(key_id=key_id)
    assert ApiKey.objects.get(id=key_id).last_empty_answer_at == later


def test_the_migration_has_existing_keys_ask_the_counter(renter):
    """Keys made before ``last_empty_answer_at`` have their empty answers only
    in the counter: the migration notes its own time on them, so a key the
    counter holds full stays refused for the window."""
    from django.db.migrations.executor import MigrationExecutor

    from jobs.models import ApiKey

    before = [("jobs", "0021_verification_calibration")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("jobs", "ApiKey")
        made = old.objects.create(user_id=renter.pk, prefix="bk_old", key_hash="h-old")
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert ApiKey.objects.get(id=made.id).last_empty_answer_at is not None


def test_a_request_the_credit_cannot_cover_is_refused_with_nothing_claimed(live_device):
    device = live_device()
    user = user_get_or_create(email="poor@example.com")
    renter_top_up(
        user=user, amount_nano=usd_to_nano("0.000001"), key="poor"
    )  # 5 tokens
    key = key_of(user)
    with pytest.raises(ApiError) as refused:
        open_job(key, max_tokens=6)
    assert refused.value.status == 402
    assert "cannot cover max_tokens=6" in refused.value.message
    assert not Job.objects.exists() and not Attempt.objects.exists()
    assert Device.objects.get(id=device.id).slots_used == 0
    if connection.vendor == "postgresql":
        assert transaction_idle()
        account_lock_free(user)
    job, _, dispatch = open_job(key, max_tokens=5)  # exactly the balance: accepted
    assert dispatch.attempt is not None


def account_lock_free(user) -> None:
    """Another connection can lock the renter's credit account at once (NOWAIT)."""
    with account_locked(user, nowait=True):
        pass


@contextlib.contextmanager
def account_locked(user, *, nowait: bool = False):
    """Hold the renter's credit account row lock on another connection."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "SELECT id FROM billing_account WHERE user_id = %s FOR UPDATE"
                + (" NOWAIT" if nowait else ""),
                [user.pk],
            )
            yield
            cursor.execute("ROLLBACK")
    finally:
        other.close()


@postgresql_only
def test_an_offer_is_timed_when_its_slot_is_taken_not_when_the_step_was_made(
    renter, live_device
):
    """A step that waits for its renter's credit lock (another request of theirs)
    takes the slot after the wait: its attempt's ``offered_at`` and claim
    deadline start then, so the wait is not counted as the device's time to
    first token, nor does the attempt look offered before its slot was free."""
    from datetime import timedelta

    from django.conf import settings as django_settings
    from django.utils import timezone

    live_device()
    key = key_of(renter)
    opened = []
    step = threading.Thread(
        target=lambda: (opened.append(open_job(key)), connections.close_all())
    )
    with account_locked(renter):
        step.start()
        sessions_waiting_on_locks(1)
        released = timezone.now()
    step.join(30)
    (_, _, dispatch) = opened[0]
    stored = Attempt.objects.get(id=dispatch.attempt.id)
    assert stored.offered_at >= released
    assert stored.claim_deadline - stored.offered_at == timedelta(
        seconds=django_settings.BALLAST_CLAIM_TIMEOUT_S
    )


def test_a_renter_without_a_credit_account_is_refused_402(live_device):
    """(The account is made inside the refused request's transaction, and rolled
    back with it.)"""
    live_device()
    user = user_get_or_create(email="new@example.com")
    key = key_of(user)
    with pytest.raises(ApiError) as refused:
        open_job(key)
    assert refused.value.status == 402
    assert "available credit 0 USD" in refused.value.message
    assert not Job.objects.exists()


def test_an_unknown_model_or_an_oversized_prompt_is_refused_before_any_write(
    renter, live_device
):
    live_device()
    key = key_of(renter)
    with pytest.raises(ApiError) as refused:
        open_job(key, model="no-such-model")
    assert refused.value.status == 404
    with pytest.raises(ApiError) as refused:
        open_job(key, content="word " * 2100)
    assert refused.value.status == 400
    assert not Job.objects.exists()


def test_with_every_slot_taken_the_job_queues(renter, live_device):
    device = live_device()
    key = key_of(renter)
    _, _, first = open_job(key)
    job, _, second = open_job(key)
    assert first.attempt is not None
    assert second.wait and second.attempt is None
    assert Job.objects.get(id=job.id).status == Job.Status.QUEUED == job.status
    assert not Attempt.objects.filter(job_id=job.id).exists()
    assert Device.objects.get(id=device.id).slots_used == 1


def test_an_open_rental_is_held_against_the_credit(renter, live_device):
    """The rental's unbilled hours count against the credit."""
    rented = live_device("rented")
    live_device("other")
    balance = services.credit_reserved_nano(renter=renter)  # nothing held yet
    assert balance == 0
    Rental.objects.create(
        renter=renter,
        device=rented,
        hours=1,
        price_per_hour_nano=usd_to_nano(5) - 100 * 200,  # leaves 100 tokens
        status=Rental.Status.PENDING,
    )
    key = key_of(renter)
    with pytest.raises(ApiError) as refused:
        open_job(key, max_tokens=101)
    assert refused.value.status == 402
    job, _, dispatch = open_job(key, max_tokens=100)
    assert dispatch.attempt is not None


@postgresql_only
def test_requests_queued_on_the_credit_lock_see_each_others_jobs(live_device):
    """Six requests wait on the renter's credit lock (held here), credit for three
    worst cases: once it is released, each reads the credit after the one before
    committed (its own snapshot, after the lock), so three are stored."""
    live_device(slots=8)
    user = user_get_or_create(email="three@example.com")
    renter_top_up(user=user, amount_nano=3 * 10 * 200, key="three")  # 200 nano a token
    key = key_of(user)
    results: list[object] = []

    def one() -> None:
        try:
            results.append(open_job(key, max_tokens=10))
        except ApiError as exc:
            results.append(exc.status)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(6)]
    try:
        with account_locked(user):
            for thread in threads:
                thread.start()
            sessions_waiting_on_locks(6)
    finally:
        for thread in threads:
            thread.join(30)
    assert sorted(r for r in results if isinstance(r, int)) == [402] * 3
    assert Job.objects.filter(renter=user).count() == 3


@postgresql_only
def test_a_connection_the_server_closed_is_replaced_not_handed_to_a_request(renter):
    """The pool checks a connection as it hands it out (``ballast.dbpool``):
    after the server ended every idle session, the next request step still runs."""
    from django.db import close_old_connections

    key = key_of(renter)
    close_old_connections()  # back to the pool, idle
    killer = connections.create_connection("default")
    try:
        with killer.cursor() as cursor:
            cursor.execute(
                "SELECT array_agg(pid) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            killed = cursor.fetchone()[0]
            assert killed
            # as after a restart: the sessions have ended (their backends gone)
            while True:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                    [killed],
                )
                if cursor.fetchone()[0] == 0:
                    break
                cursor.execute("SELECT pg_sleep(0.01)")
    finally:
        killer.close()
    with pytest.raises(ApiError) as refused:  # a real step (the catalog read)
        open_job(key, model="no-such-model")
    assert refused.value.status == 404
