"""The chaos run's own PostgreSQL cluster, Redis server and HAProxy load balancer.

Other test runs share the machine's PostgreSQL (5432) and Redis (6379), so the
chaos suite never restarts those: it starts its own on free loopback ports, in a
scratch directory, and restarts them as faults. ``services_missing()`` names what
the machine lacks (the suite is skipped with that reason).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from ballast.stack import ROOT, port_free

PG_BIN = Path(os.environ.get("BALLAST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def services_missing() -> str:
    """Why the chaos suite cannot run here ("" when it can)."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL binaries in {PG_BIN} (set BALLAST_PG_BIN)"
    for tool in ("redis-server", "haproxy"):
        if not shutil.which(tool):
            return f"{tool} is not installed (./dev installs haproxy when run as root)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a postgres user to own the cluster"
    return ""


def _as_postgres(args: list[str]) -> list[str]:
    """``args`` run as the postgres user when we are root (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@dataclass
class Postgres:
    """A PostgreSQL cluster of its own in ``root`` on ``port`` (trust auth, loopback)."""

    root: Path
    port: int = 0

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/ballast"

    def start(self) -> None:
        """initdb (first time), then start and wait until it accepts connections."""
        self.port = self.port or port_free()
        data = self.root / "pgdata"
        if not data.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres", "postgres")
            subprocess.run(
                _as_postgres(
                    [
                        str(PG_BIN / "initdb"),
                        "-U",
                        "postgres",
                        "-A",
                        "trust",
                        "-D",
                        str(data),
                    ]
                ),
                check=True,
                capture_output=True,
            )
        self._ctl("start", "-w", "-l", str(self.root / "postgres.log"))
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            if not conn.execute(
                "SELECT 1 FROM pg_database WHERE datname='ballast'"
            ).fetchone():
                conn.execute("CREATE DATABASE ballast")

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, action: str, *extra: str) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=200"
        subprocess.run(
            _as_postgres(
                [
                    str(PG_BIN / "pg_ctl"),
                    action,
                    "-D",
                    str(self.root / "pgdata"),
                    "-o",
                    options,
                    *extra,
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def restart(self) -> None:
        """A real restart (``pg_ctl restart -m fast``: every connection is cut)."""
        self._ctl("restart", "-w", "-m", "fast", "-l", str(self.root / "postgres.log"))

    def stop(self) -> None:
        try:
            self._ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass


@dataclass
class Redis:
    """A Redis server of its own (no persistence) on ``port``."""

    root: Path
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.port = self.port or port_free()
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - closed with the child
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_port(self.port, "redis")

    def restart(self) -> None:
        """SIGKILL the server and start a new one on the same port (its data gone)."""
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


HAPROXY_CONFIG = ROOT / "deploy" / "haproxy.cfg"
"""The documented example configuration (docs/scaling.md), run as it is: only
its variables are set here."""


@dataclass
class LoadBalancer:
    """HAProxy with ``deploy/haproxy.cfg`` in front of two coordinators
    (``backends``: ``coordinator-a`` and ``coordinator-b`` -> port); passes
    websockets, checks each backend every ``check_inter`` and says which one
    answered in ``X-Ballast-Coordinator``. ``tls_cert``: a PEM file (certificate
    and key) to serve HTTPS with, else plain HTTP."""

    root: Path
    backends: dict[str, int]
    port: int = 0
    tls_cert: Path | None = None
    check_inter: str = "500ms"
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        """The variables ``deploy/haproxy.cfg`` reads."""
        if sorted(self.backends) != ["coordinator-a", "coordinator-b"]:
            raise ValueError("deploy/haproxy.cfg names coordinator-a and coordinator-b")
        env = {
            "BALLAST_LB_BIND": f"127.0.0.1:{self.port}",
            "BALLAST_HOST": "127.0.0.1",
            "BALLAST_CHECK_INTER": self.check_inter,
            "BALLAST_COORDINATOR_A": f"127.0.0.1:{self.backends['coordinator-a']}",
            "BALLAST_COORDINATOR_B": f"127.0.0.1:{self.backends['coordinator-b']}",
        }
        if self.tls_cert:
            env["BALLAST_TLS_CERT"] = str(self.tls_cert)
        return env

    def start(self) -> None:
        self.port = self.port or port_free()
        self.root.mkdir(parents=True, exist_ok=True)
        log = open(self.root / "haproxy.log", "ab")  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("BALLAST_")}
        self.process = subprocess.Popen(
            ["haproxy", "-db", "-f", str(HAPROXY_CONFIG)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**env, **self.environment()},
            start_new_session=True,
        )
        _wait_port(self.port, "haproxy")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=30)


def _wait_port(port: int, what: str, timeout_s: float = 30) -> None:
    """Poll until 127.0.0.1:``port`` accepts a TCP connection (a new process
    offers no event to wait on)."""
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on {port} within {timeout_s} s")
