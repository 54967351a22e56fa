"""One chaos run: the platform started the way the README starts it, load from
several renters, faults on a seeded schedule, then the invariants checked from
the database and the renters' records (``tests.chaos.check``).

Processes (``ballast.stack.Stack``): two coordinators (uvicorn with
``UVICORN_FLAGS``) behind HAProxy, a Celery worker and a separate beat, scripted
agents (``from_prompt``: answers a pure function of the prompt) and one agent
with the real model, on a PostgreSQL cluster and a Redis server of the run's own
(``tests.chaos.services``). Used by ``tests/chaos`` (bounded) and
``bench/chaos.py`` (long).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ballast.stack import Stack, last_line, manage, port_free

from .renters import KINDS, Record, load_run
from .services import LoadBalancer, Postgres, Redis

SCRIPTED_MODEL = "chaos-scripted"  # a catalog model of the run (no tokenizer)
REAL_MODEL = "smollm2-135m-instruct"
FAULTS = (
    "agent_kill",
    "agent_stall",
    "coordinator_kill",
    "postgres_restart",
    "redis_restart",
    "client_disconnect",
)


@dataclass
class ChaosConfig:
    """``requests`` in all (``real_share`` of them to the real model),
    ``concurrency`` in flight, ``agents`` scripted ones (``down_share`` of them
    SIGKILLed at any moment), answers of ``words`` words at ``piece_delay_s``
    per piece, ``seed`` for every choice."""

    requests: int = 100
    concurrency: int = 12
    agents: int = 8
    renters: int = 3
    words: int = 24
    piece_delay_s: float = 0.04
    down_share: float = 0.3
    real_share: float = 0.04
    real_model: bool = True
    seed: int = 26
    log_dir: Path | None = None


@dataclass
class ChaosResult:
    records: list[Record]
    faults: Counter
    report: dict = field(default_factory=dict)  # tests.chaos.check's output


ENV = {
    "BALLAST_HEARTBEAT_INTERVAL_S": "1",
    "BALLAST_CLAIM_TIMEOUT_S": "2",
    "BALLAST_FIRST_TOKEN_TIMEOUT_S": "6",
    "BALLAST_STALL_TIMEOUT_S": "2",
    "BALLAST_QUEUE_TIMEOUT_S": "20",
    "BALLAST_MAX_ATTEMPTS": "5",
    "BALLAST_REAPER_INTERVAL_S": "2",
    "BALLAST_SPOT_CHECKS": "0",
    "BALLAST_CANARY_RATE": "0",
}


class Chaos:
    """Start everything, run the load with faults, settle, check. ``run()``
    returns a ``ChaosResult``; processes and services stop at its end."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.faults: Counter = Counter()
        self.done = 0
        self.events: list[tuple[float, str, str]] = []  # (time, fault, target)
        self.lock = threading.Lock()
        self.down: dict[str, float] = {}  # agent -> since (SIGKILLed)

    # --- set-up --------------------------------------------------------------
    def run(self) -> ChaosResult:
        root = Path(tempfile.mkdtemp(prefix="ballast-chaos-"))
        os.chmod(root, 0o755)  # the postgres user owns its cluster inside
        log_dir = self.config.log_dir or root / "logs"
        self.pg, self.redis = Postgres(root / "pg"), Redis(root / "redis")
        self.pg.start()
        self.redis.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(
            ENV,
            DJANGO_SETTINGS_MODULE="ballast.settings",
            BALLAST_VAR_DIR=str(root / "var"),
            DATABASE_URL=self.pg.url,
            REDIS_URL=self.redis.url,
        )
        ports = {"coordinator-a": port_free(), "coordinator-b": port_free()}
        self.lb = LoadBalancer(root, ports)
        try:
            with Stack(env=env, log_dir=log_dir) as stack:
                self.stack = stack
                return self._run(stack, ports)
        finally:
            self.lb.stop()
            self.redis.stop()
            self.pg.stop()

    def _run(self, stack: Stack, ports: dict[str, int]) -> ChaosResult:
        cfg = self.config
        stack.migrate()
        manage(
            "shell",
            "-c",
            (
                "from catalog.models import CatalogModel; CatalogModel.objects.get_or_create("
                f"id='{SCRIPTED_MODEL}', defaults=dict(family='chaos', context_length=4096,"
                " vram_per_request_mb=1, price_completion_nano=200))"
            ),
            env=stack.env,
        )
        keys = [
            last_line(
                manage(
                    "renter_create",
                    f"chaos-{i}@example.com",
                    "--credit",
                    "50",
                    env=stack.env,
                )
            )
            for i in range(cfg.renters)
        ]
        for name, port in ports.items():
            stack.start_coordinator(
                name if name != "coordinator-a" else "coordinator", port
            )
        self.lb.start()
        self.url = self.lb.url
        stack.spawn(
            "celery-worker",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "ballast",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "1",
                "--pool",
                "solo",
            ],
        )
        stack.spawn(
            "celery-beat",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "ballast",
                "beat",
                "--loglevel",
                "INFO",
            ],
        )
        script = json.dumps(
            {
                "from_prompt": cfg.words,
                "delay_s": cfg.piece_delay_s,
                "models": [SCRIPTED_MODEL],
            }
        )
        self.agent_args = ("--engine", "scripted", "--script", script)
        self.tokens = {
            f"rig-{i}": last_line(
                manage(
                    "machine_create",
                    "chaos-host@example.com",
                    f"rig-{i}",
                    env=stack.env,
                )
            )
            for i in range(cfg.agents)
        }
        for name, token in self.tokens.items():
            stack.start_agent(name, token, *self.agent_args, server=self.url)
        if cfg.real_model:
            token = last_line(
                manage(
                    "machine_create",
                    "chaos-host@example.com",
                    "rig-real",
                    env=stack.env,
                )
            )
            stack.start_agent("rig-real", token, server=self.url)
            stack.wait_for_capacity(keys[0], REAL_MODEL, devices=1, timeout_s=300)
        stack.wait_for_capacity(keys[0], SCRIPTED_MODEL, devices=cfg.agents)
        records = self._records()
        stop = threading.Event()
        faults = threading.Thread(target=self._faults, args=(stop,), daemon=True)
        faults.start()
        try:
            asyncio.run(
                load_run(self.url, keys, records, cfg.concurrency, self._progress)
            )
        finally:
            stop.set()
            faults.join(timeout=120)
        self.faults["client_disconnect"] = sum(
            r.cut == "renter disconnected" for r in records
        )
        self._settle(keys[0])
        return ChaosResult(
            records, self.faults, self._check(records, root=stack.log_dir)
        )

    def _records(self) -> list[Record]:
        cfg, out = self.config, []
        for index in range(cfg.requests):
            real = cfg.real_model and self.rng.random() < cfg.real_share
            kind = self.rng.choice(("http_stream", "http") if real else KINDS)
            out.append(
                Record(
                    index=index,
                    renter=index % cfg.renters,
                    kind=kind,
                    model=REAL_MODEL if real else SCRIPTED_MODEL,
                    prompt=f"chaos {cfg.seed} request {index}",
                    max_tokens=16 if real else 256,
                )
            )
        return out

    def _progress(self) -> None:
        with self.lock:
            self.done += 1

    # --- faults --------------------------------------------------------------
    def _fault(self, kind: str, target: str) -> None:
        self.faults[kind] += 1
        self.events.append((time.time(), kind, target))

    def _faults(self, stop: threading.Event) -> None:
        """The seeded schedule: every ~0.7 s one agent SIGKILLed (up to
        ``down_share`` down at once) and the longest-down one restarted; every
        ~4 s an agent stalled (SIGSTOP past the stall timeout, then SIGCONT);
        at 20 %, 45 % and 70 % of the requests answered, coordinator B
        SIGKILLed (and restarted 3 s later), PostgreSQL restarted, Redis
        restarted."""
        cfg, total = self.config, self.config.requests
        milestones = [
            (0.2, self._coordinator_kill),
            (0.45, self._postgres_restart),
            (0.7, self._redis_restart),
        ]
        max_down = max(1, round(cfg.agents * cfg.down_share))
        next_stall = time.monotonic() + 2
        while not stop.wait(0.35 + self.rng.random() * 0.7):
            if milestones and self.done >= milestones[0][0] * total:
                milestones.pop(0)[1](stop)
            up = [
                n
                for n in self.tokens
                if n not in self.down and n in self.stack.processes
            ]
            if len(self.down) >= max_down or (self.down and self.rng.random() < 0.5):
                name = min(self.down, key=self.down.get)
                del self.down[name]
                self.stack.start_agent(
                    name, self.tokens[name], *self.agent_args, server=self.url
                )
            elif up:
                name = self.rng.choice(up)
                self.stack.kill(name)
                self.down[name] = time.monotonic()
                self._fault("agent_kill", name)
            if time.monotonic() >= next_stall and up:
                next_stall = time.monotonic() + 4
                self._stall(self.rng.choice(up))
        for name in list(self.down):  # everyone back before the system settles
            self.stack.start_agent(
                name, self.tokens[name], *self.agent_args, server=self.url
            )
        self.down.clear()
        for _, fault in milestones:  # a short run still injects every fault
            fault(threading.Event())

    def _stall(self, name: str) -> None:
        process = self.stack.processes.get(name)
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGSTOP)
        self._fault("agent_stall", name)
        threading.Timer(3.0, lambda: _cont(process)).start()

    def _coordinator_kill(self, stop: threading.Event) -> None:
        """SIGKILL coordinator B; restart it 3 s later (HAProxy's check sends
        new connections to A meanwhile; B's machines reconnect through it)."""
        self._fault("coordinator_kill", "coordinator-b")  # the time before the kill
        self.stack.kill("coordinator-b")
        stop.wait(3.0)
        self.stack.start_coordinator("coordinator-b", self.lb.backends["coordinator-b"])

    def _postgres_restart(self, stop: threading.Event) -> None:
        self.pg.restart()
        self._fault("postgres_restart", "postgres")

    def _redis_restart(self, stop: threading.Event) -> None:
        self.redis.restart()
        self._fault("redis_restart", "redis")

    # --- after ---------------------------------------------------------------
    def _settle(self, key: str) -> None:
        """Wait until every agent is back and connected (through the load
        balancer, to whichever coordinator) and no job is open."""
        self.stack.wait_for_capacity(
            key, SCRIPTED_MODEL, devices=self.config.agents, timeout_s=120
        )
        # a job whose coordinator died is closed by the reaper once its lease
        # (BALLAST_LEASE_S) runs out: wait for it, checked from the database
        count = (
            "from jobs.models import Job; from hosts.models import Device; "
            "print(Job.objects.filter(status__in=Job.OPEN_STATUSES).count()"
            " + Device.objects.filter(slots_used__gt=0).count())"
        )
        self.stack.wait_for(
            lambda: last_line(manage("shell", "-c", count, env=self.stack.env)) == "0",
            "no job open and no slot held",
            90,
        )

    def _check(self, records: list[Record], root: Path) -> dict:
        """Run ``tests.chaos.check`` on the run's database (a Django process of
        its own); return its JSON report."""
        path = root / "records.json"
        kill = [t for t, kind, _ in self.events if kind == "coordinator_kill"]
        path.write_text(
            json.dumps(
                {
                    "records": [r.as_dict() for r in records],
                    "words": self.config.words,
                    "scripted_model": SCRIPTED_MODEL,
                    "faults": dict(self.faults),
                    "coordinator_killed_at": kill,
                    "faults_named": FAULTS,
                    "agents": self.config.agents,
                }
            )
        )
        done = subprocess.run(
            [sys.executable, "-m", "tests.chaos.check", str(path)],
            env=self.stack.env,
            cwd=self.stack.root,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if not done.stdout.strip():
            raise RuntimeError(f"the check failed:\n{done.stderr[-4000:]}")
        return json.loads(done.stdout)


def _cont(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
