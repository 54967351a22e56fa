"""``python manage.py machine_create OWNER_EMAIL NAME [--region R]`` (PROTOCOL.md §3)."""

from django.core.management.base import BaseCommand, CommandError

from hosts.services import machine_create


class Command(BaseCommand):
    help = "Register a machine for its owner; print its token as the last line."

    def add_arguments(self, parser):
        parser.add_argument("owner_email")
        parser.add_argument("name")
        parser.add_argument("--region", default="")

    def handle(self, *args, owner_email: str, name: str, region: str, **options):
        if "@" not in owner_email:
            raise CommandError(
                f"OWNER_EMAIL must be an email address, got {owner_email!r}"
            )
        try:
            machine, token = machine_create(
                owner_email=owner_email, name=name, region=region
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"machine {machine.name} ({machine.id}) registered for {owner_email}"
        )
        self.stdout.write(token)
