"""Celery tasks of jobs: thin wrappers around services."""

from celery import shared_task

from hosts.models import Device
from hosts.services import device_score_recompute

from . import canarypool, rentals, services, spotchecks
from .verification import checks, records


@shared_task(name="jobs.tasks.attempts_reap")
def attempts_reap() -> int:
    """Close jobs and attempts orphaned by a coordinator process that died."""
    return services.attempts_reap()


@shared_task(name="jobs.tasks.spot_checks_schedule")
def spot_checks_schedule() -> int:
    """Mark spot checks due for quarantined devices and live rentals."""
    return spotchecks.spot_checks_schedule()


@shared_task(name="jobs.tasks.canary_pool_top_up")
def canary_pool_top_up() -> dict:
    """Draw and calibrate spot-check prompts where a model's pool runs low."""
    return canarypool.canary_pool_top_up()


@shared_task(name="jobs.tasks.rentals_settle")
def rentals_settle() -> int:
    """End and bill rentals whose period is over."""
    return rentals.rentals_settle()


@shared_task(name="jobs.tasks.rentals_watch")
def rentals_watch() -> int:
    """Note rented devices' pauses; stop rentals whose device was away too long."""
    return rentals.rentals_watch()


@shared_task(name="jobs.tasks.scores_recompute")
def scores_recompute() -> int:
    """Recompute every device's score (its uptime part moves with time); retired
    devices keep theirs until a hello brings them back."""
    ids = list(
        Device.objects.filter(retired_at__isnull=True).values_list("id", flat=True)
    )
    for device_id in ids:
        device_score_recompute(device_id=device_id)
    return len(ids)


@shared_task(name="jobs.tasks.verifier_checks_plan")
def verifier_checks_plan() -> int:
    """Plan checks of verifiers on their own clock (jobs/verification/checks.py)."""
    return checks.verifier_checks_plan()


@shared_task(name="jobs.tasks.verifications_expire")
def verifications_expire() -> int:
    """Expire verifications whose verifier sent no scores in time (against it)."""
    return records.verifications_expire()
