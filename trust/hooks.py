"""What trust does when jobs tells it that an attempt or a job ended, and what
it answers jobs before a rental (``jobs.hooks``; registered by
``apps.TrustConfig.ready``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime

from hosts.services import device_outcome_record
from jobs.hooks import TrustHook
from jobs.models import Attempt, Job, Verification

from .checkpools import device_checks_missing
from .failures import device_check_failed
from .verification.exemptions import verified_text
from .verification.offers import verification_send_soon
from .verification.records import verification_choose


class Trust(TrustHook):
    """The checks of hosts' honesty, told and asked by jobs."""

    def attempt_ended(
        self,
        *,
        attempt: Attempt,
        token_ids: list[int] | None,
        now: datetime,
        ruled_out: str = "",
    ) -> None:
        """What a verifier would score of a fresh attempt's answer
        (``verification.exemptions.verified_text``: ``exemption``,
        ``verify_text``, ``verify_token_ids``); a count inflated past the
        recount, or an answer its ``response_format`` rules out
        (``ruled_out``): a failed check of the device
        (``failures.device_check_failed``; a spot check's count is judged
        with its verdict instead)."""
        job = attempt.job
        params = job.params or {}
        if (
            attempt.outcome == Attempt.Outcome.SUCCEEDED
            and attempt.kind == Attempt.Kind.FRESH
        ):
            verified = verified_text(
                model_id=job.model_id,
                text=attempt.output_text,
                token_ids=token_ids,
                stop=params.get("stop"),
            )
            attempt.exemption = verified.exemption
            attempt.verify_text = (
                None if verified.text == attempt.output_text else verified.text
            )
            # (ids of an inflated count, or more than max_tokens, are never
            # sent: a verifier scores at most max_tokens, its shortfall blamed
            # on it)
            ids, budget = verified.token_ids, params.get("max_tokens")
            attempt.verify_token_ids = (
                None
                if attempt.token_count_flagged
                or ids is None
                or (budget is not None and len(ids) > budget)
                else ids
            )
        finding = ruled_out or (
            f"{attempt.completion_tokens_reported} tokens reported for "
            f"{attempt.tokens_billed} counted"
            if attempt.token_count_flagged
            else ""
        )
        if finding and not job.is_spot_check:
            device_check_failed(
                device_id=attempt.device_id,
                model_id=job.model_id,
                detail=f"attempt {attempt.id}: {finding}",
                now=now,
                job_ref=str(job.id),
            )

    def job_ended(
        self, *, job: Job, attempts: list[Attempt], now: datetime
    ) -> Callable[[], None] | None:
        """Judge its empty answers (``empty_answers_judged``); draw whether
        the job's answer is verified
        (``verification.records.verification_choose``); one offered to a
        verifier is sent to it once the job's end has committed."""
        empty_answers_judged(job=job, attempts=attempts, now=now)
        chosen = verification_choose(job=job, attempts=attempts, now=now)
        if chosen is None or chosen.status != Verification.Status.OFFERED:
            return None
        return functools.partial(verification_send_soon, chosen.id.hex)

    def device_unchecked(self, *, device_id: int) -> str:
        """The models the device runs, when none of them has calibrated
        checks (``checkpools.device_checks_missing``)."""
        missing = device_checks_missing(device_id=device_id)
        return f"no calibrated checks for {', '.join(missing)}" if missing else ""


def empty_answers_judged(*, job: Job, attempts: list[Attempt], now: datetime) -> int:
    """An empty answer judged by what the model does with its prompt (DESIGN.md
    "Fair to honest hosts"; issue 32): at temperature 0 the model's first
    token is the same on every device, so a fresh attempt that ended empty
    while another device's fresh attempt of the job answered with text was
    its host's refusal, a failure on its score (not a failed check: a near
    tie of the end-of-turn token may fall otherwise on other hardware).
    Sampled, an empty answer may be the draw's: nobody is blamed. Returns
    how many were judged failures; in the job's end's transaction."""
    greedy = (job.params or {}).get("temperature") == 0
    answered = any(
        a.kind == Attempt.Kind.FRESH and a.outcome == Attempt.Outcome.SUCCEEDED
        and a.output_chars > 0
        for a in attempts
    )  # fmt: skip
    if job.is_spot_check or not greedy or not answered:
        return 0
    refused = [
        a for a in attempts
        if a.kind == Attempt.Kind.FRESH and a.outcome == Attempt.Outcome.EMPTY_ANSWER
    ]  # fmt: skip
    for attempt in refused:
        device_outcome_record(
            device_id=attempt.device_id,
            success=False,
            reason="empty_answer_contradicted",
            model_id=job.model_id,
            now=now,
            job_ref=str(job.id),
            detail=f"attempt {attempt.id}: no text at temperature 0, where "
            "another device's answer had some",
        )
    return len(refused)
