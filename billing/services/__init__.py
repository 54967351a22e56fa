"""Billing's writes by sub-domain: the ledger, receipts, charges, holds, payouts.

Every function that moves money writes one balanced transaction (entries sum to
zero) under a unique idempotency key (DESIGN.md "Money"; docs/money.md). All
amounts are integer nano-USD (``billing.money``). The names below are the public
ones: import them from ``billing.services``.
"""

from ..selectors import account_balance_nano, host_balances_nano, renter_balance_nano
from .charges import (
    ChargePlan,
    Segment,
    charge_plan,
    charge_post,
    rental_charge,
    segment_of,
)
from .holds import earnings_reverse_held, holds_release
from .ledger import (
    TOP_UP_MAX_NANO,
    UnbalancedTransaction,
    account_for,
    ledger_post,
    renter_top_up,
)
from .payouts import (
    PayoutError,
    payout_approve,
    payout_mark_paid,
    payout_reject,
    payout_request,
)
from .receipts import receipt_check, receipt_verdict

__all__ = [
    "TOP_UP_MAX_NANO",
    "ChargePlan",
    "PayoutError",
    "Segment",
    "UnbalancedTransaction",
    "account_balance_nano",
    "account_for",
    "charge_plan",
    "charge_post",
    "earnings_reverse_held",
    "holds_release",
    "host_balances_nano",
    "ledger_post",
    "payout_approve",
    "payout_mark_paid",
    "payout_reject",
    "payout_request",
    "receipt_check",
    "receipt_verdict",
    "renter_balance_nano",
    "renter_top_up",
    "rental_charge",
    "segment_of",
]
