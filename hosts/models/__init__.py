"""Machines (one agent each) and their devices (GPUs), DESIGN.md "Vocabulary".

Rules about one row live on the models (``Machine.is_online``,
``Device.is_eligible_for``); anything that writes several rows is in
``hosts.services``. ``machines``: machines and process leases; ``devices``:
devices, their models, failed loads, benchmarks, measurements; ``history``: outcomes, score
samples, online spans, staff's quarantine decisions.
"""

from .devices import (
    Benchmark,
    Device,
    DeviceModel,
    FailedCapability,
    Measurement,
    vram_need_mb,
)
from .history import DeviceOutcome, OnlineSpan, QuarantineDecision, ScoreSample
from .machines import CoordinatorLease, Machine, token_hash, token_new

__all__ = [
    "Benchmark",
    "CoordinatorLease",
    "Device",
    "DeviceModel",
    "DeviceOutcome",
    "FailedCapability",
    "Machine",
    "Measurement",
    "OnlineSpan",
    "QuarantineDecision",
    "ScoreSample",
    "token_hash",
    "token_new",
    "vram_need_mb",
]
