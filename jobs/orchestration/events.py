"""What a job's coroutine yields (``Token``, ``Finished``, ``Failed``) and what it
keeps of each attempt it follows (``Segment``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ..models import Attempt, Job
from .budget import OutputBudget


@dataclass
class Token:
    """A piece of output text delivered to the renter, with its tokens'
    log-probabilities when the request asked for them (entries of
    ``hosts.logprobs.parse_token_logprobs``; None when not asked)."""

    text: str
    logprobs: list[dict] | None = None


@dataclass
class Finished:
    """The job succeeded; ``usage`` is {prompt_tokens, completion_tokens, total_tokens}."""

    finish_reason: str
    usage: dict


@dataclass
class Failed:
    """The job failed. Before any output ``status`` is the HTTP code to answer."""

    status: int
    code: str
    message: str
    after_output: bool
    usage: dict = field(default_factory=dict)


@dataclass
class Segment:
    """One attempt as its coroutine follows it."""

    attempt: Attempt
    machine_channel: str
    pieces: list[str] = field(default_factory=list)
    outcome: str = ""
    error: str = ""
    done: dict | None = None
    # the host's answer to a cancel the coordinator sent while the renter had
    # its text (``JobRun._receipt_wait``): usage, receipt and the text it sent
    cancel_receipt: dict | None = None
    claimed_at: datetime | None = None
    first_token_at: datetime | None = None
    received: int = 0  # characters of the host's text that reached the job
    logprob_bytes: int = 0  # bytes of the tokens whose logprobs were delivered

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def produced_take(self, budget: OutputBudget) -> None:
        """Add to this cancelled segment of a non-streamed answer the text its
        host produced after what reached the job, up to the cancel: the rest
        of what its connection relayed with the ``cancelled`` receipt (the text
        the receipt signs), within the renter's ``budget`` (``max_tokens``).
        Nothing without a receipt, or when that text does not begin with the
        segment's."""
        sent = (self.cancel_receipt or {}).get("text")
        if not sent or not sent.startswith(self.text):
            return
        produced, _ = budget.take(sent[len(self.text) :])
        if produced:
            self.pieces.append(produced)

    def logprobs_delivered(
        self, entries: list[dict], text: str, *, cut: bool
    ) -> list[dict]:
        """``entries`` as delivered with ``text`` (not yet among ``pieces``): all
        of them, or when the renter's ``max_tokens`` cut the text (``cut``), the
        tokens whose bytes lie within the segment's text delivered."""
        if cut:
            room = len((self.text + text).encode("utf-8")) - self.logprob_bytes
            kept = []
            for entry in entries:
                room -= len(entry["bytes"])
                if room < 0:
                    break
                kept.append(entry)
            entries = kept
        self.logprob_bytes += sum(len(entry["bytes"]) for entry in entries)
        return entries


def usage_of(job: Job) -> dict:
    """``usage`` of OpenAI's responses for a finished job, tokens."""
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.tokens_billed,
        "total_tokens": job.prompt_tokens + job.tokens_billed,
    }
