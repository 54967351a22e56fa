"""factory_boy factories for Ballast's models."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from hosts.models import Machine, token_hash


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}@example.com")
    email = factory.LazyAttribute(lambda o: o.username)


class MachineFactory(factory.django.DjangoModelFactory):
    """A machine; its plain token is ``f"bm_test_{name}"``."""

    class Meta:
        model = Machine

    owner = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"rig-{n}")
    token_hash = factory.LazyAttribute(lambda o: token_hash(f"bm_test_{o.name}"))
    token_prefix = factory.LazyAttribute(lambda o: f"bm_test_{o.name}"[:10])
