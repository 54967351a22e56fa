"""The GPU classes a renter may place a job on, and the speed each must show.

``placement.gpu`` and ``placement.min_vram_gb`` are judged against what Ballast
measured, not what a host declared (docs/design-notes.md "Placement by what
was measured"). A device's declared name puts it in a class of ``GPU_CLASSES``
(or in none: a name Ballast does not know is never placed by gpu or VRAM); the
class says the most VRAM such a GPU has and its speed tier; ``FLOORS`` says, per
catalog model, the speed (tokens/s, measured by the coordinator from the offer
to the ``done``: network and prompt included) a device of each tier reaches at
least. A device matches its class only while its measured speed on the
model is at or above that floor.

The floors are conservative estimates for a host on a home connection (about
100 ms of network and prompt per job) and sit far above what a desktop CPU
reaches; staff replace them with their reference devices' figures. A catalog
model with no floors is never placed by gpu or VRAM (a 503 says why).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# speed tiers (``TIERS``: fastest first)
TOP, HIGH, MID, ENTRY = "top", "high", "mid", "entry"


@dataclass(frozen=True)
class GpuClass:
    """A GPU model a renter may ask for: ``name`` as shown, ``pattern`` (a regex
    searched in the upper-cased declared name), ``vram_mb`` the most VRAM any
    card of the class has (MiB: what a device of the class is credited at
    most), ``tier`` its speed tier (``FLOORS``)."""

    name: str
    pattern: str
    vram_mb: int
    tier: str


def _gpu(name: str, token: str, vram_gb: int, tier: str) -> GpuClass:
    """A class whose declared names hold ``token`` not inside a longer number
    or name (``A10`` never matches ``A100``, ``L4`` never ``L40``; ``4090``
    matches ``RTX4090``)."""
    before = "(?<![0-9])" if token[0].isdigit() else "(?<![A-Z0-9])"
    return GpuClass(
        name, rf"{before}{re.escape(token)}(?![0-9])", vram_gb * 1024, tier
    )


# the first class whose pattern a declared name holds is the device's class
GPU_CLASSES: tuple[GpuClass, ...] = (
    _gpu("H200", "H200", 141, TOP),
    _gpu("H100", "H100", 94, TOP),
    _gpu("A100", "A100", 80, TOP),
    _gpu("L40S", "L40S", 48, TOP),
    _gpu("L40", "L40", 48, HIGH),
    _gpu("RTX 5090", "5090", 32, TOP),
    _gpu("RTX 5080", "5080", 16, HIGH),
    _gpu("RTX 4090", "4090", 24, TOP),
    _gpu("RTX 4080", "4080", 16, HIGH),
    _gpu("RTX 3090", "3090", 24, HIGH),
    _gpu("RTX 6000 Ada", "6000 ADA", 48, HIGH),
    _gpu("RTX A6000", "A6000", 48, HIGH),
    _gpu("Radeon RX 7900", "7900", 24, HIGH),
    _gpu("RTX 4070", "4070", 16, MID),
    _gpu("RTX 3080", "3080", 12, MID),
    _gpu("RTX 3070", "3070", 8, MID),
    _gpu("A10", "A10", 24, MID),
    _gpu("L4", "L4", 24, MID),
    _gpu("RTX 4060", "4060", 16, ENTRY),
    _gpu("RTX 3060", "3060", 12, ENTRY),
    _gpu("T4", "T4", 16, ENTRY),
)

# per catalog model: tier → the least tokens/s (offer to done, answers of at
# least ``MEASURED_MIN_TOKENS`` tokens) a device of that tier reaches
FLOORS: dict[str, dict[str, float]] = {
    "smollm2-135m-instruct": {TOP: 250.0, HIGH: 200.0, MID: 170.0, ENTRY: 150.0},
}

# a job's measurement counts when its answer has at least this many tokens
MEASURED_MIN_TOKENS = 32
# the measured speed is the median of this many latest measurements …
MEASURED_KEPT = 20
# … once there are at least this many
MEASURED_MIN_JOBS = 3


def gpu_class_of(*, name: str, kind: str) -> GpuClass | None:
    """The class of a device declared ``name`` of ``kind`` (``"gpu"``/``"cpu"``):
    the first of ``GPU_CLASSES`` whose pattern the upper-cased name holds; None
    for a CPU or a name no class knows."""
    if kind != "gpu":
        return None
    upper = name.upper()
    return next((c for c in GPU_CLASSES if re.search(c.pattern, upper)), None)


def gpu_floor(*, gpu_class: GpuClass, model_id: str) -> float | None:
    """The least tokens/s a device of ``gpu_class`` shows on ``model_id``, or
    None when the catalog has no floors for that model."""
    return FLOORS.get(model_id, {}).get(gpu_class.tier)


def measured_like(*, model_id: str, tokens_per_s: float) -> str:
    """What a measured ``tokens_per_s`` on ``model_id`` is like, in words, for
    the device's page beside what it declared: the fastest tier whose floor it
    meets (``"a top-end GPU (H200, H100, …)"``), else ``"slower than every GPU
    class (a CPU's speed)"``; '' when the catalog has no floors for the model."""
    floors = FLOORS.get(model_id)
    if not floors:
        return ""
    met = [tier for tier in TIERS if tier in floors and tokens_per_s >= floors[tier]]
    if not met:
        return "slower than every GPU class (a CPU's speed)"
    names = [c.name for c in GPU_CLASSES if c.tier == met[0]][:3]
    return f"{TIER_WORDS[met[0]]} ({', '.join(names)}, …)"


TIERS = (TOP, HIGH, MID, ENTRY)
TIER_WORDS = {
    TOP: "a top-end GPU",
    HIGH: "a high-end GPU",
    MID: "a mid-range GPU",
    ENTRY: "an entry-level GPU",
}


@dataclass(frozen=True)
class Verdict:
    """What a device's measurements on one model allow: ``placed`` (its
    declared class is consistent with them), ``gpu_class`` (its declared class,
    or None), ``floor`` (that class's tokens/s on the model, or None),
    ``vram_mb`` (the VRAM it is credited for ``min_vram_gb``: the declared VRAM
    up to its class's, 0 unless placed), ``why`` (a sentence for its page and
    503s when not placed, '' when placed)."""

    placed: bool
    gpu_class: GpuClass | None
    floor: float | None
    vram_mb: int
    why: str


def placement_verdict(
    *,
    name: str,
    kind: str,
    vram_total_mb: int,
    model_id: str,
    tokens_per_s: float | None,
) -> Verdict:
    """Whether a device declared ``name`` (``kind``, ``vram_total_mb`` MiB)
    whose measured speed on ``model_id`` is ``tokens_per_s`` (None: not
    measured yet) is placed by ``placement.gpu`` and ``min_vram_gb``.

    Placed only when the declared name is a known class's, the catalog has
    that class's floor for the model, and the measured speed is at or above it.
    """
    gpu_class = gpu_class_of(name=name, kind=kind)
    if gpu_class is None:
        why = (
            "a CPU is never placed by gpu or VRAM"
            if kind != "gpu"
            else "its declared name is not a GPU class Ballast knows"
        )
        return Verdict(False, None, None, 0, why)
    floor = gpu_floor(gpu_class=gpu_class, model_id=model_id)
    if floor is None:
        why = f"Ballast has no {gpu_class.name} speed floor for {model_id}"
        return Verdict(False, gpu_class, None, 0, why)
    if tokens_per_s is None:
        why = (
            f"not measured yet: placed as {gpu_class.name} once {MEASURED_MIN_JOBS}"
            f" of its jobs of {model_id} measured at least {floor:g} tokens/s"
        )
        return Verdict(False, gpu_class, floor, 0, why)
    if tokens_per_s < floor:
        why = (
            f"measured {tokens_per_s:.0f} tokens/s on {model_id}, below the"
            f" {floor:g} tokens/s of a {gpu_class.name}"
        )
        return Verdict(False, gpu_class, floor, 0, why)
    return Verdict(True, gpu_class, floor, min(vram_total_mb, gpu_class.vram_mb), "")
