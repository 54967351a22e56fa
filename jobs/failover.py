"""The decision after a failed attempt, and when no device takes a job
(DESIGN.md "When a host fails", "No eligible device"; PROTOCOL.md §1's status
codes). Pure functions: the job's coroutine (``orchestration.JobRun``) acts on
what they return.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .models import Job


@dataclass(frozen=True)
class Failover:
    """Where a job stands: attempts failed before any output reached the renter,
    whether its one continuation was used, and how many devices answered it
    with nothing."""

    failures_before_output: int = 0
    continuation_used: bool = False
    empty_answers: int = 0


@dataclass(frozen=True)
class Redispatch:
    """Dispatch again: a fresh attempt (nothing delivered) or, with
    ``continuation``, the one continuation of the text delivered."""

    continuation: bool = False


@dataclass(frozen=True)
class Complete:
    """End the job as answered: the text delivered so far is the whole answer
    (the model ended there), finish reason ``stop``."""


@dataclass(frozen=True)
class Fail:
    """End the job: ``status`` is the HTTP code when nothing was delivered
    (after output, the stream ends with an error chunk), ``job_status`` the
    job's status."""

    status: int
    code: str
    message: str
    job_status: str = Job.Status.FAILED


def after_failed_attempt(
    state: Failover,
    *,
    outcome: str,
    segment_had_output: bool,
    delivered: bool,
    single_device: bool,
    max_attempts: int,
) -> tuple[Redispatch | Fail, Failover]:
    """What follows an attempt that ended with ``outcome`` (not a success).

    ``segment_had_output``: that attempt delivered text; ``delivered``: the
    renter has text of this job (of any attempt); ``single_device``: the job runs
    on one device only (a spot check, a rental). Returns the decision and the
    new state:
    - one device only: fail 502 with the outcome;
    - output delivered by this attempt, continuation unused: the continuation;
    - output delivered otherwise: fail 502 (``continuation_failed`` after the
      continuation);
    - no output: another fresh attempt, until ``max_attempts`` failed: 502
      ``all_attempts_failed``, nothing billed.
    """
    if single_device:
        return Fail(502, outcome, f"the device failed the job ({outcome})"), state
    if segment_had_output and not state.continuation_used:
        return Redispatch(continuation=True), replace(state, continuation_used=True)
    if delivered:
        code = "continuation_failed" if state.continuation_used else outcome
        message = (
            f"the host stopped mid-answer ({outcome}) and the one continuation "
            "did not complete"
        )
        return Fail(502, code, message), state
    state = replace(state, failures_before_output=state.failures_before_output + 1)
    if state.failures_before_output >= max_attempts:
        return Fail(
            502,
            "all_attempts_failed",
            f"{state.failures_before_output} attempts failed before any output "
            f"(last: {outcome}); nothing was billed",
        ), state
    return Redispatch(), state


def after_empty_answer(
    state: Failover, *, explained: bool, delivered: bool, single_device: bool
) -> tuple[Redispatch | Complete, Failover]:
    """What follows an attempt whose host ended it with no text (DESIGN.md
    "Fair to honest hosts": a prompt the model ends at once is never counted
    against a host; the attempt is not scored either way).

    ``explained``: the request itself explains it (``attempts.
    empty_answer_explained``: a tiny ``max_tokens``);
    ``delivered``: the renter has text of this job (the attempt was the
    continuation: the model ended where the answer stood); ``single_device``:
    the job runs on one device only. Then the answer is complete as it is; so
    it is once a second device also answered nothing. Otherwise one more
    device is asked (a second opinion, not a failure)."""
    if delivered or explained or single_device or state.empty_answers:
        return Complete(), state
    return Redispatch(), replace(state, empty_answers=state.empty_answers + 1)


def when_not_dispatched(
    state: Failover,
    *,
    impossible: str,
    exhausted: bool,
    continuing: bool,
    model_id: str,
    queue_timeout_s: float,
) -> Fail:
    """The end of a job no device took: ``impossible`` names the requirement no
    live device meets (``exhausted``: every one that could has failed it); empty,
    the job waited past the queue's wall clock. ``continuing``: the renter has
    part of the answer (a continuation was being placed).

    502 when a continuation cannot be placed or attempts failed before (PROTOCOL.md:
    every attempt failed), 503 ``no_capacity`` naming the requirement, 504
    ``queue_timeout`` (job ``timed_out``).
    """
    failures = state.failures_before_output
    if continuing:
        if exhausted:
            message = "no other device can continue the answer"
        elif impossible:
            message = (
                "the host stopped mid-answer and no other device can continue it "
                f"({impossible})"
            )
        else:
            message = "no device took the continuation"
        return Fail(502, "continuation_failed", message)
    if exhausted or (impossible and failures):
        reason = "" if exhausted else f" ({impossible})"
        return Fail(
            502,
            "all_attempts_failed",
            f"{failures} attempt(s) failed before any output and no other device "
            f"can serve the request{reason}; nothing was billed",
        )
    if impossible:
        return Fail(503, "no_capacity", impossible)
    return Fail(
        504,
        "queue_timeout",
        f"no device took the request for model '{model_id}' within "
        f"{queue_timeout_s:g} s (all busy or unavailable)",
        job_status=Job.Status.TIMED_OUT,
    )
