"""Start Ballast's processes: the ASGI coordinator, Celery (worker + beat), agents.

Used by the demo (``python -m ballast.demo``) and by the end-to-end tests, so the
tests start the platform exactly the way the README does. Every process is a
child of the ``Stack`` and is stopped with it; logs go to files under ``log_dir``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent

# How a coordinator's ASGI server runs (after ``--host``/``--port``). No
# per-message deflate on the websockets: a host's frames are a token each, and
# inflating them cost the event loop more than anything else per frame (~58 µs a
# frame in a profile, docs/performance.md); the agent then skips deflating too.
UVICORN_FLAGS = (
    "--no-access-log",
    "--ws",
    "websockets",
    "--ws-per-message-deflate",
    "false",
    "--lifespan",
    "off",
)


def port_free() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(*args: str, env: dict[str, str], root: Path = ROOT) -> str:
    """Run ``manage.py`` with ``args`` (of the checkout at ``root``); return its
    stdout. Raises CalledProcessError."""
    done = subprocess.run(
        [sys.executable, str(root / "manage.py"), *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(
            done.returncode, done.args, done.stdout, done.stderr
        )
    return done.stdout


def last_line(text: str) -> str:
    """The last non-empty line of a command's output (tokens and keys are printed there)."""
    return [line for line in text.splitlines() if line.strip()][-1].strip()


@dataclass
class Stack:
    """A set of Ballast processes sharing one environment (database, Redis, settings).

    ``env`` is the environment of every child; ``log_dir`` receives one log file per
    process. Use as a context manager: leaving it stops every child. ``root``: the
    checkout whose code the children run (this one by default; the benchmarks
    compare another commit's in the same run).
    """

    env: dict[str, str]
    log_dir: Path
    port: int = 0
    root: Path = ROOT
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __post_init__(self) -> None:
        # the demo's and the tests' processes run in development mode
        # (ballast/settings/base.py) unless the environment says otherwise
        self.env = {"BALLAST_DEV": "1", **self.env}

    def __enter__(self) -> Stack:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    def spawn(
        self,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen:
        """Start a child process ``name`` (its own process group), logging to a
        file; ``env``: variables added to the stack's environment for it alone;
        ``cwd``: where it runs (the checkout by default)."""
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the child
        process = subprocess.Popen(
            args,
            cwd=cwd or self.root,
            env={**self.env, **env} if env else self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = process
        return process

    def migrate(self) -> None:
        """Apply migrations (this also loads the catalog's reference model)."""
        manage("migrate", "--noinput", "-v0", env=self.env, root=self.root)

    def start_coordinator(self, name: str = "coordinator", port: int = 0) -> str:
        """Start an ASGI server process (uvicorn) and wait until it answers HTTP.

        The first one started sets ``url``; more (``name``/``port``) share the same
        database and Redis, like processes behind a load balancer. Returns its URL.
        """
        if name == "coordinator":
            self.port = port = self.port or port or port_free()
        port = port or port_free()
        url = f"http://127.0.0.1:{port}"
        self.spawn(
            name,
            [
                sys.executable,
                "-m",
                "uvicorn",
                "ballast.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *UVICORN_FLAGS,
            ],
        )
        self.wait_for(
            lambda: httpx.get(url + "/", timeout=1).status_code == 200, name, 60
        )
        return url

    def start_celery(self) -> None:
        """Start one Celery worker with beat embedded (``worker -B``)."""
        self.spawn(
            "celery",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "ballast",
                "worker",
                "-B",
                "--loglevel",
                "INFO",
                "--concurrency",
                "1",
                "--pool",
                "solo",
            ],
        )

    def start_agent(
        self, name: str, token: str, *extra: str, server: str = ""
    ) -> subprocess.Popen:
        """Start ``python -m agent run`` for a machine token (real llama.cpp by
        default). The token goes in the agent's environment
        (``BALLAST_MACHINE_TOKEN``), not its command line, which any local user
        can read (``ps``)."""
        return self.spawn(
            name,
            [
                sys.executable,
                "-m",
                "agent",
                "run",
                "--server",
                server or self.url,
                "--key-file",
                str(self.log_dir / f"{name}-key.pem"),
                *extra,
            ],
            env={"BALLAST_MACHINE_TOKEN": token},
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a child's process group and reap it."""
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    def stop_all(self) -> None:
        """Stop every child: SIGTERM, then SIGKILL after 10 s."""
        for name in list(self.processes):
            process = self.processes[name]
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for name, process in list(self.processes.items()):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            self.processes.pop(name, None)

    def wait_for(self, check, what: str, timeout_s: float) -> None:
        """Poll ``check()`` until true, up to ``timeout_s``; raise with the logs if not.

        Startup of separate processes has no event to wait on, so this polls
        (every 0.2 s); a child that exits early fails at once.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {process.returncode}:\n{self.log_tail(name)}"
                    )
            try:
                if check():
                    return
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.2)
        logs = "\n".join(f"--- {n}\n{self.log_tail(n)}" for n in self.processes)
        raise TimeoutError(f"{what} not ready within {timeout_s} s\n{logs}")

    def wait_for_capacity(
        self, api_key: str, model: str, devices: int = 1, timeout_s: float = 120
    ) -> None:
        """Wait until ``/v1/models`` shows ``devices`` live devices with the model loaded."""

        def ready() -> bool:
            answer = httpx.get(
                self.url + "/v1/models",
                headers={"Authorization": f"Bearer {api_key}"},
                timeout=2,
            ).json()
            return any(
                m["id"] == model and m["capacity"]["devices_online"] >= devices
                for m in answer["data"]
            )

        self.wait_for(ready, f"{devices} device(s) with {model}", timeout_s)

    def log_tail(self, name: str, lines: int = 40) -> str:
        """The last lines of a child's log."""
        path = self.log_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
