"""``python manage.py renter_create EMAIL [--credit USD]`` (PROTOCOL.md §3)."""

from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils.crypto import get_random_string

from billing.money import usd_to_nano
from billing.services import renter_top_up
from hosts.services import user_get_or_create
from jobs.services import api_key_create


class Command(BaseCommand):
    help = "Create (or top up) a renter; print a new API key as the last line."

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--credit", default="0", help="USD to add to the balance")
        parser.add_argument("--key-name", default="default")

    def handle(self, *args, email: str, credit: str, key_name: str, **options):
        if "@" not in email:
            raise CommandError(f"EMAIL must be an email address, got {email!r}")
        try:
            amount = usd_to_nano(Decimal(credit))
        except (InvalidOperation, ValueError) as exc:
            raise CommandError(
                f"--credit must be a USD amount like 10 or 2.50: {exc}"
            ) from None
        if amount < 0:
            raise CommandError("--credit must not be negative")
        with transaction.atomic():
            user = user_get_or_create(email=email)
            if amount:
                renter_top_up(
                    user=user,
                    amount_nano=amount,
                    key=f"cli-topup:{get_random_string(24)}",
                )
            _, plain = api_key_create(user=user, name=key_name)
        self.stdout.write(f"renter {email}: credited {credit} USD")
        self.stdout.write(plain)
