"""Writes of the job lifecycle, by sub-domain (DESIGN.md "How a request flows"):

- ``keys``: API keys made, checked, marked used;
- ``credit``: a renter's balance less its open commitments, locked per renter;
- ``caps``: an API key's spending cap, checked and counted;
- ``requests``: admitting a request — its one transaction (``job_open``);
- ``dispatch``: the pick and the claim (``job_dispatch``, ``device_claim``);
- ``deadlines``: an attempt's claim, first-token and stall deadlines;
- ``attempts``: an attempt claimed and ended (``attempt_claim``, ``attempt_end``);
- ``attempt_receipts``: an ended attempt's receipt judged (``cancel_receipt_check``);
- ``segments``: an attempt's text billed in tokens (``segment_tokens``);
- ``endings``: a job closed and charged once (``job_succeed``, ``job_finish``),
  and the reaper (``attempts_reap``).
"""

from .attempts import attempt_claim, attempt_end, empty_answer_explained
from .caps import api_key_cap_set, key_spend_add, key_spend_cap_check
from .credit import credit_available_nano, credit_lock, credit_reserved_nano
from .deadlines import claim_deadline, first_token_deadline, stage_timeout_s
from .dispatch import (
    WOKEN_PER_SLOT,
    Dispatch,
    device_claim,
    job_dispatch,
    jobs_ahead_count,
    jobs_waiting_channels,
    offer_frame,
)
from .endings import (
    attempts_reap,
    job_answered,
    job_charge,
    job_charge_plan,
    job_finish,
    job_price_nano,
    job_succeed,
    renter_prompt_tokens,
)
from .keys import (
    API_KEY_LAST_USED_EVERY,
    api_key_authenticate,
    api_key_create,
    api_key_group,
    api_key_mark_used,
    api_key_with_model,
    api_keys_connections_close,
)
from .requests import (
    JOB_LEASE_S,
    job_build,
    job_create,
    job_lease_renew,
    job_open,
    job_submit,
    request_fits,
    request_model,
    unauthorized,
)
from .segments import segment_tokens

__all__ = [
    "API_KEY_LAST_USED_EVERY",
    "JOB_LEASE_S",
    "Dispatch",
    "api_key_authenticate",
    "api_key_with_model",
    "api_key_cap_set",
    "api_key_create",
    "api_key_group",
    "api_key_mark_used",
    "api_keys_connections_close",
    "attempt_claim",
    "attempt_end",
    "attempts_reap",
    "claim_deadline",
    "credit_available_nano",
    "credit_lock",
    "credit_reserved_nano",
    "device_claim",
    "first_token_deadline",
    "job_charge",
    "job_charge_plan",
    "job_build",
    "job_create",
    "job_dispatch",
    "empty_answer_explained",
    "job_answered",
    "job_finish",
    "job_lease_renew",
    "job_open",
    "job_price_nano",
    "job_submit",
    "job_succeed",
    "jobs_ahead_count",
    "WOKEN_PER_SLOT",
    "jobs_waiting_channels",
    "key_spend_add",
    "key_spend_cap_check",
    "offer_frame",
    "renter_prompt_tokens",
    "request_fits",
    "request_model",
    "segment_tokens",
    "stage_timeout_s",
    "unauthorized",
]
