"""The one hook through which jobs tells the checks of hosts' honesty that an
attempt or a job ended, and asks them what it cannot decide alone.

Those checks (spot checks, the verification of real answers, the checks of
verifiers: the ``trust`` app) sit above jobs in the layers contract: they read
jobs' rows and run their checks as jobs, and jobs never imports them. ``trust``
registers its receiver here when Django starts (``hook_register``, in
``trust.apps.TrustConfig.ready``); jobs asks ``hook()``. With none registered
(an install without ``trust``, a test of jobs alone) ``TrustHook``'s own
methods answer, each on the safe side of its question:

- an attempt's end sets nothing to verify and records no failed check (an
  inflated count is still billed at the recount:
  ``services.segments.segment_tokens``);
- a job's end draws no verification;
- no device can be spot-checked, so a rental, which starts only after a
  passed check, is refused rather than left waiting for a check that never
  comes.

The machine's socket is extended the way Channels consumers are, by a
subclass: ``trust.consumers.MachineConsumer`` is ``consumers.HostRelayConsumer``
with the checks run and relayed on it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from .models import Attempt, Job


class TrustHook:
    """What jobs tells the checks and asks them; these methods are the
    defaults that hold with no receiver registered (module docstring)."""

    # the fields of an attempt a receiver of ``attempt_ended`` may set: saved
    # with the attempt's end
    ATTEMPT_FIELDS = ("exemption", "verify_text", "verify_token_ids")

    def attempt_ended(
        self,
        *,
        attempt: Attempt,
        token_ids: list[int] | None,
        now: datetime,
        ruled_out: str = "",
    ) -> None:
        """``attempt`` ended (``services.attempts.attempt_end``, in its
        transaction): its outcome, ``tokens_billed`` and
        ``token_count_flagged`` are set, its slot is free and its row is not
        saved yet. ``token_ids``: the host's ids of its text (``done``), if
        sent; ``ruled_out``: why its answer cannot be what its
        ``response_format`` made an honest engine write
        (``formats.answer_ruled_out``), or ''. A receiver may set
        ``ATTEMPT_FIELDS`` and record what follows (a flagged count or an
        answer ruled out: a failed check of the device)."""

    def job_ended(
        self, *, job: Job, attempts: list[Attempt], now: datetime
    ) -> Callable[[], None] | None:
        """``job`` ended (``services.endings.job_finish``, in its transaction,
        charged; ``attempts`` in offer order): what to start once that
        transaction has committed, or None. Kept as ``Job.ended_then``; the
        job's coroutine runs it when the job succeeded
        (``orchestration.run.JobRun``), the one end whose answer is checked."""
        return None

    def device_unchecked(self, *, device_id: int) -> str:
        """Why the device cannot be spot-checked, in words; "" when it can (a
        check of it is sent, or waits for its pool). Asked before a rental of
        the device is taken (``rentals.rental_create``)."""
        return "this coordinator runs no spot checks"


_hooks: list[TrustHook] = [TrustHook()]


def hook_register(receiver: TrustHook) -> None:
    """Make ``receiver`` the one jobs tells and asks (replacing any)."""
    _hooks[0] = receiver


def hook() -> TrustHook:
    """The registered receiver, else the defaults (``TrustHook``)."""
    return _hooks[0]
