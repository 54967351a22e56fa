"""Billing's writes by sub-domain: the ledger, credit, codes, receipts, charges,
holds, payouts.

Every function that moves money writes one balanced transaction (entries sum to
zero) under a unique idempotency key (DESIGN.md "Money"; docs/money.md). All
amounts are integer nano-USD (``billing.money``). The names below are the public
ones: import them from ``billing.services``.
"""

from ..selectors import account_balance_nano, host_balances_nano, renter_balance_nano
from .balance_low import (
    balance_low_emails_send,
    balance_low_mark,
    balance_low_rearm,
    balance_low_threshold_nano,
    balance_low_threshold_set,
)
from .charges import (
    ChargePlan,
    Segment,
    charge_plan,
    charge_post,
    rental_charge,
    segment_of,
)
from .codes import (
    CreditCodeError,
    credit_code_create,
    credit_code_new_text,
    credit_code_normalize,
    credit_code_redeem,
    credit_code_words,
)
from .credit import (
    TOP_UP_MAX_NANO,
    CreditError,
    CreditSource,
    credit_add,
    credit_refund,
    credit_refundable_nano,
    renter_top_up,
)
from .holds import earnings_reverse_held, holds_release
from .ledger import UnbalancedTransaction, account_for, accounts_for, ledger_post
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
    "CreditCodeError",
    "CreditError",
    "CreditSource",
    "PayoutError",
    "Segment",
    "UnbalancedTransaction",
    "account_balance_nano",
    "account_for",
    "accounts_for",
    "balance_low_emails_send",
    "balance_low_mark",
    "balance_low_rearm",
    "balance_low_threshold_nano",
    "balance_low_threshold_set",
    "charge_plan",
    "charge_post",
    "credit_add",
    "credit_code_create",
    "credit_code_new_text",
    "credit_code_normalize",
    "credit_code_redeem",
    "credit_code_words",
    "credit_refund",
    "credit_refundable_nano",
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
