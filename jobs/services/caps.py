"""Spending caps per API key (docs/money.md "Spending caps").

A capped key's request is admitted only when what the key was charged in the
cap's period, plus the worst case of its open jobs, plus this request's worst
case stay within the cap: checked in the request's one transaction under the
renter's credit lock (``requests.job_submit``), so parallel requests cannot
pass it together and a refused request stores nothing and offers nothing. What
a key was charged is a counter on the key (``ApiKey.spent_nano`` since
``spent_since``), added to by each charge (``key_spend_add``), so the check
reads one row whatever the key's history.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from billing.money import nano_to_usd_str
from billing.services import TOP_UP_MAX_NANO

from ..errors import ApiError
from ..models import SPEND_EPOCH, ApiKey, Job
from .credit import credit_lock, jobs_worst_case_nano

def key_spend_cap_check(
    *,
    key: ApiKey,
    open_jobs: list[Job],
    worst_case_nano: int,
    max_tokens: int,
    now: datetime | None = None,
) -> None:
    """ApiError 402 ``key_spend_cap_reached`` when ``key``'s cap cannot take a
    request whose worst case is ``worst_case_nano`` (``max_tokens`` × price).

    ``key``: the authenticated key (its ``spend_cap_nano`` read with it: an
    uncapped key costs nothing more); ``open_jobs``: the renter's
    (``credit.jobs_open_of``), of which the key's are held against its cap. The counter is read again here, under
    the caller's credit lock, where no charge of the renter can be half done.
    """
    if key.spend_cap_nano is None:
        return
    now = now or timezone.now()
    row = (
        ApiKey.objects.filter(id=key.id)
        .only("spend_cap_nano", "spend_cap_period", "spent_nano", "spent_since")
        .first()
    )
    if row is None or row.spend_cap_nano is None:
        return
    spent = row.spent_in_period_nano(now)
    held = jobs_worst_case_nano([job for job in open_jobs if job.api_key_id == key.id])
    if spent + held + worst_case_nano <= row.spend_cap_nano:
        return
    raise ApiError(
        402,
        f"this API key's spending cap of {nano_to_usd_str(row.spend_cap_nano)} USD "
        f"{row.get_spend_cap_period_display()} is reached: "
        f"{nano_to_usd_str(spent)} USD spent and {nano_to_usd_str(held)} USD held "
        f"for its open requests; this one may cost up to "
        f"{nano_to_usd_str(worst_case_nano)} USD (max_tokens={max_tokens}). "
        "Raise the cap on your Balance & keys page, or lower max_tokens",
        "key_spend_cap_reached",
    )


def key_spend_add(*, key_id: int | None, cost_nano: int, now: datetime) -> None:
    """Count a charge of ``cost_nano`` (> 0) to key ``key_id``'s spending, when
    the key has a cap: in the period holding ``now`` (a new period restarts the
    counter). One fixed ``UPDATE`` (every job's charge runs it); called by the
    job's charge, in its transaction."""
    if not key_id or cost_nano <= 0:
        return
    utc_now = now.astimezone(SPEND_EPOCH.tzinfo)
    day = utc_now.replace(hour=0, minute=0, second=0, microsecond=0)
    adapt = connection.ops.adapt_datetimefield_value
    # the start of the key's period (``ApiKey.spend_period_start``), by its kind
    start = [
        ApiKey.Period.DAY,
        adapt(day),
        ApiKey.Period.MONTH,
        adapt(day.replace(day=1)),
        adapt(SPEND_EPOCH),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_SPEND_ADD_SQL, [*start, cost_nano, cost_nano, *start, key_id])


# (what the key's period starts at: day, its start, month, its start, ever)
_PERIOD_START = "CASE spend_cap_period WHEN %s THEN %s WHEN %s THEN %s ELSE %s END"
_SPEND_ADD_SQL = (
    "UPDATE jobs_apikey SET spent_nano = CASE WHEN spent_since = "
    + _PERIOD_START
    + " THEN spent_nano + %s ELSE %s END, spent_since = "
    + _PERIOD_START
    + " WHERE id = %s AND spend_cap_nano IS NOT NULL"
)


@transaction.atomic
def api_key_cap_set(
    *,
    user: AbstractBaseUser,
    key_id: int,
    cap_nano: int | None,
    period: str = ApiKey.Period.MONTH,
    now: datetime | None = None,
) -> ApiKey:
    """Set the spending cap of one of ``user``'s keys (``cap_nano`` ≥ 0 nano-USD
    per ``period``, an ``ApiKey.Period``), or remove it (None).

    The counter starts from the jobs table: what the key's jobs were charged
    (finished) since the period's start. The renter's credit account is
    locked first, so no charge of theirs is half done meanwhile. Raises
    ApiKey.DoesNotExist for a key that is not the user's, ValueError for a bad
    cap or period.
    """
    if period not in ApiKey.Period.values:
        raise ValueError(f"the period must be one of {', '.join(ApiKey.Period.values)}")
    if cap_nano is not None and not 0 <= cap_nano <= TOP_UP_MAX_NANO:
        raise ValueError("the cap must be between $0 and $1,000,000")
    now = now or timezone.now()
    credit_lock(renter=user)
    key = ApiKey.objects.select_for_update().get(id=key_id, user_id=user.pk)
    key.spend_cap_nano = cap_nano
    key.spend_cap_period = period
    start = key.spend_period_start(now)
    key.spent_since = start
    key.spent_nano = (
        Job.objects.filter(api_key=key, finished_at__gte=start).aggregate(
            total=Sum("cost_nano")
        )["total"]
        or 0
    )
    key.save(
        update_fields=[
            "spend_cap_nano",
            "spend_cap_period",
            "spent_nano",
            "spent_since",
        ]
    )
    return key
