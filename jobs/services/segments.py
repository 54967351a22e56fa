"""A segment's tokens: what an attempt's text is billed and whether its
host's count was inflated (DESIGN.md "Money": billed = min(reported,
recount)), judged at the attempt's end (``attempts.attempt_end``)."""

from __future__ import annotations

from ..formats import response_format_of
from ..models import Attempt
from ..tokens import (
    canonical_split_expected,
    token_count,
    token_count_inflated,
    token_ids_held,
    token_ids_spell,
)


def segment_tokens(
    *,
    model_id: str,
    text: str,
    reported: int | None,
    token_ids: list[int] | None = None,
    continue_from: str = "",
    canonical: bool = True,
    budget: int | None = None,
) -> tuple[int, bool]:
    """(tokens to bill for a segment, whether the host's count was inflated).

    DESIGN.md "Money": billed = min(reported, recount) where the coordinator has
    the model's tokenizer, else min(reported, characters); no report (a segment
    the coordinator ended) bills the recount (or the characters). Inflated: as
    ``tokens.token_count_inflated``, judged by the host's ``token_ids`` where
    it sent them (``tokens.token_ids_spell``, over the ``continue_from`` the
    segment continued) and otherwise against the recount where a
    ``canonical`` split is expected (``tokens.canonical_split_expected``),
    less the last ids that stand for no text sent (``tokens.token_ids_held``:
    a character ``max_tokens`` cut, held back by the agent); more than the
    job's ``budget`` (its ``max_tokens``: no segment's offer
    allows more) and than the recount is inflated however it is spelled (an
    honest sampler draws no more tokens than it was allowed).
    """
    if not text:
        return 0, bool(reported)
    recount = token_count(model_id, text)
    ceiling = recount if recount is not None else len(text)
    if reported is None:
        return min(ceiling, len(text)), False
    spelled = (
        None
        if token_ids is None
        else token_ids_spell(
            model_id, ids=token_ids, text=text, continue_from=continue_from
        )
    )
    over_budget = budget is not None and reported > max(budget, recount or 0)
    held = (  # (a character cut by max_tokens: its tokens are no finer split)
        token_ids_held(model_id, ids=token_ids, text=text, continue_from=continue_from)
        if spelled and token_ids
        else 0
    )
    inflated = over_budget or token_count_inflated(
        reported=reported - held,
        text=text,
        recount=recount,
        spelled=spelled,
        canonical=canonical,
    )
    return min(reported, ceiling, len(text)), inflated


def segment_canonical(job) -> bool:
    """``tokens.canonical_split_expected`` for ``job``'s request."""
    params = job.params or {}
    return canonical_split_expected(
        constrained=response_format_of(params) is not None,
        temperature=params.get("temperature"),
    )


def segment_continued_from(attempt: Attempt) -> str:
    """The text a continuation ``attempt`` was offered to continue (what the
    job's earlier attempts delivered), "" for a fresh one."""
    if not attempt.continue_from_chars:
        return ""
    earlier = (
        Attempt.objects.filter(job_id=attempt.job_id, offered_at__lt=attempt.offered_at)
        .order_by("offered_at", "id")
        .values_list("output_text", flat=True)
    )
    return "".join(earlier)[: attempt.continue_from_chars]
