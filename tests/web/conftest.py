"""Fixtures of the web tests: a host's machine with a live device, jobs and earnings.

Machine state is set through the real services (hello, heartbeat, failed load,
benchmark), never through the websocket.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Earning
from hosts.services import (
    benchmark_record,
    capability_failed_record,
    device_outcome_record,
    machine_register,
)
from jobs.models import Attempt, Job
from tests.devices import device_online

MODEL = "smollm2-135m-instruct"
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    """Hashing real passwords costs ~0.5 s each; tests need no strength."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def owner(db):
    """A host who owns machines (with a password: they log in)."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(
        username="owner@example.com", email="owner@example.com", password=PASSWORD
    )
    return user


@pytest.fixture
def stranger(db):
    """Someone who must be refused access to the owner's things."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(
        username="stranger@example.com", email="stranger@example.com", password=PASSWORD
    )


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client


@pytest.fixture
def stranger_client(client, stranger):
    client.force_login(stranger)
    return client


def connect(
    machine,
    *,
    gpu: str = "NVIDIA GeForce RTX 4090",
    now=None,
    models=(MODEL,),
    temp_c=61.0,
    vram_free_mb=20480,
    slots=2,
):
    """Say hello and send one heartbeat for ``machine``'s device 0 (as its agent would)."""
    device = device_online(
        machine,
        gpu=gpu,
        agent_version="0.1.0",
        engine=("llamacpp", "0.3.16"),
        now=now,
        models=models,
        temp_c=temp_c,
        vram_free_mb=vram_free_mb,
        slots=slots,
    )
    machine.refresh_from_db()
    return device


@pytest.fixture
def machine(owner, catalog):
    """The owner's machine ``rig-1`` with one live RTX 4090 (device 0)."""
    machine, _ = machine_register(owner=owner, name="rig-1", region="eu")
    connect(machine)
    machine.refresh_from_db()
    return machine


def attempt_make(
    device,
    *,
    renter=None,
    outcome="succeeded",
    tokens=12,
    earn_nano=None,
    failed_over=False,
    now=None,
):
    """A finished job with one attempt on ``device`` (and its earning when ``earn_nano``)."""
    now = now or timezone.now()
    job = Job.objects.create(
        renter=renter,
        model_id=MODEL,
        endpoint=Job.Endpoint.CHAT,
        messages=[{"role": "user", "content": "hi"}],
        status=Job.Status.SUCCEEDED if outcome == "succeeded" else Job.Status.FAILED,
        failed_over=failed_over,
        tokens_billed=tokens,
        cost_nano=tokens * 200,
        finished_at=now,
    )
    attempt = Attempt.objects.create(
        job=job,
        device=device,
        state=Attempt.State.ENDED,
        outcome=outcome,
        claim_deadline=now + timedelta(seconds=5),
        claimed_at=now,
        first_token_at=now + timedelta(milliseconds=160)
        if outcome == "succeeded"
        else None,
        ended_at=now,
        output_chars=tokens * 4,
        tokens_billed=tokens if outcome == "succeeded" else 0,
    )
    Attempt.objects.filter(id=attempt.id).update(
        offered_at=now - timedelta(milliseconds=20)
    )
    attempt.refresh_from_db()
    if earn_nano:
        Earning.objects.create(
            attempt=attempt,
            device=device,
            host=device.machine.owner,
            amount_nano=earn_nano,
            release_at=now + timedelta(hours=24),
        )
    return attempt


@pytest.fixture
def busy_machine(machine, renter):
    """``machine`` with history: jobs, earnings, spot checks, a failed load, a benchmark."""
    device = machine.devices.get(index=0)
    attempt_make(device, renter=renter, earn_nano=1_920)
    released = attempt_make(device, renter=renter, earn_nano=3_200)
    Earning.objects.filter(attempt=released).update(status=Earning.Status.RELEASED)
    attempt_make(device, renter=renter, outcome="first_token_timeout", tokens=0)
    device_outcome_record(
        device_id=device.id, success=True, source="spot_check", model_id=MODEL
    )
    device_outcome_record(
        device_id=device.id,
        success=False,
        source="spot_check",
        reason="wrong_answer",
        model_id=MODEL,
    )
    device_outcome_record(
        device_id=device.id, success=True, model_id=MODEL, ttft_ms=180
    )
    capability_failed_record(
        machine_id=str(machine.id),
        report={
            "device": 0,
            "model": "llama-3.1-70b",
            "error": "CUDA error: out of memory (needed 40960 MiB)",
        },
    )
    benchmark_record(
        machine_id=str(machine.id),
        report={
            "device": 0,
            "model": MODEL,
            "tokens_per_s": 142.5,
            "ttft_ms": 95.0,
            "vram_used_mb": 310,
        },
    )
    return machine
