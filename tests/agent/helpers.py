"""Helpers of the agent's tests (no Django: the agent imports nothing from the
coordinator)."""

from __future__ import annotations

from typing import Any

from agent.receipts import receipt_verify


def assert_receipt(
    hello: dict[str, Any], job: str, done: dict[str, Any], text: str
) -> None:
    assert receipt_verify(
        hello["public_key"],
        done["receipt"],
        job,
        done["usage"]["completion_tokens"],
        text,
    ), "the receipt does not verify over the exact text sent"
