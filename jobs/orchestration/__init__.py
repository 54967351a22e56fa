"""Running a job (DESIGN.md "How a request flows" steps 3–8): ``run.JobRun``
dispatches its attempts and ends them and the job (``endings.JobEndings``),
``follow`` follows each one's frames; ``channels`` holds its side of the channel
layer."""

from .channels import (
    cancel_message,
    job_channel_open,
    offer_message,
    slots_announce,
    slots_announce_soon,
)
from .events import Failed, Finished, Token
from .run import SLOT_POLL_S, JobRun

__all__ = [
    "SLOT_POLL_S",
    "Failed",
    "Finished",
    "JobRun",
    "Token",
    "cancel_message",
    "job_channel_open",
    "offer_message",
    "slots_announce",
    "slots_announce_soon",
]
