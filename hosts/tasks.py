"""Celery tasks of the hosts' web: thin wrappers around services (schedules in ballast/celery.py)."""

from celery import shared_task

from . import web_services


@shared_task(name="hosts.tasks.machines_offline_alert")
def machines_offline_alert() -> tuple[int, int]:
    """Email owners of machines that went silent, and of those that came back."""
    return web_services.machines_offline_alert()


@shared_task(name="hosts.tasks.score_samples_take")
def score_samples_take() -> int:
    """Record every device's score for the machine page's chart."""
    return web_services.score_samples_take()
