"""Accounts: sign up, log in with the email, log out, password reset by email."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.core import mail
from django.urls import reverse

from .conftest import PASSWORD


def test_it_signs_up_with_an_email_and_logs_in(client, db):
    response = client.post(
        reverse("signup"),
        {"email": "New@Example.com", "password1": PASSWORD, "password2": PASSWORD},
    )
    # a new account lands on the renter's pages, not "Your machines"
    assert response.status_code == 302 and response["Location"] == "/renter/"
    user = get_user_model().objects.get(email="new@example.com")
    assert user.username == "new@example.com"
    assert client.get(reverse("hosts:dashboard")).status_code == 200


def test_it_refuses_a_second_account_for_one_email(client, owner):
    response = client.post(
        reverse("signup"),
        {"email": owner.email, "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 200
    assert b"exists" in response.content


def test_it_logs_in_with_the_email_and_out_by_post(client, owner):
    response = client.post(
        reverse("login"), {"username": "Owner@example.com", "password": PASSWORD}
    )
    assert response.status_code == 302 and response["Location"] == "/accounts/landing/"
    # without a machine: the renter's pages
    assert client.get(response["Location"])["Location"] == "/renter/"
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("hosts:dashboard")).status_code == 302


def test_a_host_lands_on_their_machines_and_a_next_page_wins(client, machine):
    login = {"username": machine.owner.email, "password": PASSWORD}
    landing = client.post(reverse("login"), login)["Location"]
    assert client.get(landing)["Location"] == "/machines/"
    client.post(reverse("logout"))
    answer = client.post(reverse("login") + "?next=/renter/jobs/", login)
    assert answer["Location"] == "/renter/jobs/"


def test_it_resets_a_password_by_email(client, owner):
    client.post(reverse("password_reset"), {"email": owner.email})
    assert len(mail.outbox) == 1
    link = re.search(
        r"http://testserver(/accounts/reset/\S+/)", mail.outbox[0].body
    ).group(1)
    form_url = client.get(link)["Location"]
    client.post(
        form_url,
        {
            "new_password1": "another long passphrase",
            "new_password2": "another long passphrase",
        },
    )
    assert client.login(username=owner.username, password="another long passphrase")


def test_it_lets_one_person_host_and_rent(owner_client, machine):
    """The same account has machines and API keys."""
    owner_client.post(reverse("renter:key_create"), {"name": "laptop"})
    assert owner_client.get(reverse("hosts:dashboard")).status_code == 200
    assert b"laptop" in owner_client.get(reverse("renter:overview")).content
