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
from hypothesis import example, given, settings
from hypothesis import strategies as st

from billing.money import usd_to_nano
from billing.services import renter_top_up
from hosts.models import Device, DeviceModel
from hosts.services import user_get_or_create
from jobs import services
from jobs.errors import ApiError
from jobs.models import Attempt, Job, Rental
from jobs.requests import ROLES, completion_request_parse
from jobs.services import api_key_authenticate, api_key_create, job_open
from jobs.tokens import prompt_token_count, prompt_tokens_most
from tests.jobs.helpers import sessions_waiting_on_locks

pytestmark = pytest.mark.django_db(transaction=True)

postgresql_only = pytest.mark.skipif(
    "connection.vendor != 'postgresql'",
    reason="row locks of another connection: SQLite has one writer",
)


def request(max_tokens: int = 16, model: str | None = None, content: str = "Hi"):
    from tests.conftest import REFERENCE_MODEL

    return completion_request_parse(
        {
            "model": model or REFERENCE_MODEL["id"],
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
        },
        endpoint=Job.Endpoint.CHAT,
    )


def key_of(user) -> str:
    """A new plain API key of ``user``."""
    return api_key_create(user=user)[1]


def open_job(key, **kwargs):
    return job_open(api_key=key, request=request(**kwargs), waiting_channel="w.1")


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


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(ROLES)), st.text(max_size=120)),
        min_size=1,
        max_size=12,
    ),
    st.text(max_size=300),
)
@example(messages=[("assistant", "")], prompt="\x06")  # no token: dropped
@example(messages=[("user", "x\x13\x14y")], prompt="\x16\x1d\x04")
def test_the_context_checks_cheap_bounds_hold_the_count(messages, prompt):
    """``_request_fits`` admits a prompt on ``prompt_tokens_most`` (bytes) and
    refuses one on ``prompt_tokens_least`` (its messages' framing) without
    rendering or tokenizing it: for the reference model's template and tokenizer,
    chat and raw prompts alike, whatever the roles and contents (empty, one
    character, text that may merge with the framing), least <= count <= most."""
    from jobs.tokens import prompt_tokens_least
    from tests.conftest import REFERENCE_MODEL

    model = REFERENCE_MODEL["id"]
    chat = [{"role": role, "content": text} for role, text in messages]
    for chat_or_none, raw in ((chat, None), (None, prompt)):
        count = prompt_token_count(model, chat_or_none, raw)
        assert prompt_tokens_least(model, chat_or_none, raw) <= count
        assert count <= prompt_tokens_most(model, chat_or_none, raw)


def _refused_untokenized(monkeypatch, key, parsed) -> ApiError:
    """The 400 ``context_length_exceeded`` of ``job_open`` for ``parsed``,
    asserting that the prompt was never tokenized."""
    from jobs.services import requests as step

    def never(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(step, "prompt_token_count", never)
    with pytest.raises(ApiError) as refused:
        job_open(api_key=key, request=parsed, waiting_channel="w.1")
    assert refused.value.status == 400
    assert refused.value.code == "context_length_exceeded"
    return refused.value


def test_a_request_of_too_many_messages_is_refused_without_tokenizing(
    renter, live_device, monkeypatch
):
    """20,000 one-character messages can never fit 2,048 tokens: refused 400 at
    once (rendering and tokenizing them took ~45 s of the process's time)."""
    live_device()
    key = key_of(renter)
    parsed = request()
    parsed.messages = [{"role": "user", "content": "x"}] * 20_000
    refused = _refused_untokenized(monkeypatch, key, parsed)
    assert "20000 messages" in refused.message
    assert not Job.objects.exists()


@pytest.mark.parametrize("shape", ["one message", "raw prompt"])
def test_megabytes_of_prompt_are_refused_without_tokenizing(
    renter, live_device, monkeypatch, shape
):
    """A prompt of 4 MB can never fit 2,048 tokens (no token stands for more
    than ``_token_bytes_most`` bytes): refused 400 at once, not tokenized for
    seconds under the tokenizer's one lock (found by a fresh-eyes check)."""
    live_device()
    key = key_of(renter)
    text = "lorem ipsum " * 350_000
    if shape == "one message":
        parsed = request(content=text)
    else:
        from tests.conftest import REFERENCE_MODEL

        parsed = completion_request_parse(
            {"model": REFERENCE_MODEL["id"], "prompt": text, "max_tokens": 8},
            endpoint=Job.Endpoint.COMPLETION,
        )
    refused = _refused_untokenized(monkeypatch, key, parsed)
    assert refused.param == ("messages" if shape == "one message" else "prompt")
    assert ("1 message)" if shape == "one message" else "characters)") in (
        refused.message
    )
    assert not Job.objects.exists()


def test_no_token_stands_for_more_bytes_than_the_bound():
    """The byte bound's premise, on the reference vocabulary: the longest
    token's text (special tokens included), repeated, counts at least its
    bytes over the bound in tokens; and special tokens' text in a prompt is
    counted as the engine counts it."""
    from agent.engines.vocab import vocab_pieces
    from jobs.tokens import _token_bytes_most, _vocab, prompt_tokens_least
    from tests.conftest import REFERENCE_MODEL

    model = REFERENCE_MODEL["id"]
    most = _token_bytes_most(model)
    pieces = vocab_pieces(_vocab(model), special=True)
    longest = max(pieces, key=len).decode("utf-8", "replace")
    assert len(longest.encode("utf-8")) == most > 32  # 64 dashes
    for text in (
        longest * 50,
        "<|im_start|>" * 200,
        " " * 5000,
        "-" * 6400,
        "\x06" * 3000,  # a character no token stands for: dropped
        "a\x04b\x1d" * 500,
    ):
        count = prompt_token_count(model, None, text)
        assert prompt_tokens_least(model, None, text) <= count
        chat = [{"role": "user", "content": text}]
        assert prompt_tokens_least(model, chat, None) <= prompt_token_count(
            model, chat, None
        )


def test_the_context_check_counts_the_templates_default_system_prompt(
    renter, live_device
):
    """2,030 one-token words render to 2,060 tokens with SmolLM2's template (its
    default system prompt): with max_tokens 9 that is over 2,048, refused here
    rather than failing on the host (which would count against its score)."""
    live_device()
    key = key_of(renter)
    with pytest.raises(ApiError) as refused:
        open_job(key, content=" hello" * 2030, max_tokens=9)
    assert refused.value.status == 400 and "2060 tokens" in refused.value.message
    _, _, dispatch = open_job(key, content=" hello" * 2000)  # 2,030 + 16 fit
    assert dispatch.attempt is not None


def test_a_prompt_near_the_context_is_counted_exactly(renter, live_device, catalog):
    """Over the byte bound the tokenizer decides: 2,000 one-token words and
    max_tokens 16 fit 2,048; 40 more tokens do not."""
    live_device()
    key = key_of(renter)
    words = " the" * 2000  # 8,000 bytes, 2,000 tokens
    _, _, dispatch = open_job(key, content=words)
    assert dispatch.attempt is not None
    with pytest.raises(ApiError) as refused:
        open_job(key, content=words + " the" * 40)
    assert refused.value.status == 400


@pytest.mark.parametrize("n", [2, 0, True, "1", 1.5])
def test_only_n_1_is_accepted(n):
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": n},
            endpoint=Job.Endpoint.CHAT,
        )
    assert refused.value.status == 400 and refused.value.param == "n"


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 10**30, True, "1", 1.5])
def test_a_seed_past_64_bits_or_not_an_integer_is_refused(seed):
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "seed": seed,
            },
            endpoint=Job.Endpoint.CHAT,
        )
    assert refused.value.status == 400 and refused.value.param == "seed"


@pytest.mark.parametrize("seed", [0, -1, 2**63 - 1, -(2**63)])
def test_any_64_bit_seed_is_accepted(seed):
    parsed = completion_request_parse(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": seed},
        endpoint=Job.Endpoint.CHAT,
    )
    assert parsed.params["seed"] == seed


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


def _parse(**fields):
    return completion_request_parse(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], **fields},
        endpoint=Job.Endpoint.CHAT,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"stream_options": {"include_usage": True}},  # not streamed
        {"stream": False, "stream_options": {}},
        {"stream": True, "stream_options": []},
        {"stream": True, "stream_options": {"include_usage": "yes"}},
    ],
)
def test_stream_options_belong_to_a_stream(fields):
    with pytest.raises(ApiError) as refused:
        _parse(**fields)
    assert refused.value.status == 400 and refused.value.param == "stream_options"


@pytest.mark.parametrize(
    "name, asking",
    [
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("functions", [{"name": "f"}]),
        ("tool_choice", "auto"),
        ("function_call", "auto"),
        ("echo", True),
        ("suffix", "tail"),
        ("best_of", 2),
        ("logit_bias", {"50256": -100}),
        ("echo", 1),
        ("tools", "yes"),
    ],
)
def test_what_ballast_cannot_honour_is_a_400_naming_it(name, asking):
    """A client asking for tools, echo, … gets a clear error, not a plain
    answer that silently ignored the request (``response_format`` and
    ``logprobs`` are served: tests/jobs/test_output_features_*.py)."""
    with pytest.raises(ApiError) as refused:
        _parse(**{name: asking})
    assert refused.value.status == 400 and refused.value.param == name
    assert "not supported" in refused.value.message


def test_the_values_clients_send_by_default_are_accepted():
    assert _parse(n=None).params["max_tokens"]  # null: the default n (1)
    assert _parse(best_of=1.0, top_logprobs=0.0, n=1.0)  # 1.0 is the number 1
    parsed = _parse(
        stream=True,
        stream_options={"include_usage": True},
        tools=[],
        tool_choice="none",
        logprobs=False,
        top_logprobs=None,
        echo=False,
        suffix=None,
        best_of=1,
        logit_bias={},
        response_format={"type": "text"},
    )
    assert parsed.stream and parsed.include_usage
    assert not _parse(stream=True, stream_options={}).include_usage


@pytest.mark.parametrize("role", [{}, [], ["user"]])
def test_a_role_that_is_not_a_string_is_a_400_not_a_server_error(role):
    """Found by schemathesis (tests/fuzz): ``{"role": {}}`` reached a set
    membership test, TypeError, a 500."""
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {"model": "m", "messages": [{"role": role, "content": ""}]}, endpoint="chat"
        )
    assert (refused.value.status, refused.value.param) == (400, "messages[0].role")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"max_completion_tokens": 5, "max_tokens": 8193}, "max_tokens"),
        ({"max_completion_tokens": 0, "max_tokens": 5}, "max_completion_tokens"),
        ({"max_completion_tokens": None, "max_tokens": "9"}, "max_tokens"),
    ],
)
def test_each_budget_field_given_is_checked(fields, param):
    """Found by schemathesis: with ``max_completion_tokens`` given, a
    ``max_tokens`` of 8193 was ignored, not refused."""
    with pytest.raises(ApiError) as refused:
        completion_request_parse(
            {"model": "m", "prompt": "hi", **fields}, endpoint="completion"
        )
    assert (refused.value.status, refused.value.param) == (400, param)


@pytest.mark.parametrize(
    "fields, budget",
    [
        ({}, 256),
        ({"max_tokens": 7}, 7),
        ({"max_completion_tokens": 9, "max_tokens": 7}, 9),
        ({"max_completion_tokens": None, "max_tokens": 7}, 7),
    ],
)
def test_max_completion_tokens_wins_over_max_tokens(fields, budget):
    parsed = completion_request_parse(
        {"model": "m", "prompt": "hi", **fields}, endpoint="completion"
    )
    assert parsed.params["max_tokens"] == budget
