"""Receipts: a host's Ed25519 signature over what it produced (PROTOCOL.md §2).

The signed message is the UTF-8 bytes of
``ballast-receipt/v1\\n{job}\\n{completion_tokens}\\n{sha256 hex of the exact text}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def receipt_message(job: str, completion_tokens: int, text: str) -> bytes:
    """Return the bytes a receipt signs for attempt ``job``'s ``text``."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return f"ballast-receipt/v1\n{job}\n{completion_tokens}\n{digest}".encode()


def receipt_verify(
    *,
    public_key_b64: str,
    signature_b64: str,
    job: str,
    completion_tokens: int,
    text: str,
) -> bool:
    """True when ``signature_b64`` is the host's valid signature over this segment.

    Any malformed key or signature gives False (never raises).
    """
    try:
        key = Ed25519PublicKey.from_public_bytes(
            base64.b64decode(public_key_b64, validate=True)
        )
        signature = base64.b64decode(signature_b64, validate=True)
        key.verify(signature, receipt_message(job, completion_tokens, text))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


def challenge_message(nonce: str, public_key_b64: str) -> bytes:
    """The bytes a ``hello``'s ``proof`` signs: ``ballast-hello/v1\\n{nonce}\\n
    {public_key}`` (the connection's ``challenge`` nonce and the key announced;
    its own prefix, so no proof can pass for a receipt)."""
    return f"ballast-hello/v1\n{nonce}\n{public_key_b64}".encode()


def challenge_verify(*, public_key_b64: str, proof_b64: str, nonce: str) -> bool:
    """True when ``proof_b64`` is the signature of ``challenge_message`` by the
    key ``public_key_b64`` (base64, raw 32 bytes). Never raises."""
    try:
        key = Ed25519PublicKey.from_public_bytes(
            base64.b64decode(public_key_b64, validate=True)
        )
        key.verify(
            base64.b64decode(proof_b64, validate=True),
            challenge_message(nonce, public_key_b64),
        )
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True
