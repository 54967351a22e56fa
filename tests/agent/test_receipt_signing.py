"""Receipts: PROTOCOL.md section 2, checked against tests/vectors/receipt.json."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.receipts import (
    key_load_or_create,
    key_path_default,
    public_key_b64,
    receipt_message,
    receipt_sign,
    receipt_verify,
)
from tests.vectors import vectors as vectors_load

pytestmark = []


@pytest.fixture(scope="module")
def vectors() -> dict:
    return vectors_load("receipt")


def test_it_reproduces_every_receipt_vector(vectors: dict) -> None:
    """Message bytes, public key and signature match every worked case exactly."""
    key = Ed25519PrivateKey.from_private_bytes(
        bytes.fromhex(vectors["private_key_seed_hex"])
    )
    assert public_key_b64(key) == vectors["public_key_b64"]
    assert vectors["cases"]
    for case in vectors["cases"]:
        message = receipt_message(case["job"], case["completion_tokens"], case["text"])
        assert message == case["message"].encode("utf-8")
        signature = receipt_sign(
            key, case["job"], case["completion_tokens"], case["text"]
        )
        assert signature == case["signature"]
        assert receipt_verify(
            vectors["public_key_b64"],
            signature,
            case["job"],
            case["completion_tokens"],
            case["text"],
        )


def test_it_rejects_a_receipt_over_other_text_or_count(vectors: dict) -> None:
    case = vectors["cases"][0]
    public = vectors["public_key_b64"]
    assert not receipt_verify(
        public,
        case["signature"],
        case["job"],
        case["completion_tokens"],
        case["text"] + " ",
    )
    assert not receipt_verify(
        public,
        case["signature"],
        case["job"],
        case["completion_tokens"] + 1,
        case["text"],
    )
    assert not receipt_verify(
        public, "not base64!", case["job"], case["completion_tokens"], case["text"]
    )


def test_it_creates_the_key_file_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "config" / "ballast-agent" / "127.0.0.1-key.pem"
    key = key_load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = key_load_or_create(path)
    assert public_key_b64(again) == public_key_b64(key)
    assert len(base64.b64decode(public_key_b64(key))) == 32


def test_it_refuses_a_key_file_that_is_not_ed25519(tmp_path: Path) -> None:
    path = tmp_path / "bad.pem"
    path.write_text("not a key")
    with pytest.raises(ValueError):
        key_load_or_create(path)


def test_it_names_the_default_key_after_the_server_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert key_path_default("https://coord.example.com:8443") == (
        tmp_path / "ballast-agent" / "coord.example.com-key.pem"
    )
