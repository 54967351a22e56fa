"""A machine's registration and its name (unique per owner, DESIGN.md
"Vocabulary": a host lends machines, each with a token shown once).

Every write is a transaction.
"""

from __future__ import annotations

import unicodedata

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import IntegrityError, transaction

from ..models import Machine, token_hash, token_new
from ..regions import region_clean


def user_get_or_create(*, email: str) -> AbstractBaseUser:
    """Return the user with this email (username = email), creating it if needed."""
    User = get_user_model()
    user, _ = User.objects.get_or_create(username=email, defaults={"email": email})
    return user


NAME_MAX = 100  # Machine.name's max_length


class MachineNameTaken(ValueError):
    """The owner already has a machine (not retired) of this name, whatever its case."""


def machine_name_clean(name: str) -> str:
    """Return ``name`` stripped; raise ValueError when it is empty, longer than
    100 characters, or holds a control character (a name is shown on pages and
    in renters' device labels)."""
    name = (name or "").strip()
    if not name:
        raise ValueError("machine name must not be empty")
    if len(name) > NAME_MAX:
        raise ValueError(f"machine name must be at most {NAME_MAX} characters")
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise ValueError("machine name must not hold control characters")
    return name


def machine_name_taken(*, owner_id: int, name: str, exclude_id=None) -> bool:
    """True when another of the owner's machines not retired has ``name``
    (compared case-insensitively, as the constraint
    ``machine_unique_name_per_owner`` does)."""
    machines = Machine.objects.filter(
        owner_id=owner_id, retired_at__isnull=True, name__iexact=name
    )
    if exclude_id is not None:
        machines = machines.exclude(id=exclude_id)
    return machines.exists()


def machine_name_save(*, owner_id: int, name: str, write, exclude_id=None):
    """Run ``write()`` (the insert or update that gives a machine ``name``) so a
    taken name raises MachineNameTaken, including a name taken by a concurrent
    writer (the constraint's IntegrityError, caught in a savepoint). Returns
    what ``write`` returns."""
    taken = MachineNameTaken(f"you already have a machine named {name!r}")
    if machine_name_taken(owner_id=owner_id, name=name, exclude_id=exclude_id):
        raise taken
    try:
        with transaction.atomic():
            return write()
    except IntegrityError:
        if machine_name_taken(owner_id=owner_id, name=name, exclude_id=exclude_id):
            raise taken from None
        raise


@transaction.atomic
def machine_register(
    *, owner: AbstractBaseUser, name: str, region: str = ""
) -> tuple[Machine, str]:
    """Register a machine for ``owner``; return it and its plain token (shown once).

    The token is stored hashed (sha256). ``region``: a code of
    ``hosts.regions`` or empty. Raises ValueError on a name ``machine_name_clean``
    refuses or an unknown region, MachineNameTaken (a ValueError) when the owner
    already has a machine of that name.
    """
    name = machine_name_clean(name)
    region = region_clean(region)
    token = token_new("bm")
    machine = machine_name_save(
        owner_id=owner.pk,
        name=name,
        write=lambda: Machine.objects.create(
            owner=owner,
            name=name,
            region=region,
            token_hash=token_hash(token),
            token_prefix=token[:10],
        ),
    )
    return machine, token


@transaction.atomic
def machine_create(
    *, owner_email: str, name: str, region: str = ""
) -> tuple[Machine, str]:
    """Register a machine for the owner with this email (created if new).

    Returns the machine and its plain token. Raises ValueError as
    ``machine_register`` does.
    """
    return machine_register(
        owner=user_get_or_create(email=owner_email), name=name, region=region
    )
