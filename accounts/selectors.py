"""Reads of the renter pages: keys, jobs with attempts."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import QuerySet
from django.http import Http404

from jobs.models import ApiKey, Job, Rental


def api_keys_of(*, user: AbstractBaseUser) -> QuerySet[ApiKey]:
    """The user's keys, live first, newest first."""
    return ApiKey.objects.filter(user_id=user.pk).order_by("revoked_at", "-created_at")


def jobs_of(*, user: AbstractBaseUser, limit: int = 50) -> QuerySet[Job]:
    """The renter's most recent jobs (never spot checks) with their attempts."""
    return (
        Job.objects.filter(renter_id=user.pk, is_spot_check=False)
        .prefetch_related("attempts__device__machine")
        .order_by("-created_at")[:limit]
    )


def job_of(*, user: AbstractBaseUser, job_id) -> Job:
    """The renter's own job; raises Http404 for anyone else's."""
    job = (
        Job.objects.filter(id=job_id, renter_id=user.pk, is_spot_check=False)
        .prefetch_related("attempts__device__machine")
        .first()
    )
    if job is None:
        raise Http404("no such job")
    return job


def rentals_of(*, user: AbstractBaseUser, limit: int = 20) -> QuerySet[Rental]:
    """The renter's most recent rentals (devices reserved for them), newest first."""
    return Rental.objects.filter(renter_id=user.pk).select_related("device__machine")[
        :limit
    ]
