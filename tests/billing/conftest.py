"""Fixtures of the money tests: a rig of hosts driven through the services."""

from __future__ import annotations

import pytest

from tests.billing.helpers import Rig, untokenized_model
from tests.hostsim import MODEL


@pytest.fixture
def model13b(db):
    """A catalog model without a tokenizer, 333 nano-USD per output token."""
    return untokenized_model()


@pytest.fixture
def rig(catalog, model13b, settings):
    """Three hosts (owners a, b, c) serving both models; spot checks off."""
    settings.BALLAST_SPOT_CHECKS = False
    rig = Rig(models=[MODEL, model13b.id])
    for name in ("a", "b", "c"):
        rig.host_add(name)
    return rig
