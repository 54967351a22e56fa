"""``GET /healthz``, the load balancer's health check (deploy/haproxy.cfg)."""

from __future__ import annotations


def test_it_answers_ok_without_the_database(client) -> None:
    """No database access is allowed here (no ``django_db`` mark): a PostgreSQL
    outage must not mark every coordinator process down at once."""
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.content == b"ok"
    assert response["Content-Type"].startswith("text/plain")
