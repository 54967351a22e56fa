"""Ballast's metrics in Prometheus' text format (prometheus-client), docs/metrics.md.

Events are counted where each happens, in one call per event: a job's end
(``job_ended``, from ``jobs.services.endings.job_finish``), an attempt's end
(``attempt_ended``, from ``jobs.services.attempts.attempt_end``), a spot check's
verdict (``spot_check_judged``), a spot check dropped for want of calibrated
checks (``spot_check_dropped``), a ledger transaction (``ledger_posted``). Each is
counted once its database transaction commits (``transaction.on_commit``): an
ending rolled back, or a ledger key already posted, counts nothing.

Several processes of one machine (uvicorn workers, Celery) add up through
prometheus-client's multiprocess mode: every process started with the same
``PROMETHEUS_MULTIPROC_DIR`` writes its values there and a scrape of any of them
(``ballast.metrics_view``) sums them all. State (devices online, free slots) is not
counted here: it is read from the database at each scrape.

This module imports nothing of Ballast's apps (billing, the lowest layer, calls it).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from prometheus_client import Counter, Histogram

# seconds: from a token's tenth of a second to the queue's 120 s timeout
WAIT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)

REQUESTS = Counter(
    "ballast_requests",
    "Renter requests ended (spot checks excluded), by model and final status",
    ["model", "status"],
)
QUEUE_WAIT = Histogram(
    "ballast_queue_wait_seconds",
    "From a request's admission to its first offer to a device (or to its end, "
    "when none was offered), seconds",
    ["model"],
    buckets=WAIT_BUCKETS_S,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "ballast_time_to_first_token_seconds",
    "From a request's admission to the first token reaching the coordinator, "
    "seconds (requests that got one)",
    ["model"],
    buckets=WAIT_BUCKETS_S,
)
FAILOVERS = Counter(
    "ballast_failovers",
    "Requests ended that moved to another device at least once",
    ["model"],
)
ATTEMPTS = Counter(
    "ballast_attempts",
    "Attempts ended, by outcome and kind (fresh, continuation)",
    ["outcome", "kind"],
)
SPOT_CHECKS = Counter(
    "ballast_spot_checks", "Spot checks judged, by result (passed, failed)", ["result"]
)
SPOT_CHECKS_DROPPED = Counter(
    "ballast_spot_checks_dropped",
    "Spot checks due but dropped: none of the device's models has calibrated "
    "checks, by model (each model the device runs; 'none' when it runs none)",
    ["model"],
)
MONEY_POSTED = Counter(
    "ballast_money_posted_nano_usd",
    "Money moved by ledger transactions (the sum of their credit legs), "
    "nano-USD, by transaction kind",
    ["kind"],
)


def job_ended(
    *,
    model_id: str,
    status: str,
    failed_over: bool,
    created_at: datetime,
    finished_at: datetime,
    first_offered_at: datetime | None,
    first_token_at: datetime | None,
) -> None:
    """Count a renter request's end (status, failover) and observe its queue wait
    and time to first token (s), when the transaction commits."""

    def count() -> None:
        REQUESTS.labels(model_id, status).inc()
        if failed_over:
            FAILOVERS.labels(model_id).inc()
        waited = (first_offered_at or finished_at) - created_at
        QUEUE_WAIT.labels(model_id).observe(max(0.0, waited.total_seconds()))
        if first_token_at is not None:
            first = (first_token_at - created_at).total_seconds()
            TIME_TO_FIRST_TOKEN.labels(model_id).observe(max(0.0, first))

    transaction.on_commit(count)


def attempt_ended(*, outcome: str, kind: str) -> None:
    """Count an attempt's end by outcome and kind, when the transaction commits."""
    transaction.on_commit(lambda: ATTEMPTS.labels(outcome, kind).inc())


def spot_check_judged(*, passed: bool) -> None:
    """Count a spot check's verdict, when the transaction commits."""
    result = "passed" if passed else "failed"
    transaction.on_commit(lambda: SPOT_CHECKS.labels(result).inc())


def spot_check_dropped(*, model_ids: list[str]) -> None:
    """Count a spot check dropped for want of calibrated checks, once under each
    model the device runs (``"none"`` when it runs none), when the transaction
    commits (immediately outside one)."""

    def count() -> None:
        for model_id in model_ids or ["none"]:
            SPOT_CHECKS_DROPPED.labels(model_id).inc()

    transaction.on_commit(count)


def ledger_posted(*, kind: str, credits_nano: int) -> None:
    """Add a posted ledger transaction's credits (nano-USD, > 0) under its kind,
    when the transaction commits."""
    transaction.on_commit(lambda: MONEY_POSTED.labels(kind).inc(credits_nano))
