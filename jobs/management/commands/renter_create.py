"""``python manage.py renter_create EMAIL [--credit USD | --credit-up-to USD]``
(PROTOCOL.md §3; ``--credit-up-to`` is ours: docs/protocol-notes.md)."""

from decimal import Decimal, InvalidOperation

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils.crypto import get_random_string

from billing.money import nano_to_usd_str, usd_to_nano
from billing.services import TOP_UP_MAX_NANO, renter_balance_nano, renter_top_up
from hosts.services import user_get_or_create
from jobs.services import api_key_create


class Command(BaseCommand):
    help = "Create (or top up) a renter; print a new API key as the last line."

    def add_arguments(self, parser):
        parser.add_argument("email")
        credit = parser.add_mutually_exclusive_group()
        credit.add_argument("--credit", default="0", help="USD to add to the balance")
        credit.add_argument(
            "--credit-up-to",
            metavar="USD",
            help="add only what brings the balance up to USD (nothing when it is "
            "there already): a script run again does not mint credit each time",
        )
        parser.add_argument("--key-name", default="default")

    def handle(
        self, *args, email: str, credit: str, credit_up_to, key_name: str, **options
    ):
        if "@" not in email:
            raise CommandError(f"EMAIL must be an email address, got {email!r}")
        option = "--credit" if credit_up_to is None else "--credit-up-to"
        try:
            amount = usd_to_nano(
                Decimal(credit if credit_up_to is None else credit_up_to)
            )
        except (InvalidOperation, ValueError) as exc:
            raise CommandError(
                f"{option} must be a USD amount like 10 or 2.50: {exc}"
            ) from None
        if amount < 0:
            raise CommandError(f"{option} must not be negative")
        if amount > TOP_UP_MAX_NANO:
            raise CommandError(
                f"{option} must be at most {nano_to_usd_str(TOP_UP_MAX_NANO)} USD"
            )
        with transaction.atomic():
            user = user_get_or_create(email=email)
            if credit_up_to is not None:
                amount = max(0, amount - renter_balance_nano(user=user))
            if amount:
                renter_top_up(
                    user=user,
                    amount_nano=amount,
                    key=f"cli-topup:{get_random_string(24)}",
                )
            _, plain = api_key_create(user=user, name=key_name)
        self.stdout.write(f"renter {email}: credited {nano_to_usd_str(amount)} USD")
        self.stdout.write(plain)
