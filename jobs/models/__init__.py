"""Renters' API keys, jobs and their attempts, spot checks, rentals and
verifications (the catalog is ``catalog.models``).

Money is integer nano-USD (``billing.money``); times are timezone-aware UTC.
``keys``: API keys; ``jobs``: jobs and attempts; ``checks``: the spot-check pool
and each check; ``rentals``; ``verifications``: re-scorings of real answers.
"""

from .checks import CanaryPrompt, SpotCheck
from .jobs import Attempt, Job
from .keys import SPEND_EPOCH, ApiKey
from .rentals import Rental, RentalPause
from .verifications import Verification

__all__ = [
    "SPEND_EPOCH",
    "ApiKey",
    "Attempt",
    "CanaryPrompt",
    "Job",
    "Rental",
    "RentalPause",
    "SpotCheck",
    "Verification",
]
