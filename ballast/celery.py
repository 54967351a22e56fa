"""The Celery app. Every periodic schedule is declared here, in one place.

Tasks only change rows and send email (DESIGN.md "Components"); anything that
talks to a machine's websocket runs in the ASGI processes.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")

app = Celery("ballast")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def schedule_periodic_tasks(sender: Celery, **_: object) -> None:
    """Declare every periodic task (Celery beat) of the platform."""
    from django.conf import settings

    sender.add_periodic_task(
        settings.BALLAST_REAPER_INTERVAL_S,
        sender.signature("jobs.tasks.attempts_reap"),
        name="reap orphaned attempts",
    )
    sender.add_periodic_task(
        300.0, sender.signature("billing.tasks.holds_release"), name="release holds"
    )
    sender.add_periodic_task(
        60.0,
        sender.signature("billing.tasks.balance_low_emails_send"),
        name="low-balance emails",
    )
    # every quarter of the alert delay, kept between 5 s and 60 s
    sender.add_periodic_task(
        min(60.0, max(5.0, settings.BALLAST_OFFLINE_ALERT_AFTER_S / 4)),
        sender.signature("hosts.tasks.machines_offline_alert"),
        name="offline alerts",
    )
    sender.add_periodic_task(
        900.0, sender.signature("hosts.tasks.score_samples_take"), name="score samples"
    )
    sender.add_periodic_task(
        600.0,
        sender.signature("jobs.tasks.scores_recompute"),
        name="scores (uptime part)",
    )
    sender.add_periodic_task(
        60.0,
        sender.signature("trust.tasks.spot_checks_schedule"),
        name="spot checks due",
    )
    sender.add_periodic_task(
        60.0, sender.signature("jobs.tasks.rentals_settle"), name="rentals"
    )
    # a rented device's pauses are seen at this step, and an away device
    # ends its rental within a quarter of BALLAST_RENTAL_OFFLINE_END_S of it
    sender.add_periodic_task(
        min(60.0, max(5.0, settings.BALLAST_RENTAL_OFFLINE_END_S / 4)),
        sender.signature("jobs.tasks.rentals_watch"),
        name="rentals watched",
    )
    sender.add_periodic_task(
        60.0,  # trust.verification.checks.PLAN_EVERY_S
        sender.signature("trust.tasks.verifier_checks_plan"),
        name="checks of verifiers",
    )
    # a verification past BALLAST_VERIFY_DEADLINE_S counts against its verifier
    sender.add_periodic_task(
        max(5.0, min(60.0, settings.BALLAST_VERIFY_DEADLINE_S / 2)),
        sender.signature("trust.tasks.verifications_expire"),
        name="verifications expired",
    )
    # a run calibrates for at most BALLAST_CANARY_POOL_BUDGET_S (20 s), so runs
    # neither pile up nor hold the worker from the tasks above for long
    sender.add_periodic_task(
        max(60.0, settings.BALLAST_CANARY_POOL_BUDGET_S * 3),
        sender.signature("trust.tasks.canary_pool_top_up"),
        name="spot-check pool",
    )
