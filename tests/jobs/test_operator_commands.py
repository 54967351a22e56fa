"""Operator commands of PROTOCOL.md §3 that renters depend on."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from billing.money import usd_to_nano
from billing.services import renter_balance_nano
from hosts.services import user_get_or_create
from jobs.services import api_key_authenticate

pytestmark = pytest.mark.django_db


def _renter_create(*args: str) -> str:
    out = StringIO()
    call_command("renter_create", *args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def _balance(email: str):
    return renter_balance_nano(user=user_get_or_create(email=email))


def test_credit_adds_each_time_and_prints_a_working_key():
    key = _renter_create("r@example.com", "--credit", "2.50")
    assert api_key_authenticate(plain=key) is not None
    _renter_create("r@example.com", "--credit", "1")
    assert _balance("r@example.com") == usd_to_nano("3.50")


def test_credit_up_to_tops_up_only_the_difference():
    """A script run again (``./dev demo``) does not mint credit each time."""
    _renter_create("d@example.com", "--credit-up-to", "5")
    assert _balance("d@example.com") == usd_to_nano("5")
    _renter_create("d@example.com", "--credit-up-to", "5")
    assert _balance("d@example.com") == usd_to_nano("5")
    _renter_create("d@example.com", "--credit-up-to", "2")  # above it: nothing
    assert _balance("d@example.com") == usd_to_nano("5")
    _renter_create("d@example.com", "--credit-up-to", "7.25")
    assert _balance("d@example.com") == usd_to_nano("7.25")


@pytest.mark.parametrize(
    "args, message",
    [
        (["nobody", "--credit", "1"], "EMAIL must be an email address"),
        (["r@example.com", "--credit", "lots"], "--credit must be a USD amount"),
        (["r@example.com", "--credit-up-to", "-1"], "--credit-up-to must not be"),
        (["r@example.com", "--credit", "1e30"], "--credit must be at most 1000000 USD"),
        (["r@example.com", "--credit", "9300000000"], "must be at most"),
        (["r@example.com", "--credit", "inf"], "not a finite USD amount"),
        (["r@example.com", "--credit-up-to", "nan"], "not a finite USD amount"),
    ],
)
def test_bad_input_is_refused_naming_it_and_changes_nothing(args, message):
    with pytest.raises(CommandError, match=message):
        _renter_create(*args)
    assert _balance("r@example.com") == 0


def test_credit_and_credit_up_to_together_are_refused():
    with pytest.raises(CommandError, match="not allowed with"):
        _renter_create("r@example.com", "--credit", "1", "--credit-up-to", "2")
