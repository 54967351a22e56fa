"""Celery tasks of jobs: thin wrappers around services."""

from celery import shared_task

from . import services


@shared_task(name="jobs.tasks.attempts_reap")
def attempts_reap() -> int:
    """Close jobs and attempts orphaned by a coordinator process that died."""
    return services.attempts_reap()
