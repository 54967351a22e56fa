"""Celery tasks of jobs: thin wrappers around services."""

from celery import shared_task

from hosts.models import Device
from hosts.services import device_score_recompute

from . import rentals, services


@shared_task(name="jobs.tasks.attempts_reap")
def attempts_reap() -> int:
    """Close jobs and attempts orphaned by a coordinator process that died."""
    return services.attempts_reap()


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
