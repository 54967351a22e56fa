"""A running job's lease (``Job.lease_until``): renewed by its coroutine while
it runs, so the reaper (``services.attempts_reap``) closes only jobs whose
coroutine died (DESIGN.md "How a request flows")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from django.db import DatabaseError

from ballast.db import db_call_retried

from .. import services
from ..failover import Fail

log = logging.getLogger("ballast.jobs")

# the lease (``services.JOB_LEASE_S``, 30 s) is renewed this often (s); a renewal
# that fails with a database error is tried 4 times, 0.5 + 1 + 2 s apart, then
# again at the next renewal: two failed rounds still leave the lease running
LEASE_RENEW_S = services.JOB_LEASE_S / 3
LEASE_RETRY_PAUSE_S = 0.5

# how a job whose lease was lost ends, for the renter
LEASE_LOST = Fail(
    status=503,
    code="coordinator_lost",
    message="the job's lease was lost: the coordinator closed it",
)


async def job_lease_keep(*, job_id: str, lost: Callable[[], None]) -> None:
    """Renew job ``job_id``'s lease every ``LEASE_RENEW_S`` s until cancelled.

    A database error is retried with backoff (``LEASE_RETRY_PAUSE_S``,
    doubling, ``ballast.db.db_call_retried``), then at the next renewal: it
    never ends the loop. A lease actually lost (the job no longer open: the
    reaper closed it) calls ``lost()`` once and ends the loop.
    """
    renew = db_call_retried(
        services.job_lease_renew, tries=4, backoff_s=LEASE_RETRY_PAUSE_S
    )
    while True:
        await asyncio.sleep(LEASE_RENEW_S)
        try:
            renewed = await renew(job_id=job_id)
        except DatabaseError:
            log.exception("job %s: lease not renewed this time", job_id)
            continue
        if not renewed:
            log.warning("job %s: lease lost; stopping the job", job_id)
            lost()
            return
