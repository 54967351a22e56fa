"""Reads behind the hosts' pages (``machines``: the dashboard and a machine
page's head; ``devices``: score parts and what a page shows of each device;
``history``: recent jobs, rentals, benchmarks, earnings per day, score
samples).

Amounts are integer nano-USD; times timezone-aware UTC; sizes MiB;
temperatures °C.
"""

from .devices import (
    ScoreParts,
    device_score_parts,
    DeviceView,
    device_views,
)
from .history import (
    machine_attempts,
    machine_rentals,
    BenchmarkRow,
    machine_benchmarks,
    machine_earnings_daily,
    machine_score_history,
    SCORE_HISTORY,
)
from .machines import (
    Earnings,
    MachineRow,
    machine_status,
    machine_of_owner,
    machine_of_viewer,
    earnings_by_machine,
    host_earnings,
    machine_rows,
    machines_retired,
    machine_waiting,
    MachineNotices,
    machine_notices,
    RELEASE_SHOWN,
)

__all__ = [
    "BenchmarkRow",
    "DeviceView",
    "Earnings",
    "MachineNotices",
    "MachineRow",
    "RELEASE_SHOWN",
    "SCORE_HISTORY",
    "ScoreParts",
    "device_score_parts",
    "device_views",
    "earnings_by_machine",
    "host_earnings",
    "machine_attempts",
    "machine_benchmarks",
    "machine_earnings_daily",
    "machine_notices",
    "machine_of_owner",
    "machine_of_viewer",
    "machine_rentals",
    "machine_rows",
    "machine_score_history",
    "machine_status",
    "machine_waiting",
    "machines_retired",
]
