"""``ballast.db.transaction_one_message_async``: the request's one message awaited
in the event loop on this process's async connections (``ballast.dbpool.
AsyncConnections``), and the request step that uses it
(``jobs.services.job_open_by_key_async``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async as sync_to_async
from django.db import connection, connections
from django.db.utils import DataError
from django.utils import timezone

from ballast import db
from billing.models import Account
from hosts.models import Device
from jobs import services
from jobs.models import ApiKey, Attempt, Job
from jobs.services import api_key_and_model, api_key_create
from tests.jobs.test_request_step import request

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the async step is PostgreSQL's"
    ),
]

ECHO = "SELECT %s::text, %s::bigint"
HOSTILE = "it's \\ a 'quote'; COMMIT; DROP TABLE jobs_job; -- é 😀 $1 %s"


def backend_pid(conn) -> int:
    return conn.info.backend_pid


async def test_the_async_message_returns_what_the_sync_one_returns():
    statements = [(ECHO, [HOSTILE, 7], True), ("SELECT 1 WHERE false", [], False)]
    awaited = await db.transaction_one_message_async(statements)
    threaded = await sync_to_async(db.transaction_one_message)(statements)
    assert awaited == threaded == [[(HOSTILE, 7)], []]


async def test_a_connection_is_reused_and_its_statements_prepared_once():
    pool = db.async_connections()
    await db.transaction_one_message_async([(ECHO, ["a", 1], True)])
    (conn,) = pool._idle
    await db.transaction_one_message_async([(ECHO, ["b", 2], True)])
    assert list(pool._idle) == [conn] and pool.opened == 1
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'ballast_%%'"
    )
    assert (await cursor.fetchone())[0] == 1


async def test_a_message_sent_again_after_a_loss_prepares_only_what_is_gone():
    """After ``DEALLOCATE ALL`` on the connection, a message whose first
    statement is new and whose second was lost: its retry prepares only the
    lost one (the new one outlived the failed message)."""
    pool = db.async_connections()
    x, y = ("SELECT %s::int + 7", [1], True), ("SELECT %s::int + 8", [1], True)
    await db.transaction_one_message_async([x])
    (conn,) = pool._idle
    await conn.execute("DEALLOCATE ALL")
    for _ in range(2):
        got = await db.transaction_one_message_async([y, x])
        assert got == [[(9,)], [(8,)]]
    assert list(pool._idle) == [conn]


async def test_a_connection_the_server_ended_is_replaced_at_once():
    pool = db.async_connections()
    await db.transaction_one_message_async([(ECHO, ["a", 1], False)])
    (dead,) = pool._idle
    pid = backend_pid(dead)

    def terminate() -> None:
        killer = connections.create_connection("default")
        try:
            with killer.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                while True:  # the session has ended (its backend gone)
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
                    )
                    if cursor.fetchone()[0] == 0:
                        break
                    cursor.execute("SELECT pg_sleep(0.01)")
        finally:
            killer.close()

    await sync_to_async(terminate)()
    rows = await db.transaction_one_message_async([(ECHO, ["b", 2], True)])
    assert rows == [[("b", 2)]]
    (fresh,) = pool._idle
    assert fresh is not dead and dead.closed and pool.opened == 1


async def test_a_failing_statement_raises_djangos_error_and_rolls_back():
    account_sql = "SELECT pg_advisory_xact_lock(4242)"
    with pytest.raises(DataError):
        await db.transaction_one_message_async(
            [(account_sql, [], False), ("SELECT %s::int", ["not a number"], True)]
        )
    pool = db.async_connections()
    (conn,) = pool._idle  # rolled back: idle, kept, the transaction's lock gone
    assert conn.info.transaction_status == 0
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242"
    )
    assert (await cursor.fetchone())[0] == 0


async def test_a_statement_cancelled_in_flight_closes_its_connection():
    pool = db.async_connections()
    sent = asyncio.ensure_future(
        db.transaction_one_message_async([("SELECT pg_sleep(0.3)", [], False)])
    )
    while pool.opened == 0 or pool._idle:  # until the message is in flight
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)
    sent.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sent
    assert pool.opened == 0 and not pool._idle  # closed, not kept
    rows = await db.transaction_one_message_async([(ECHO, ["after", 3], False)])
    assert rows == [[("after", 3)]]


async def test_past_max_open_the_message_goes_the_threaded_way(monkeypatch):
    pool = db.async_connections()
    monkeypatch.setattr(pool, "max_open", 1)
    held = await pool.take()
    threaded = []
    real = db.transaction_one_message

    def spy(statements):
        threaded.append(statements)
        return real(statements)

    monkeypatch.setattr(db, "transaction_one_message", spy)
    try:
        rows = await db.transaction_one_message_async([(ECHO, ["busy", 4], False)])
    finally:
        pool.give_back(held)
    assert rows == [[("busy", 4)]] and len(threaded) == 1
    assert pool.opened == 1  # none opened past the bound


async def test_the_request_step_runs_in_the_event_loop(
    renter, live_device, monkeypatch, settings
):
    """A key and model seen before: the step is one message on an async
    connection; nothing goes to a worker thread, and the key's last use is
    written in the same message."""
    settings.BALLAST_CANARY_RATE = 0
    device = await sync_to_async(live_device)()
    _, plain = await sync_to_async(api_key_create)(user=renter)
    await sync_to_async(api_key_and_model)(plain=plain, model_id=request().model)

    def no_thread(*args, **kwargs):
        raise AssertionError("the common request step went to a worker thread")

    monkeypatch.setattr(services, "db_call", no_thread)
    monkeypatch.setattr(services, "transaction_one_message", no_thread)
    opened = await services.job_open_by_key_async(
        plain=plain, request=request(), waiting_channel="w.1"
    )
    key, job, _, dispatch = opened
    stored = await Job.objects.aget(id=job.id)
    assert stored.status == Job.Status.RUNNING and stored.api_key_id == key.id
    attempt = await Attempt.objects.aget(job=job)
    assert attempt.device_id == device.id == dispatch.attempt.device.id
    assert (await Device.objects.aget(id=device.id)).slots_used == 1
    used = (await ApiKey.objects.aget(id=key.id)).last_used_at
    assert used is not None and timezone.now() - used < timedelta(seconds=30)


async def test_the_key_is_marked_used_at_most_once_a_minute(
    renter, live_device, settings
):
    settings.BALLAST_CANARY_RATE = 0
    await sync_to_async(live_device)(slots=3)
    _, plain = await sync_to_async(api_key_create)(user=renter)
    await sync_to_async(api_key_and_model)(plain=plain, model_id=request().model)
    a_while_ago = timezone.now() - timedelta(seconds=20)
    key = await ApiKey.objects.aget(key_hash=services.token_hash(plain))
    await ApiKey.objects.filter(id=key.id).aupdate(last_used_at=a_while_ago)
    assert await services.job_open_by_key_async(
        plain=plain, request=request(), waiting_channel="w.1"
    )
    assert (await ApiKey.objects.aget(id=key.id)).last_used_at == a_while_ago
    stale = timezone.now() - timedelta(minutes=2)
    await ApiKey.objects.filter(id=key.id).aupdate(last_used_at=stale)
    assert await services.job_open_by_key_async(
        plain=plain, request=request(), waiting_channel="w.1"
    )
    assert (await ApiKey.objects.aget(id=key.id)).last_used_at > stale


async def test_a_request_the_credit_cannot_cover_is_refused_from_the_loop(
    live_device,
):
    from billing.money import usd_to_nano
    from billing.services import renter_top_up
    from hosts.services import user_get_or_create
    from jobs.errors import ApiError

    device = await sync_to_async(live_device)()
    poor = await sync_to_async(user_get_or_create)(email="poor@example.com")
    await sync_to_async(renter_top_up)(
        user=poor, amount_nano=usd_to_nano("0.000001"), key="poor"
    )  # 5 tokens
    _, plain = await sync_to_async(api_key_create)(user=poor)
    await sync_to_async(api_key_and_model)(plain=plain, model_id=request().model)
    with pytest.raises(ApiError) as refused:
        await services.job_open_by_key_async(
            plain=plain, request=request(max_tokens=6), waiting_channel="w.1"
        )
    assert refused.value.status == 402
    assert not await Job.objects.aexists()
    assert (await Device.objects.aget(id=device.id)).slots_used == 0
    (conn,) = db.async_connections()._idle  # committed, idle, kept
    assert conn.info.transaction_status == 0


async def test_a_job_stored_before_the_step_failed_is_failed_not_left_queued(
    renter, live_device, monkeypatch, settings
):
    """The message stored the job, then the wait look-ups failed (a dead
    connection): the renter gets the error and the job is closed (failed,
    nothing billed), not left queued ahead of the model's queue for its lease."""
    from django.db import OperationalError

    settings.BALLAST_CANARY_RATE = 0
    await sync_to_async(live_device)()  # one slot
    _, plain = await sync_to_async(api_key_create)(user=renter)
    await sync_to_async(api_key_and_model)(plain=plain, model_id=request().model)
    running = await services.job_open_by_key_async(
        plain=plain, request=request(), waiting_channel="w.1"
    )
    assert running[3].attempt is not None  # the slot is taken

    def gone(**kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(services, "requirement_unmet", gone)
    with pytest.raises(OperationalError):
        await services.job_open_by_key_async(
            plain=plain, request=request(), waiting_channel="w.2"
        )
    stored = await Job.objects.exclude(id=running[1].id).aget()
    assert stored.status == Job.Status.FAILED
    assert stored.error_code == "database_unavailable" and stored.cost_nano == 0
    assert not await Job.objects.filter(status=Job.Status.QUEUED).aexists()


async def test_a_request_step_chosen_as_a_deadlocks_victim_is_sent_again(
    renter, live_device, settings
):
    """An answer's end locks the device's model row, then the renter's credit
    account; the request step the other way round. Here another session holds
    the model row while the step waits for it, then asks for the account the
    step holds: PostgreSQL ends the step's transaction as the deadlock's victim
    (its check runs first), and the step is sent again and succeeds once the
    other session is done."""
    import psycopg

    from tests.jobs.helpers import sessions_waiting_on_locks

    settings.BALLAST_CANARY_RATE = 0
    device = await sync_to_async(live_device)()
    _, plain = await sync_to_async(api_key_create)(user=renter)
    await sync_to_async(api_key_and_model)(plain=plain, model_id=request().model)
    account = await Account.objects.aget(user=renter, kind=Account.Kind.RENTER_CREDIT)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    name = connection.settings_dict["NAME"]
    admin = await psycopg.AsyncConnection.connect(**params, autocommit=True)
    other = await psycopg.AsyncConnection.connect(**params)
    try:
        # the step's own sessions check for deadlocks first
        await admin.execute(f"ALTER DATABASE \"{name}\" SET deadlock_timeout = '20ms'")
        db.async_connections_close()
        await other.execute("SET deadlock_timeout = '10s'")
        await other.execute(
            "UPDATE hosts_devicemodel SET tiebreak = tiebreak WHERE device_id = %s",
            [device.id],
        )
        step = asyncio.ensure_future(
            services.job_open_by_key_async(
                plain=plain, request=request(), waiting_channel="w.1"
            )
        )
        await sync_to_async(sessions_waiting_on_locks)(1)  # the step, on the row

        async def take_the_account() -> None:
            await other.execute(
                "SELECT id FROM billing_account WHERE id = %s FOR UPDATE", [account.id]
            )

        taker = asyncio.ensure_future(take_the_account())
        await taker  # granted once the step's first try was rolled back
        assert not step.done()  # its second try waits for the account
        await other.rollback()
        key, job, _, dispatch = await step
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" RESET deadlock_timeout')
        await other.close()
        await admin.close()
    assert dispatch.attempt.device.id == device.id
    assert await Job.objects.acount() == 1 and await Attempt.objects.acount() == 1
    assert (await Device.objects.aget(id=device.id)).slots_used == 1


async def test_past_the_loops_share_a_request_step_runs_in_a_worker_thread(
    catalog, api_key, machine_token, monkeypatch
):
    """With ``STEPS_IN_LOOP_AT_ONCE`` steps already in the event loop (a burst),
    the next request's step is the same one round trip sent from a worker thread
    (``job_open_by_key``), and the request is served as usual."""
    from jobs import views
    from tests.jobs.helpers import chat_request, host_online

    host = await host_online(machine_token, "rig")
    warm = chat_request(api_key, stream=False)  # reads the catalog hint
    await host.answer(await host.recv_type("offer"), ["hi"])
    assert (await warm).status_code == 200
    monkeypatch.setattr(views, "STEPS_IN_LOOP_AT_ONCE", 0)
    threaded = []
    real = views.job_open_by_key

    def spy(**kwargs):
        threaded.append(kwargs["waiting_channel"])
        return real(**kwargs)

    async def never(**kwargs):
        raise AssertionError("the step ran in the loop past its share")

    monkeypatch.setattr(views, "job_open_by_key", spy)
    monkeypatch.setattr(views, "job_open_by_key_async", never)
    busy = chat_request(api_key, stream=False)
    await host.answer(await host.recv_type("offer"), ["again"])
    response = await busy
    assert response.status_code == 200 and len(threaded) == 1
    assert views._steps_in_loop == 0
    await host.close()


async def test_an_async_connection_that_lost_its_prepared_statements_prepares_them_again():
    pool = db.async_connections()
    await db.transaction_one_message_async([(ECHO, ["a", 1], True)])
    (conn,) = pool._idle
    await conn.execute("DEALLOCATE ALL")
    rows = await db.transaction_one_message_async([(ECHO, ["b", 2], True)])
    assert rows == [[("b", 2)]] and list(pool._idle) == [conn]
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'ballast_%%'"
    )
    assert (await cursor.fetchone())[0] == 1


async def test_the_offer_leaves_before_the_steps_objects_are_built(
    renter, live_device, monkeypatch, settings
):
    """With ``offer_now`` the claimed slot's offer is sent as soon as the
    database answered; the key's and device's objects are built after it (while
    the host starts), and the dispatch says the offer went."""
    settings.BALLAST_CANARY_RATE = 0
    device = await sync_to_async(live_device)()
    _, plain = await sync_to_async(api_key_create)(user=renter)
    await sync_to_async(api_key_and_model)(plain=plain, model_id=request().model)
    order = []
    real_key_row = services._api_key_row

    def key_row(*args, **kwargs):
        order.append("key objects")
        return real_key_row(*args, **kwargs)

    async def offer_now(machine_channel, attempt_id, frame):
        order.append(("offer", machine_channel, attempt_id, frame))
        return True

    monkeypatch.setattr(services, "_api_key_row", key_row)
    _, job, _, dispatch = await services.job_open_by_key_async(
        plain=plain, request=request(), waiting_channel="w.1", offer_now=offer_now
    )
    machine = await device.__class__.objects.select_related("machine").aget(
        id=device.id
    )
    attempt_id = str(dispatch.attempt.id)
    assert order == [
        ("offer", machine.machine.channel_name, attempt_id, dispatch.offer),
        "key objects",
    ]
    assert dispatch.offered and dispatch.offer["device"] == machine.index
    assert dispatch.offer["job"] == attempt_id and dispatch.attempt.job_id == job.id


async def test_a_step_that_fails_after_its_early_offer_cancels_it(
    catalog, api_key, machine_token, monkeypatch, settings
):
    """The offer went out, then the step failed: the renter gets an OpenAI-shaped
    500, the host is told to drop the offer, the job is failed and its slot freed."""
    settings.BALLAST_CANARY_RATE = 0  # a spot check rolled due: no early offer
    from jobs.models import Job
    from tests.jobs.helpers import chat_request, host_online

    host = await host_online(machine_token, "rig")
    warm = chat_request(api_key, stream=False)  # reads the catalog hint
    await host.answer(await host.recv_type("offer"), ["hi"])
    assert (await warm).status_code == 200

    def broken(*args, **kwargs):
        raise RuntimeError("the key's row could not be read")

    monkeypatch.setattr(services, "_api_key_row", broken)
    failed = chat_request(api_key, stream=False)
    offer = await host.recv_type("offer")
    cancel = await host.recv_type("cancel")
    assert cancel["job"] == offer["job"]
    response = await failed
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    job = await Job.objects.aget(attempts__id=offer["job"])
    assert job.status == Job.Status.FAILED and job.cost_nano == 0
    assert (await Device.objects.aget(machine=host.machine)).slots_used == 0
    await host.close()
