"""Writes for machines and devices (DESIGN.md's hosts side), by sub-domain.

``registration``: a machine registered, its name's rules; ``machines``: the
agent's hello and disconnect, failed loads and benchmarks; ``heartbeats``: what of a heartbeat is written, the process lease;
``uptime``: online spans and the online fraction; ``scores``: outcomes, the
reliability score and quarantine; ``spot_checks``: when a check is due;
``trust``: what a machine and its owner carry whatever a device is called;
``placement``: what a device's measured speed allows placement. Every
write is a transaction; consumers call them through ``db_call``. Callers import
from ``hosts.services``.
"""

from .decisions import (
    DecisionRefused,
    device_quarantine_by_staff,
    device_release_by_staff,
)
from .heartbeats import (
    LEASES_KEPT,
    TELEMETRY_REFRESH,
    TELEMETRY_REFRESH_BEATS,
    TEMP_STEP_C,
    VRAM_STEP_MB,
    HeartbeatMemo,
    HeartbeatResult,
    heartbeat_changes,
    heartbeat_interval_s,
    heartbeat_memo_update,
    lease_renew,
    machine_heartbeat,
    machines_stale_mark,
    telemetry_refresh,
)
from .machines import (
    BENCHMARKS_KEPT,
    RETURN_AFTER,
    KeyMismatch,
    MachineRefused,
    benchmark_record,
    capability_failed_record,
    devices_retire,
    machine_authenticate,
    machine_connections_close,
    machine_disconnect,
    machine_hello,
    machines_of_owner_close,
)
from .placement import device_placement_judge, device_speed_record
from .registration import (
    MachineNameTaken,
    machine_create,
    machine_name_clean,
    machine_name_save,
    machine_register,
    user_get_or_create,
)
from .scores import (
    ScoreInputs,
    device_outcome_record,
    device_quarantine_judge,
    device_quarantine_release_judge,
    device_score_inputs,
    device_score_recompute,
    spot_checks_recent,
)
from .spot_checks import machines_spot_check_due, spot_check_mark_due
from .trust import (
    device_quarantine,
    device_start_reason,
    machine_first_hello_judge,
    machine_suspected_since,
    suspected_since_sql,
)
from .uptime import (
    device_online_fraction,
    machine_spans,
    online_fraction,
    online_span_close,
    online_span_extend,
    spans_online,
)

__all__ = [
    "BENCHMARKS_KEPT",
    "DecisionRefused",
    "LEASES_KEPT",
    "RETURN_AFTER",
    "TELEMETRY_REFRESH",
    "TELEMETRY_REFRESH_BEATS",
    "TEMP_STEP_C",
    "VRAM_STEP_MB",
    "HeartbeatMemo",
    "HeartbeatResult",
    "KeyMismatch",
    "MachineNameTaken",
    "MachineRefused",
    "ScoreInputs",
    "benchmark_record",
    "capability_failed_record",
    "device_online_fraction",
    "devices_retire",
    "device_outcome_record",
    "device_placement_judge",
    "device_quarantine",
    "device_quarantine_by_staff",
    "device_release_by_staff",
    "device_quarantine_judge",
    "device_quarantine_release_judge",
    "device_score_inputs",
    "device_score_recompute",
    "device_speed_record",
    "device_start_reason",
    "heartbeat_changes",
    "heartbeat_interval_s",
    "heartbeat_memo_update",
    "lease_renew",
    "machine_authenticate",
    "machine_connections_close",
    "machine_create",
    "machine_disconnect",
    "machine_first_hello_judge",
    "machine_heartbeat",
    "machine_hello",
    "machine_name_clean",
    "machine_name_save",
    "machine_register",
    "machines_of_owner_close",
    "machines_spot_check_due",
    "machine_spans",
    "machines_stale_mark",
    "machine_suspected_since",
    "online_fraction",
    "online_span_close",
    "online_span_extend",
    "spot_check_mark_due",
    "spans_online",
    "spot_checks_recent",
    "suspected_since_sql",
    "telemetry_refresh",
    "user_get_or_create",
]
