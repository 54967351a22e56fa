"""Which catalog models can be spot-checked: told to hosts by the layer that
keeps the checks (issue 31 item 4).

The pools of checks live in ``trust`` (above ``hosts`` in the layers contract),
so ``trust`` registers the rule here when Django starts
(``trust.checkpools.models_checked``, through ``TrustConfig.ready``); the
machine page asks it which of a device's models have no calibrated check.
Nothing registered, no model counts as checked (a device is then shown
unchecked, never silently taken for checked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

ModelsChecked = Callable[[Iterable[str]], set[str]]
"""Given model ids, the set of those that have calibrated spot checks."""

_rule: list[ModelsChecked] = []


def models_checked_register(rule: ModelsChecked) -> None:
    """Make ``rule`` the one that says which models have calibrated checks
    (replacing any)."""
    _rule[:] = [rule]


def models_unchecked(model_ids: Iterable[str]) -> list[str]:
    """Of ``model_ids``, those with no calibrated spot check (sorted): the
    registered rule's complement; every one of them when none is registered."""
    ids = sorted(set(model_ids))
    if not ids:
        return []
    checked = _rule[0](ids) if _rule else set()
    return [model_id for model_id in ids if model_id not in checked]
