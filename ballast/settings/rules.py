"""Ballast's own settings (PROTOCOL.md §4): the rules' timeouts and rates,
the limits, the sockets, the metrics; read once at start."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from ballast.envvars import (
    env_bool,
    env_codes,
    env_decimal,
    env_float,
    env_int,
    env_rate,
    env_usd,
    liveness_settings_check,
)

# --- Ballast rules (PROTOCOL.md §4), read once at start -------------------------
BALLAST_CLAIM_TIMEOUT_S = env_float("BALLAST_CLAIM_TIMEOUT_S", 5.0)
BALLAST_FIRST_TOKEN_TIMEOUT_S = env_float("BALLAST_FIRST_TOKEN_TIMEOUT_S", 20.0)
BALLAST_STALL_TIMEOUT_S = env_float("BALLAST_STALL_TIMEOUT_S", 10.0)
BALLAST_QUEUE_TIMEOUT_S = env_float("BALLAST_QUEUE_TIMEOUT_S", 120.0)
BALLAST_MAX_ATTEMPTS = env_int("BALLAST_MAX_ATTEMPTS", 3, minimum=1)
BALLAST_HEARTBEAT_MAX_AGE_S = env_float("BALLAST_HEARTBEAT_MAX_AGE_S", 30.0)
BALLAST_HEARTBEAT_INTERVAL_S = env_float(
    "BALLAST_HEARTBEAT_INTERVAL_S", 10.0, minimum=0.05
)
# Liveness lease of each coordinator process (hosts.liveness): renewed every
# BALLAST_LEASE_RENEW_S to BALLAST_LEASE_S ahead; a machine silent for longer than
# max age − lease − margin is marked stale before each renewal.
BALLAST_LEASE_S = env_float("BALLAST_LEASE_S", 5.0, minimum=0.1)
BALLAST_LEASE_RENEW_S = env_float("BALLAST_LEASE_RENEW_S", 1.0, minimum=0.02)
BALLAST_LEASE_MARGIN_S = env_float("BALLAST_LEASE_MARGIN_S", 1.0)


liveness_settings_check(
    max_age_s=BALLAST_HEARTBEAT_MAX_AGE_S,
    interval_s=BALLAST_HEARTBEAT_INTERVAL_S,
    lease_s=BALLAST_LEASE_S,
    renew_s=BALLAST_LEASE_RENEW_S,
    margin_s=BALLAST_LEASE_MARGIN_S,
)
BALLAST_MAX_GPU_TEMP_C = env_float("BALLAST_MAX_GPU_TEMP_C", 88.0)

# the regions machines may be in (hosts.regions); none given: all of hosts.regions.REGIONS
BALLAST_REGIONS = env_codes("BALLAST_REGIONS")
# what a host may declare (hosts.protocol): devices in a hello (indexes below it),
# slots a device may report
BALLAST_MAX_DEVICES_PER_MACHINE = env_int(
    "BALLAST_MAX_DEVICES_PER_MACHINE", 16, minimum=1
)
BALLAST_MAX_SLOTS_PER_DEVICE = env_int("BALLAST_MAX_SLOTS_PER_DEVICE", 64, minimum=1)
BALLAST_SPOT_CHECKS = env_bool("BALLAST_SPOT_CHECKS", True)
# a job's coroutine and its machine's connection in one process skip the channel
# layer (ballast.local); 0: every message through the layer
BALLAST_LOCAL_DELIVERY = env_bool("BALLAST_LOCAL_DELIVERY", True)
BALLAST_CANARY_RATE = env_float("BALLAST_CANARY_RATE", 0.02)
BALLAST_SPOT_CHECK_MAX_DELAY_S = env_float("BALLAST_SPOT_CHECK_MAX_DELAY_S", 60.0)
# the spot-check pool (trust/canarypool.py): drawn under this secret (empty: one
# derived from SECRET_KEY), never-sent prompts kept per model (at least a day's
# checks), seconds of calibration per beat run, real jobs whose shapes checks
# copy, and a deployment's own words (a JSON file outside the repository)
BALLAST_CANARY_SECRET = os.environ.get("BALLAST_CANARY_SECRET", "")
BALLAST_CANARY_POOL_AHEAD = env_int("BALLAST_CANARY_POOL_AHEAD", 1000, minimum=1)
BALLAST_CANARY_POOL_BUDGET_S = env_float(
    "BALLAST_CANARY_POOL_BUDGET_S", 20.0, minimum=1.0
)
BALLAST_CANARY_SHAPE_JOBS = env_int("BALLAST_CANARY_SHAPE_JOBS", 500, minimum=1)
BALLAST_CANARY_VOCAB_FILE = os.environ.get("BALLAST_CANARY_VOCAB_FILE", "")
BALLAST_QUARANTINE_CHECK_EVERY_S = env_float("BALLAST_QUARANTINE_CHECK_EVERY_S", 180.0)
# verification of real answers (trust/verification/rate.py): the base share of
# answers re-scored by prefill on another owner's device, raised for a
# device's first jobs and after a failed check (halving every
# BALLAST_VERIFY_SUSPECT_PASSES passes); a verifier's scores due within the deadline.
# The defaults are what bench/trust.py needed to quarantine each cheat within 100
# of its jobs in 99 % of runs (docs/trust.md); at 0.08 a host honest for 500 jobs
# and then serving another model was caught in time in 99 of 101 runs of one seed
BALLAST_VERIFY_RATE = float(env_decimal("BALLAST_VERIFY_RATE", "0.10"))
BALLAST_VERIFY_NEW_JOBS = env_int("BALLAST_VERIFY_NEW_JOBS", 20, minimum=0)
BALLAST_VERIFY_NEW_RATE = float(env_decimal("BALLAST_VERIFY_NEW_RATE", "0.5"))
BALLAST_VERIFY_SUSPECT_RATE = float(env_decimal("BALLAST_VERIFY_SUSPECT_RATE", "0.5"))
BALLAST_VERIFY_SUSPECT_PASSES = env_int("BALLAST_VERIFY_SUSPECT_PASSES", 5, minimum=1)
# the share of a device's answers that may leave something out of verification
# (a stop sequence's cut last token, bytes that are no character) before it is
# verified more (trust/verification/rate.py exempt_multiplier: its share over this);
# the share of round-1 plausible verdicts asked of a second verifier all the same
BALLAST_VERIFY_EXEMPT_SHARE = float(env_decimal("BALLAST_VERIFY_EXEMPT_SHARE", "0.05"))
if BALLAST_VERIFY_EXEMPT_SHARE <= 0:
    raise ImproperlyConfigured("BALLAST_VERIFY_EXEMPT_SHARE must be above 0 (up to 1)")
BALLAST_VERIFY_SECOND_SHARE = float(env_decimal("BALLAST_VERIFY_SECOND_SHARE", "0.2"))
# (scoring 2,000 tokens takes ~30 s on a CPU, after the generation holding the engine)
BALLAST_VERIFY_DEADLINE_S = env_float("BALLAST_VERIFY_DEADLINE_S", 300.0, minimum=1.0)
# checks of verifiers (trust/verification/checks.py): answers whose verdict the
# reference model knows, sent to each verifying device on a clock of their own:
# every BALLAST_VERIFIER_CHECK_NEW_EVERY_S on average until it has passed
# BALLAST_VERIFIER_TRUST_PASSES in a row, then every BALLAST_VERIFIER_CHECK_EVERY_S
BALLAST_VERIFIER_CHECKS = env_bool("BALLAST_VERIFIER_CHECKS", True)
BALLAST_VERIFIER_TRUST_PASSES = env_int("BALLAST_VERIFIER_TRUST_PASSES", 3, minimum=1)
BALLAST_VERIFIER_CHECK_NEW_EVERY_S = env_float(
    "BALLAST_VERIFIER_CHECK_NEW_EVERY_S", 900.0, minimum=1.0
)
BALLAST_VERIFIER_CHECK_EVERY_S = env_float(
    "BALLAST_VERIFIER_CHECK_EVERY_S", 21600.0, minimum=1.0
)
BALLAST_RENTAL_CHECK_EVERY_S = env_float("BALLAST_RENTAL_CHECK_EVERY_S", 1800.0)
BALLAST_RENTAL_USD_PER_HOUR = os.environ.get("BALLAST_RENTAL_USD_PER_HOUR", "0.20")
# a rental whose device has been offline or paused this long (s) ends itself: its
# renter pays only the live time, its owner is told why (docs/money.md "Rentals")
BALLAST_RENTAL_OFFLINE_END_S = env_float(
    "BALLAST_RENTAL_OFFLINE_END_S", 600.0, minimum=1.0
)
BALLAST_HOST_SHARE = env_decimal("BALLAST_HOST_SHARE", "0.80")
BALLAST_HOLD_HOURS = env_float("BALLAST_HOLD_HOURS", 24.0)
# a renter is emailed once when their balance falls below this (USD; 0: never),
# unless they set their own threshold (docs/money.md "Low balance")
BALLAST_LOW_BALANCE_USD = env_usd("BALLAST_LOW_BALANCE_USD", "1.00")
BALLAST_OFFLINE_ALERT_AFTER_S = env_float("BALLAST_OFFLINE_ALERT_AFTER_S", 300.0)
BALLAST_REAPER_INTERVAL_S = env_float("BALLAST_REAPER_INTERVAL_S", 30.0, minimum=1.0)

# --- limits and abuse (DESIGN.md "Limits and abuse"; ballast/ratelimits.py) --------
BALLAST_KEY_RATE = env_rate("BALLAST_KEY_RATE", "120/minute")
BALLAST_KEY_MAX_JOBS = env_int("BALLAST_KEY_MAX_JOBS", 16, minimum=1)
# answers that came back empty (the model ended at once) per key: past it, the
# key's requests are refused until the window frees (hosts' work is never free)
BALLAST_EMPTY_ANSWER_RATE = env_rate("BALLAST_EMPTY_ANSWER_RATE", "60/hour")
BALLAST_QUEUE_SHARE = env_decimal("BALLAST_QUEUE_SHARE", "0.5")
BALLAST_QUEUE_SHARE_MIN = env_int("BALLAST_QUEUE_SHARE_MIN", 4, minimum=1)
BALLAST_LOGIN_RATE = env_rate("BALLAST_LOGIN_RATE", "10/minute")
BALLAST_SIGNUP_RATE = env_rate("BALLAST_SIGNUP_RATE", "5/hour")
BALLAST_PASSWORD_RESET_RATE = env_rate("BALLAST_PASSWORD_RESET_RATE", "5/hour")
BALLAST_TICKET_RATE = env_rate("BALLAST_TICKET_RATE", "10/hour")
BALLAST_CODE_REDEEM_RATE = env_rate("BALLAST_CODE_REDEEM_RATE", "10/hour")
# websockets (ballast/sockets.py): a socket that has not said hello (host) or sent
# a request (renter) within BALLAST_HELLO_TIMEOUT_S is closed (4408); open sockets
# per machine, API key and client address are capped (4429), counted with a lease
# (s) that a process renews for its live sockets
BALLAST_HELLO_TIMEOUT_S = env_float("BALLAST_HELLO_TIMEOUT_S", 10.0, minimum=0.1)
BALLAST_SOCKETS_PER_MACHINE = env_int("BALLAST_SOCKETS_PER_MACHINE", 4, minimum=1)
BALLAST_SOCKETS_PER_KEY = env_int("BALLAST_SOCKETS_PER_KEY", 32, minimum=1)
BALLAST_SOCKETS_PER_ADDRESS = env_int("BALLAST_SOCKETS_PER_ADDRESS", 128, minimum=1)
BALLAST_SOCKET_LEASE_S = env_float("BALLAST_SOCKET_LEASE_S", 60.0, minimum=1.0)
# how long (s) a job whose segment the coordinator ended waits for the host's
# ``cancelled`` receipt before it closes (docs/protocol-notes.md)
BALLAST_CANCEL_RECEIPT_WAIT_S = env_float("BALLAST_CANCEL_RECEIPT_WAIT_S", 2.0)

# Metrics (docs/metrics.md): GET /metrics for staff sessions, or for a scraper
# sending "Authorization: Bearer $BALLAST_METRICS_TOKEN" (unset: staff only).
# Several processes of one machine share their counters through prometheus-client's
# own PROMETHEUS_MULTIPROC_DIR (an existing, empty folder at their start).
BALLAST_METRICS_TOKEN = os.environ.get("BALLAST_METRICS_TOKEN", "")
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
if PROMETHEUS_MULTIPROC_DIR and not os.path.isdir(PROMETHEUS_MULTIPROC_DIR):
    raise ImproperlyConfigured(
        f"PROMETHEUS_MULTIPROC_DIR must be an existing folder, got {PROMETHEUS_MULTIPROC_DIR!r}"
    )
