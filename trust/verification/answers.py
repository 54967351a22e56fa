"""What a verification scores: a renter's answer with its job's conversation,
or a check of a verifier's answer with its spot-check prompt
(``trust.verification.checks``). One shape for both, so the ``verify`` frame,
the judge and the pay never ask which it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from catalog.models import CatalogModel
from jobs.models import Verification
from jobs.services.endings import job_price_nano


@dataclass(frozen=True)
class VerifiedAnswer:
    """``answer`` (text) as the completion of ``messages`` (chat) or
    ``prompt`` (completions) of model ``model_id`` under ``params`` (the
    offer's: ``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed``),
    its host's ``billed`` tokens (None for a check), priced at
    ``price_nano`` per token (nano-USD); ``token_ids``: the host's ids of
    ``answer``, which a verifier scores (None: it scores the text tokenized)."""

    model_id: str
    endpoint: str
    messages: list[dict[str, Any]] | None
    prompt: str | None
    params: dict[str, Any]
    answer: str
    billed: int | None
    price_nano: int
    token_ids: list[int] | None = None

    @property
    def temperature(self) -> float:
        """The temperature it is judged at (a missing one is 1.0)."""
        value = self.params.get("temperature")
        return 1.0 if value is None else float(value)


def verified_answer(ver: Verification) -> VerifiedAnswer:
    """The answer ``ver`` scores (its ``job``'s, ``_verified_text``, or its
    ``canary``'s for a check: the reference model's answer at the check's
    temperature when ``expected_plausible``, else the decoy)."""
    if ver.canary_id is not None:
        canary = ver.canary
        params = {**canary.params, "temperature": canary.check_temperature}
        return VerifiedAnswer(
            model_id=canary.model_id,
            endpoint=canary.endpoint,
            messages=canary.messages,
            prompt=canary.prompt,
            params=params,
            answer=canary.check_output if ver.expected_plausible else canary.decoy_output,
            billed=None,
            price_nano=CatalogModel.objects.get(id=canary.model_id).price_completion_nano,
        )
    job = ver.job
    return VerifiedAnswer(
        model_id=job.model_id,
        endpoint=job.endpoint,
        messages=job.messages,
        prompt=job.prompt,
        params=job.params or {},
        answer=_verified_text(ver),
        billed=job.tokens_billed,
        price_nano=job_price_nano(job),
        token_ids=ver.attempt.verify_token_ids if ver.attempt is not None else None,
    )


def _verified_text(ver: Verification) -> str:
    """What a verifier scores of ``ver``'s answer: its attempt's
    ``verify_text`` (what the coordinator saw of the host's token ids left
    out, ``exemptions.verified_text``), else the job's ``output_text``."""
    attempt = ver.attempt
    if attempt is not None and attempt.verify_text is not None:
        return attempt.verify_text
    return ver.job.output_text


def is_chat(answer: VerifiedAnswer) -> bool:
    """Whether the conversation is a chat's ``messages`` (else a ``prompt``:
    a completion's, or a chat its model's template rendered, with tools)."""
    return answer.messages is not None
