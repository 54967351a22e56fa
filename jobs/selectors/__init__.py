"""Reads for the scheduler: eligible devices and why none could serve a request.

DESIGN.md "Picking a device" — the numbered eligibility rules are marked in
``eligibility`` (which devices may take a job, as querysets and as the SQL one
dispatch runs; the ranking); ``unplaced`` says why none can (the 503 of "No
eligible device"); ``capacity`` what the live fleet offers (a model's free
slots, the devices a renter may rent).
"""

from .capacity import devices_rentable, model_capacity
from .eligibility import (
    RANKING,
    device_pick_sql,
    devices_eligible,
    devices_eligible_count,
    devices_live,
    devices_rented,
    features_filter,
    features_sql,
    model_loaded,
    model_loaded_sql,
    placement_filter,
    placement_sql,
    tiebreak_step,
)
from .unplaced import FEATURE_FIELDS, devices_untried_exist, requirement_unmet

__all__ = [
    "FEATURE_FIELDS",
    "RANKING",
    "device_pick_sql",
    "devices_eligible",
    "devices_eligible_count",
    "devices_live",
    "devices_rentable",
    "devices_rented",
    "devices_untried_exist",
    "features_filter",
    "features_sql",
    "model_capacity",
    "model_loaded",
    "model_loaded_sql",
    "placement_filter",
    "placement_sql",
    "requirement_unmet",
    "tiebreak_step",
]
