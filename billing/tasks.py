"""Celery tasks of billing: thin wrappers around services."""

from celery import shared_task

from . import services


@shared_task(name="billing.tasks.holds_release")
def holds_release() -> int:
    """Release every host earning whose 24 h hold has ended."""
    return services.holds_release()
