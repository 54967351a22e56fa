"""The few calls whose shape changed between the commits ``bench/ab.sh`` compares.

``bench/ab.sh REV`` runs this checkout's ``bench/`` against commit REV, so a bench
that calls the services in-process must run on both sides. Each function here
calls the code under test as it is on the side it runs on, by what that side has
(one test each, no other branch). Django must be set up.
"""

from __future__ import annotations

import inspect


def catalog_model():
    """The catalog model class (``catalog.models``; ``jobs.models`` before)."""
    try:
        from catalog.models import CatalogModel
    except ImportError:
        from jobs.models import CatalogModel
    return CatalogModel


def dispatch(*, job_id: str, job=None, model=None):
    """``jobs.services.job_dispatch`` of one job: the ``Dispatch``.

    ``job``/``model``: the rows the job's coroutine holds; left out, they are read
    here (now the caller's read; before, ``job_dispatch`` read them from ``job_id``).
    """
    from jobs.models import Job
    from jobs.services import job_dispatch

    if "job_id" in inspect.signature(job_dispatch).parameters:
        return job_dispatch(job_id=job_id, job=job, model=model)
    return job_dispatch(job=job or Job.objects.get(id=job_id), model=model)


def credit_lock_id(*, renter) -> int:
    """``jobs.services.credit_lock`` (inside the caller's transaction): the id of
    the renter's locked credit account (it returns the account; before, its id)."""
    from jobs.services import credit_lock

    locked = credit_lock(renter=renter)
    return locked if isinstance(locked, int) else locked.id


def credit_available(*, renter) -> int:
    """``credit_lock`` + ``credit_available_nano`` as the request's transaction
    runs them (inside the caller's transaction), nano-USD."""
    from jobs.services import credit_available_nano, credit_lock

    locked = credit_lock(renter=renter)
    if isinstance(locked, int):
        return credit_available_nano(renter=renter, account_id=locked)
    return credit_available_nano(renter=renter, account=locked)


def request_admit(*, plain: str, request, waiting_channel: str):
    """A renter's request admitted as the HTTP view admits it, in a worker thread:
    (job, dispatch). ``plain``: the API key.

    Now ``jobs.services.job_open`` (one transaction, the key checked in it);
    before, ``job_open_by_key``'s one round trip, else the key and model read
    then ``job_open``.
    """
    from jobs import services

    if not hasattr(services, "job_open_by_key"):
        job, _, dispatched = services.job_open(
            api_key=plain, request=request, waiting_channel=waiting_channel
        )
        return job, dispatched
    opened = services.job_open_by_key(
        plain=plain, request=request, waiting_channel=waiting_channel
    )
    if opened is not None:
        return opened[1], opened[3]
    key, model = services.api_key_and_model(plain=plain, model_id=request.model)
    job, _, dispatched = services.job_open(
        api_key=key, request=request, waiting_channel=waiting_channel, model=model
    )
    return job, dispatched


def pinned_weights_declare() -> None:
    """Make every device-model row declare the weights its catalog entry pins
    (``DeviceModel.weights_sha256``, since 2026-12-07: a device declaring none
    gets no work of a model whose entry pins a file); nothing on a side
    without that field."""
    from django.db.models import OuterRef, Subquery, Value
    from django.db.models.functions import Coalesce

    from hosts.models import DeviceModel

    if "weights_sha256" not in {field.name for field in DeviceModel._meta.fields}:
        return
    pinned = catalog_model().objects.filter(id=OuterRef("model_id"))
    DeviceModel.objects.update(
        weights_sha256=Coalesce(
            Subquery(pinned.values("weights_sha256")[:1]), Value("")
        )
    )
