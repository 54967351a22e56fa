"""Fixtures for people (owner, renter, stranger), the catalog and scripted hosts."""

from __future__ import annotations

import pytest
from django.utils.crypto import get_random_string

from billing.money import usd_to_nano
from billing.services import renter_top_up
from hosts.services import machine_create, user_get_or_create
from jobs.models import CatalogModel
from jobs.services import api_key_create

REFERENCE_MODEL = {
    "id": "smollm2-135m-instruct",
    "family": "smollm2",
    "context_length": 8192,
    "vram_per_request_mb": 256,
    "price_prompt_nano": 0,
    "price_completion_nano": 200,
}


@pytest.fixture
def catalog(db):
    """The reference model in the catalog (transactional tests flush the data migration)."""
    model, _ = CatalogModel.objects.update_or_create(id=REFERENCE_MODEL["id"], defaults=REFERENCE_MODEL)
    return model


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
    renter_top_up(user=user, amount_nano=usd_to_nano(5), key=f"test:{get_random_string(8)}")
    return user


@pytest.fixture
def api_key(renter):
    """The renter's plain API key."""
    _, plain = api_key_create(user=renter)
    return plain


@pytest.fixture
def machine_token(owner):
    """Register a machine for ``owner``; returns a factory giving (machine, token)."""

    def make(name: str = "rig", region: str = ""):
        return machine_create(owner_email=owner.email, name=name, region=region)

    return make


@pytest.fixture
def fast_deadlines(settings):
    """Shortened deadlines through the settings (never raced with sleeps)."""
    settings.BALLAST_CLAIM_TIMEOUT_S = 0.5
    settings.BALLAST_FIRST_TOKEN_TIMEOUT_S = 0.5
    settings.BALLAST_STALL_TIMEOUT_S = 0.5
    settings.BALLAST_QUEUE_TIMEOUT_S = 1.0
    return settings
