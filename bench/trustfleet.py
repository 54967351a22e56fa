"""The fleet of ``bench/trust.py``: scripted hosts, honest and cheating, served a
week of traffic through the coordinator's own trust code.

Each simulated job goes through the functions production runs, in-process on a
scratch database: the spot-check draw at ``BALLAST_CANARY_RATE`` per dispatched
job (as ``jobs.services.dispatch.device_claim`` marks one due), the canary's
verdict (``trust.canaries.answer_right``, ``jobs.tokens.token_count_inflated``),
the job's outcome (``hosts.services.device_outcome_record``), the count check
(``token_count_inflated`` → ``trust.failures.device_check_failed``), the
verification draw (``trust.verification.rate.verification_rate``) and its verdict
(``trust.verification.plausibility.answer_plausible`` over scores the real model
computed by prefill, two verifiers) with its consequences, quarantine
(``hosts.services.scores``). What is scripted is the hosts: what each one answers
is drawn from a bank of answers the real model wrote (``bench.trustbank``).

A cheat is defined by what its host does, never by what catches it:

- ``canary_aware`` (a): answers honestly what the repository's canary generator
  could have written (it recognises every spot check: the worst case), junk
  otherwise;
- ``hot`` (b): the model's answer at a temperature 1.0 above the one asked;
- ``other_model`` (c): the reference model with Gaussian noise on its logits;
- ``inflate`` (d): honest text, its token ids split finer than drawn so the
  count is 15 % high (spot checks: the count alone, 15 % high);
- ``refuser`` (e): answers spot checks (it recognises them), refuses real work;
- ``sleeper`` (f): honest for its first 500 jobs, then as ``other_model``;
- ``sybil`` (g): as ``canary_aware``, with three verifier accounts of its own
  (other owners, ``sybil_account`` devices: honest hosts and verifiers
  everywhere except that they call its answers plausible);
- ``fffd`` (h): as ``canary_aware``, each answer with a U+FFFD planted after
  its first word, and token ids that spell it as a character cut by the
  model (a lone UTF-8 lead byte's token: the best the host can fake);
- ``inflate_hidden`` (i): as ``inflate``, only where the count check cannot
  expect the tokenizer's own split (``jobs.tokens.canonical_split_expected``:
  a sampled or a constrained job), honest elsewhere;
- ``requantized`` (j, SmolLM2 only): declares the Q4_1 file's digest and runs
  the same model requantized to Q4_0 (the bank's ``q4_0`` answers), for every
  job and spot check.

A ``CONSTRAINED_SHARE`` of real jobs asks for a ``response_format``; the bank
answers those of ``honest`` and ``inflate`` under it, the other behaviours'
as plain text.

Honest hosts fail 0.5 % of their jobs (an engine error), as real ones do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from bench.compat import pinned_weights_declare

CHEATS = (
    "canary_aware", "hot", "other_model", "inflate", "refuser", "sleeper", "sybil", "fffd",
    "inflate_hidden", "requantized",
)
SYBIL_ACCOUNTS = 3
SLEEPER_HONEST_JOBS = 500
HONEST_ERROR_RATE = 0.005
TEMPERATURES = ((0.0, 0.3), (0.7, 0.5), (1.0, 0.2))
"""Real traffic's temperatures and their shares."""
CONSTRAINED_SHARE = 0.2
"""Real traffic's share asked under a ``response_format`` (json_schema)."""


@dataclass
class SimDevice:
    """One scripted host's device: ``kind`` 'honest' or a cheat; counters."""

    id: int
    kind: str
    jobs: int = 0  # real jobs served
    cheating_from: int | None = None  # its job count when it began to cheat
    caught_after: int | None = None  # its jobs (since it began to cheat) at quarantine
    quarantined: bool = False

    def cheating(self) -> bool:
        if self.kind in ("honest", "sybil_account"):
            return False
        if self.kind == "sleeper":
            return self.jobs >= SLEEPER_HONEST_JOBS
        return True

    def behaviour(self, *, temperature: float = 0.0, constrained: bool = False) -> str:
        """What the host does for a real job now (at ``temperature``, under a
        ``response_format`` when ``constrained``): honest, hot, other, junk,
        inflate, fffd or refuse."""
        if not self.cheating():
            return "honest"
        if self.kind == "inflate_hidden":
            from jobs.tokens import canonical_split_expected  # (Django set up by then)

            canonical = canonical_split_expected(constrained=constrained, temperature=temperature)
            return "honest" if canonical else "inflate"
        return {
            "canary_aware": "junk",
            "hot": "hot",
            "other_model": "other",
            "inflate": "inflate",
            "refuser": "refuse",
            "sleeper": "other",
            "sybil": "junk",
            "fffd": "fffd",
            "requantized": "q4_0",
        }[self.kind]

    def canary_behaviour(self) -> str:
        """What the host does for a spot check (the cheats that recognise them
        answer honestly)."""
        if self.kind in ("canary_aware", "refuser", "sybil", "fffd", "inflate_hidden") or (
            not self.cheating()
        ):
            return "honest"
        return self.behaviour()


@dataclass
class Costs:
    """The fleet's work: real jobs and their tokens; spot checks and theirs
    (generated); verifications and their tokens (prefilled); checks of
    verifiers (prefilled, counted at the size of the verification that planned
    them)."""

    jobs: int = 0
    job_tokens: int = 0
    checks: int = 0
    check_tokens: int = 0
    verifications: int = 0
    verified_tokens: int = 0
    verifier_checks: int = 0
    verifier_check_tokens: int = 0


def fleet_make(*, model_id: str, kinds: list[str], tag: str) -> list[SimDevice]:
    """One machine (of its own owner) per device, online for the last day and
    the week ahead, the model loaded, ``verifies`` declared."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from hosts.models import Device, DeviceModel, Machine, OnlineSpan

    now = timezone.now()
    users = get_user_model()
    devices = []
    for i, kind in enumerate(kinds):
        owner = users.objects.create(username=f"{tag}-{i}@bench", email=f"{tag}-{i}@bench")
        machine = Machine.objects.create(
            owner=owner,
            name=f"{tag}-{i}",
            token_hash=f"{tag}-{i}",
            connected=True,
            last_heartbeat_at=now + timedelta(days=8),
            verifies=True,
        )
        OnlineSpan.objects.create(
            machine=machine, started_at=now - timedelta(days=1), ended_at=now
        )
        device = Device.objects.create(
            machine=machine, index=0, name="Sim GPU", slots_total=1, vram_total_mb=24576
        )
        Device.objects.filter(id=device.id).update(first_seen_at=now - timedelta(days=1))
        DeviceModel.objects.create(device=device, model_id=model_id, loaded=True)
        devices.append(SimDevice(id=device.id, kind=kind))
    pinned_weights_declare()  # the file its catalog entry pins
    return devices


def temperature_draw(rng: random.Random) -> float:
    values, weights = zip(*TEMPERATURES)
    return rng.choices(values, weights)[0]
