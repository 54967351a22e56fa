"""Celery tasks of billing: thin wrappers around services."""

from celery import shared_task

from . import services


@shared_task(name="billing.tasks.holds_release")
def holds_release() -> int:
    """Release every host earning whose 24 h hold has ended."""
    return services.holds_release()


@shared_task(name="billing.tasks.balance_low_emails_send")
def balance_low_emails_send() -> int:
    """Email renters whose credit fell below their threshold (once per fall)."""
    return services.balance_low_emails_send()
