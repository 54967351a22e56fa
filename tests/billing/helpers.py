"""Drive jobs through the services (no websockets) with hosts that sign real receipts.

``Rig`` registers machines with ``machine_create`` + ``machine_hello`` +
``machine_heartbeat``, creates jobs and plays their attempts through
``job_dispatch`` / ``attempt_claim`` / ``attempt_end`` /
``job_finish``, the same calls the orchestration makes.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.db.models import Sum
from django.utils import timezone

from billing.models import Account, Entry
from billing.receipts import receipt_message
from billing.services import charge_plan, segment_of
from catalog.models import CatalogModel
from hosts.models import Device, Machine
from hosts.services import machine_create, machine_heartbeat, machine_hello
from jobs.models import Attempt, Job
from jobs.services import (
    attempt_claim,
    attempt_end,
    job_create,
    job_dispatch,
    job_finish,
)
from jobs.services.endings import job_price_nano

# A catalog model without a tokenizer: the host's count is believed up to the
# number of characters. 333 nano-USD per token makes the 80 % share fractional.
UNTOKENIZED = {
    "id": "test-13b",
    "family": "test",
    "context_length": 4096,
    "vram_per_request_mb": 100,
    "price_prompt_nano": 50,
    "price_completion_nano": 333,
}


def untokenized_model() -> CatalogModel:
    model, _ = CatalogModel.objects.update_or_create(
        id=UNTOKENIZED["id"], defaults=UNTOKENIZED
    )
    return model


@dataclass
class Host:
    """A machine with one device and its Ed25519 key."""

    machine: Machine
    device: Device
    key: Ed25519PrivateKey

    def sign(self, attempt_id: str, tokens: int, text: str) -> str:
        """A receipt over ``text`` for attempt ``attempt_id`` (PROTOCOL.md §2)."""
        return base64.b64encode(
            self.key.sign(receipt_message(attempt_id, tokens, text))
        ).decode()


@dataclass
class Rig:
    """Hosts online for ``models`` and a clock; plays jobs through the services."""

    models: list[str]
    now: datetime = field(default_factory=timezone.now)
    hosts: dict[str, Host] = field(default_factory=dict)  # by machine id

    def host_add(
        self, name: str, *, owner_email: str | None = None, slots: int = 4
    ) -> Host:
        machine, _ = machine_create(
            owner_email=owner_email or f"{name}@hosts.example", name=name
        )
        key = Ed25519PrivateKey.generate()
        public = base64.b64encode(
            key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        ).decode()
        machine_hello(
            machine_id=str(machine.id),
            channel_name=f"test.{name}",
            hello={
                "agent_version": "test",
                "engine_name": "scripted",
                "engine_version": "1",
                "public_key": public,
                "accepts_serverless": True,
                "devices": [{"index": 0, "name": "Test GPU", "vram_total_mb": 24576}],
            },
            now=self.now,
        )
        host = Host(
            machine=machine, device=Device.objects.get(machine=machine), key=key
        )
        self.hosts[str(machine.id)] = host
        self._heartbeat(host, slots)
        return host

    def _heartbeat(self, host: Host, slots: int = 4) -> None:
        machine_heartbeat(
            machine_id=str(host.machine.id),
            heartbeat={
                "paused": False,
                "devices": [
                    {
                        "index": 0,
                        "temp_c": 50.0,
                        "vram_free_mb": 8000,
                        "loaded_models": list(self.models),
                        "slots": slots,
                    }
                ],
            },
            now=self.now,
        )

    def advance(self, **delta) -> None:
        """Move the clock on and refresh every host's heartbeat at the new time."""
        self.now += timedelta(**delta)
        for host in self.hosts.values():
            self._heartbeat(host)

    def job(
        self,
        *,
        renter,
        model: str,
        spot_check: bool = False,
        max_tokens: int = 64,
        temperature: float | None = None,
    ) -> Job:
        return job_create(
            renter=None if spot_check else renter,
            api_key=None,
            model=CatalogModel.objects.get(id=model),
            endpoint=Job.Endpoint.CHAT,
            messages=[{"role": "user", "content": "Say something"}],
            prompt=None,
            params={"max_tokens": max_tokens}
            | ({} if temperature is None else {"temperature": temperature}),
            placement={},
            stream=True,
            is_spot_check=spot_check,
        )

    def attempt(
        self, job: Job, *, continue_from: str = "", device: Device | None = None
    ) -> tuple[Attempt, Host]:
        """Dispatch and claim the next attempt; ``device`` pins it (others are paused)."""
        if device is not None:
            Device.objects.exclude(id=device.id).update(paused=True)
        try:
            dispatch = job_dispatch(job=job, continue_from=continue_from, now=self.now)
        finally:
            if device is not None:
                Device.objects.exclude(id=device.id).update(paused=False)
        assert dispatch.attempt is not None, dispatch
        host = self.hosts[str(dispatch.attempt.device.machine_id)]
        assert attempt_claim(
            attempt_id=str(dispatch.attempt.id),
            machine_id=str(host.machine.id),
            now=self.now,
        )
        return dispatch.attempt, host

    def segment(
        self,
        job: Job,
        *,
        text: str,
        outcome: str = Attempt.Outcome.SUCCEEDED,
        tokens: int | None = None,
        receipt: str | None = "valid",
        continue_from: str = "",
        device: Device | None = None,
    ) -> Attempt:
        """Play one attempt that delivers ``text`` and ends with ``outcome``.

        A succeeded attempt sends a ``done`` reporting ``tokens`` with ``receipt``:
        ``"valid"``, ``"missing"``, ``"bad"`` (not a signature), ``"other_text"``
        (signed over different text: a hash mismatch), or a literal signature.
        Other outcomes send no ``done``.
        """
        attempt, host = self.attempt(job, continue_from=continue_from, device=device)
        done = None
        if outcome == Attempt.Outcome.SUCCEEDED:
            done = {
                "finish_reason": "stop",
                "prompt_tokens": 10,
                "completion_tokens": tokens,
                "receipt": self.receipt_for(host, attempt, tokens, text, receipt),
            }
        ended = attempt_end(
            attempt_id=str(attempt.id),
            outcome=outcome,
            output_text=text,
            done=done,
            # real time: offered_at is real time too
            first_token_at=timezone.now() if text else None,
            now=self.now,
        )
        assert ended is not None
        return ended

    @staticmethod
    def receipt_for(
        host: Host, attempt: Attempt, tokens: int, text: str, receipt: str | None
    ) -> str:
        if receipt == "valid":
            return host.sign(str(attempt.id), tokens, text)
        if receipt in ("missing", None):
            return ""
        if receipt == "bad":
            return base64.b64encode(b"\x00" * 64).decode()
        if receipt == "other_text":
            return host.sign(str(attempt.id), tokens, text + "!")
        return receipt

    def finish(self, job: Job, *, status: str = Job.Status.SUCCEEDED) -> Job:
        text = "".join(a.output_text for a in job.attempts.order_by("offered_at", "id"))
        return job_finish(
            job_id=str(job.id), status=status, output_text=text, now=self.now
        )


def charge_of(job: Job, *, now=None) -> dict:
    """``charge_post``'s arguments for the ended ``job``: its segments (offer
    order) planned at its price, as the job's end builds them."""
    segments = [
        segment_of(attempt)
        for attempt in job.attempts.select_related(
            "device__machine", "receipt_check"
        ).order_by("offered_at", "id")
    ]
    plan = charge_plan(
        segments=segments,
        max_tokens=job.params.get("max_tokens"),
        price=job_price_nano(job),
    )
    return dict(
        job_id=job.id,
        renter=job.renter,
        model_id=job.model_id,
        plan=plan,
        now=now or timezone.now(),
    )


def balance(kind: str, user=None) -> int:
    """Sum of entries of accounts of ``kind`` (of ``user`` when given), nano-USD."""
    entries = Entry.objects.filter(account__kind=kind)
    if user is not None:
        entries = entries.filter(account__user=user)
    return entries.aggregate(total=Sum("amount_nano"))["total"] or 0


PLATFORM = Account.Kind.PLATFORM
