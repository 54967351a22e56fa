"""docs/scaling.md's example, run: HAProxy (Debian's package) with the very file
``deploy/haproxy.cfg``, TLS on, in front of two coordinator processes sharing
PostgreSQL and Redis. Hosts' agents connect through it (wss), renters' requests
are answered through it (https) whichever process holds the host's websocket,
and a killed process is taken out by the health check while the other serves.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
from pathlib import Path

import httpx
import pytest

from ballast.stack import port_free
from tests.chaos.services import LoadBalancer

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.e2e


def _needs() -> str:
    if not shutil.which("haproxy"):
        return "haproxy is not installed (./dev installs it when run as root)"
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        return "several coordinator processes need PostgreSQL (DATABASE_URL)"
    if not os.environ.get("REDIS_URL"):
        return "several coordinator processes need Redis (REDIS_URL): the channel layer"
    return ""


def self_signed(path: Path) -> Path:
    """A certificate for 127.0.0.1 and its key, in one PEM file (HAProxy's ``crt``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def test_two_coordinators_behind_the_documented_haproxy(
    stack, renter_key, machine, tmp_path
):
    missing = _needs()
    if missing:
        pytest.skip(missing)
    cert = self_signed(tmp_path / "lb.pem")
    ports = {"coordinator-a": stack.port, "coordinator-b": port_free()}
    stack.start_coordinator("coordinator-b", ports["coordinator-b"])
    lb = LoadBalancer(tmp_path / "lb", ports, tls_cert=cert)
    lb.start()
    try:
        stack.env["SSL_CERT_FILE"] = str(cert)  # the agents trust the certificate
        for name in ("rig-a", "rig-b"):
            stack.start_agent(
                name,
                machine(name),
                "--engine",
                "scripted",
                "--script",
                '{"text": "Through the load balancer."}',
                server=lb.url,
            )
        stack.wait_for_capacity(renter_key, MODEL, devices=2)
        tls = ssl.create_default_context(cafile=str(cert))
        with httpx.Client(base_url=lb.url, verify=tls, timeout=30) as client:

            def ask() -> str:
                response = client.post(
                    "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {renter_key}"},
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": "Hi"}],
                        "max_tokens": 16,
                    },
                )
                assert response.status_code == 200, response.text
                answer = response.json()["choices"][0]["message"]["content"]
                assert answer == "Through the load balancer."
                return response.headers["x-ballast-coordinator"]

            # the two hosts' websockets are spread one per process (leastconn),
            # so requests land on both; each is relayed from whichever holds
            # the host that answers it (through Redis)
            answered_by = {ask() for _ in range(6)}
            assert answered_by == {"coordinator-a", "coordinator-b"}
            assert client.get("/healthz").text == "ok"

            stack.kill("coordinator-b")
            # its host reconnects through HAProxy, which sends it (and every
            # request) to coordinator-a once the check finds b down
            stack.wait_for_capacity(renter_key, MODEL, devices=2)
            assert {ask() for _ in range(4)} == {"coordinator-a"}
    finally:
        lb.stop()
