"""Reads of the renter pages: keys, the job log with attempts and timings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from datetime import timezone as dt_timezone

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import QuerySet
from django.http import Http404

from jobs.models import ApiKey, Job, Rental


def login_username(typed: str) -> str:
    """The username to authenticate for what someone typed in a login form
    (surrounding spaces dropped): itself when an account has exactly that
    username (staff made by ``createsuperuser``, e.g. ``staff``), else the one
    account's whose username matches it case-insensitively (a site account's
    username is its lower-cased email: ``Ada@Example.com`` logs in as
    ``ada@example.com``), else ``typed`` lower-cased (no such account: the
    password check fails as for any unknown name)."""
    typed = typed.strip()
    users = get_user_model().objects
    if users.filter(username=typed).exists():
        return typed
    matches = list(
        users.filter(username__iexact=typed).values_list("username", flat=True)[:2]
    )
    return matches[0] if len(matches) == 1 else typed.lower()


def api_keys_of(*, user: AbstractBaseUser) -> QuerySet[ApiKey]:
    """The user's keys, live first, newest first."""
    return ApiKey.objects.filter(user_id=user.pk).order_by("revoked_at", "-created_at")


def job_of(*, user: AbstractBaseUser, job_id) -> Job:
    """The renter's own job; raises Http404 for anyone else's."""
    job = (
        Job.objects.filter(id=job_id, renter_id=user.pk, is_spot_check=False)
        .select_related("api_key")
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


@dataclass(frozen=True)
class JobLine:
    """One job of the renter's job log with what the renter felt of it.

    ``ttft_ms``: from the request's admission (``Job.created_at``) to its first
    token, the renter's wait (None without output); ``tokens_per_s``: output
    tokens after the first over the time from the first token to the job's
    end (None under 2 tokens or without a measurable span).
    """

    job: Job
    ttft_ms: int | None
    tokens_per_s: float | None


def job_line(job: Job) -> JobLine:
    """The ``JobLine`` of a job whose attempts are loaded (prefetched)."""
    firsts = [a.first_token_at for a in job.attempts.all() if a.first_token_at]
    first = min(firsts, default=None)
    if first is None:
        return JobLine(job, None, None)
    ttft_ms = max(0, round((first - job.created_at).total_seconds() * 1000))
    rate = None
    if job.finished_at is not None and job.tokens_billed >= 2:
        span_s = (job.finished_at - first).total_seconds()
        if span_s > 0:
            rate = (job.tokens_billed - 1) / span_s
    return JobLine(job, ttft_ms, rate)


def job_log(
    *,
    user: AbstractBaseUser,
    status: str = "",
    key_id: int | None = None,
    model_id: str = "",
    since: date | None = None,
    until: date | None = None,
) -> QuerySet[Job]:
    """The renter's jobs (never spot checks), newest first, with their key and
    attempts: of one ``status``, ``key_id``, ``model_id`` when given, created
    on UTC days ``since`` … ``until`` (both included) when given."""
    jobs = Job.objects.filter(renter_id=user.pk, is_spot_check=False)
    if status:
        jobs = jobs.filter(status=status)
    if key_id is not None:
        jobs = jobs.filter(api_key_id=key_id)
    if model_id:
        jobs = jobs.filter(model_id=model_id)
    if since is not None:
        jobs = jobs.filter(created_at__gte=_day_start(since))
    if until is not None:
        jobs = jobs.filter(created_at__lt=_day_start(until + timedelta(days=1)))
    return (
        jobs.select_related("api_key")
        .prefetch_related("attempts__device__machine")
        .order_by("-created_at", "-id")
    )


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=dt_timezone.utc)
