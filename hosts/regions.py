"""The regions a machine may be in: a fixed list, so renters' ``placement.region``
(PROTOCOL.md §1, matched exactly) finds every machine of a region.

The offered codes are ``BALLAST_REGIONS`` (settings, comma-separated; unset:
every code of ``REGIONS``). A machine's region is one of them, or empty (not
given). A code the settings add without a label here reads as itself.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError

# code → what a person reads; codes are lower case, as placement matches them
REGIONS: dict[str, str] = {
    "af": "Africa",
    "ap-east": "East Asia",
    "ap-south": "South Asia",
    "ap-southeast": "Southeast Asia",
    "ca": "Canada",
    "eu": "Europe",
    "me": "Middle East",
    "oc": "Oceania",
    "sa": "South America",
    "us-east": "United States, east",
    "us-west": "United States, west",
}


def region_codes() -> list[str]:
    """The region codes machines may use now (``BALLAST_REGIONS``, else every
    code of ``REGIONS``), in order."""
    return list(settings.BALLAST_REGIONS or REGIONS)


def region_choices() -> list[tuple[str, str]]:
    """(code, "code — label") pairs for a form's select, with "not given" first."""
    return [("", "not given")] + [
        (code, f"{code} — {REGIONS.get(code, code)}") for code in region_codes()
    ]


def region_clean(value: str | None) -> str:
    """Return ``value`` as a region code (stripped, lower case; "" when empty).

    Raises ValueError naming the allowed codes for anything else.
    """
    code = (value or "").strip().lower()
    if code and code not in region_codes():
        raise ValueError(
            f"unknown region {value.strip()!r}: use one of {', '.join(region_codes())}"
            " (or leave it empty)"
        )
    return code


def region_validate(value: str) -> None:
    """The model field's validator (the admin's forms): ``region_clean`` as a
    ValidationError."""
    try:
        region_clean(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="region") from None
