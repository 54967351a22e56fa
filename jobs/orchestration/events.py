"""What a job's coroutine yields (``Token``, ``Finished``, ``Failed``) and what it
keeps of each attempt it follows (``Segment``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ..models import Attempt, Job


@dataclass
class Token:
    """A piece of output text delivered to the renter."""

    text: str


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

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def usage_of(job: Job) -> dict:
    """``usage`` of OpenAI's responses for a finished job, tokens."""
    return {
        "prompt_tokens": job.prompt_tokens,
        "completion_tokens": job.tokens_billed,
        "total_tokens": job.prompt_tokens + job.tokens_billed,
    }
