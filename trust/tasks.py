"""Celery tasks of trust: thin wrappers around its services (scheduled in
``ballast.celery``)."""

from celery import shared_task

from . import canarypool, spotchecks
from .verification import checks, records


@shared_task(name="trust.tasks.spot_checks_schedule")
def spot_checks_schedule() -> int:
    """Mark spot checks due for quarantined devices and live rentals."""
    return spotchecks.spot_checks_schedule()


@shared_task(name="trust.tasks.canary_pool_top_up")
def canary_pool_top_up() -> dict:
    """Draw and calibrate spot-check prompts where a model's pool runs low."""
    return canarypool.canary_pool_top_up()


@shared_task(name="trust.tasks.verifier_checks_plan")
def verifier_checks_plan() -> int:
    """Plan checks of verifiers on their own clock (trust/verification/checks.py)."""
    return checks.verifier_checks_plan()


@shared_task(name="trust.tasks.verifications_expire")
def verifications_expire() -> int:
    """Expire verifications whose verifier sent no scores in time (against it)."""
    return records.verifications_expire()
