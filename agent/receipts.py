"""Receipts: the host's Ed25519 signature over what it produced for an attempt.

PROTOCOL.md section 2: a receipt signs the UTF-8 bytes of::

    ballast-receipt/v1\\n{job}\\n{completion_tokens}\\n{sha256 hex of the exact text}

with the key announced in ``hello`` (base64 of the raw 32-byte public key). The
private key lives on disk as an unencrypted PKCS#8 PEM file, created with mode 0600
on first run.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

log = logging.getLogger(__name__)

RECEIPT_PREFIX = "ballast-receipt/v1"


def receipt_message(job: str, completion_tokens: int, text: str) -> bytes:
    """Return the exact bytes a receipt signs.

    ``job`` is the attempt id from the offer, ``completion_tokens`` the token count
    reported in ``done`` (tokens), ``text`` the exact concatenation of the ``token``
    frames this host sent for the job (never including ``continue_from``).
    """
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return f"{RECEIPT_PREFIX}\n{job}\n{int(completion_tokens)}\n{digest}".encode()


def receipt_sign(
    key: Ed25519PrivateKey, job: str, completion_tokens: int, text: str
) -> str:
    """Sign a receipt; return the signature as standard base64 (88 chars)."""
    signature = key.sign(receipt_message(job, completion_tokens, text))
    return base64.b64encode(signature).decode("ascii")


def receipt_verify(
    public_key_b64: str, signature_b64: str, job: str, completion_tokens: int, text: str
) -> bool:
    """Return True when ``signature_b64`` is a valid receipt under the public key.

    ``public_key_b64`` is the base64 raw 32-byte key as sent in ``hello``. Malformed
    base64 or keys count as invalid rather than raising.
    """
    from cryptography.exceptions import InvalidSignature

    try:
        public_key = Ed25519PublicKey.from_public_bytes(
            base64.b64decode(public_key_b64, validate=True)
        )
        public_key.verify(
            base64.b64decode(signature_b64, validate=True),
            receipt_message(job, completion_tokens, text),
        )
    except (InvalidSignature, ValueError):
        return False
    return True


def public_key_b64(key: Ed25519PrivateKey) -> str:
    """Return the raw 32-byte public key of ``key`` as base64 (the ``hello`` form)."""
    raw = key.public_key().public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )
    return base64.b64encode(raw).decode("ascii")


def key_path_default(server_url: str) -> Path:
    """Default key file for a coordinator: ``~/.config/ballast-agent/<host>-key.pem``.

    ``<host>`` is the host name of ``server_url`` (``127.0.0.1`` for
    ``http://127.0.0.1:8000``), so one machine keeps one key per coordinator.
    """
    host = urlsplit(server_url).hostname or "default"
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "ballast-agent" / f"{host}-key.pem"


def key_load_or_create(path: Path) -> Ed25519PrivateKey:
    """Load the Ed25519 private key at ``path``, creating it (mode 0600) if missing.

    The parent folder is created with mode 0700 when missing. A key file readable by
    group or others is used but logged as a warning.

    Raises ``ValueError`` when the file exists but is not an Ed25519 PEM key, and
    ``OSError`` when it cannot be read or written.
    """
    path = Path(path).expanduser()
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("key file %s has mode %o; it should be 0600", path, mode)
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 private key")
        return key
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    log.info("created a new receipt key at %s", path)
    return key


def challenge_sign(key: Ed25519PrivateKey, nonce: str) -> str:
    """The ``hello``'s ``proof``: base64 signature of
    ``ballast-hello/v1\\n{nonce}\\n{public key, base64}`` (the coordinator's
    ``challenge`` nonce), proving this agent holds the key it announces."""
    message = f"ballast-hello/v1\n{nonce}\n{public_key_b64(key)}".encode()
    return base64.b64encode(key.sign(message)).decode("ascii")
