"""One fleet of ``bench/trust.py`` served through the coordinator's trust code.

Per real job (``Fleet.job_serve``): the job stored as a renter's
(``jobs.services.job_create``) and its one attempt ended as the host's answer
ends it; the device's outcome (``hosts.services.device_outcome_record``); the
count checked (``jobs.tokens.token_count_inflated`` → a failed check,
``trust.failures.device_check_failed``); the verification drawn at the
device's rate (``trust.verification.records.verification_choose``) and, when one
is offered, scored by the verifiers with the bank's real scores and a signed
receipt (``verification_scored``; rounds until two verdicts agree,
``trust.verification.verdicts``).
Per dispatched job, the spot-check draw at ``BALLAST_CANARY_RATE`` (as
``jobs.services.dispatch`` marks one due); a check's verdict is the two tests
``trust.spotchecks.spot_check_verdict`` makes (``answer_right``, the count), its
consequences those of ``spot_check_judge`` (a pass recorded and the quarantine
release judged; a failure ``device_check_failed``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench.trustbank import INFLATE, MAX_TOKENS
from bench.trustfleet import (
    CHEATS, CONSTRAINED_SHARE, HONEST_ERROR_RATE, SYBIL_ACCOUNTS, Costs, SimDevice, fleet_make,
    temperature_draw,
)


@dataclass
class Fleet:
    bank: dict
    rng: random.Random
    devices: list[SimDevice]
    keys: dict = field(default_factory=dict)  # device id -> (machine id, signing key)
    costs: Costs = field(default_factory=Costs)
    honest_quarantined: int = 0
    sybils: dict = field(default_factory=dict)  # sybil account device id -> its cheat's

    @classmethod
    def make(
        cls, *, bank: dict, rng: random.Random, tag: str, honest: int, cheats=CHEATS
    ) -> Fleet:
        """A fleet of the bank's model: ``cheats`` (one device each),
        ``honest`` devices; the model's verification calibrated first when it
        is not (``calibrate``)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        from agent.receipts import public_key_b64
        from catalog.models import CatalogModel
        from bench.trustmodels import SMOLLM2
        from hosts.models import Device, Machine

        model = CatalogModel.objects.get(id=bank.get("model", SMOLLM2))
        Machine.objects.update(connected=False)  # the last fleet's verify no more
        sybils = SYBIL_ACCOUNTS if "sybil" in cheats else 0
        kinds = list(cheats) + ["honest"] * honest + ["sybil_account"] * sybils
        devices = fleet_make(model_id=model.id, kinds=kinds, tag=tag)
        fleet = cls(bank=bank, rng=rng, devices=devices)
        sybil = next((d.id for d in devices if d.kind == "sybil"), None)
        fleet.sybils = {d.id: sybil for d in devices if d.kind == "sybil_account"}
        fleet.model = model
        fleet.renter = _renter(tag)
        for dev in devices:
            key = Ed25519PrivateKey.generate()
            machine_id = Device.objects.get(id=dev.id).machine_id
            Machine.objects.filter(id=machine_id).update(public_key=public_key_b64(key))
            fleet.keys[dev.id] = (str(machine_id), key)
        fleet._by_behaviour = _index(bank["traffic"])
        # a day online: each verifier passed its first checks (one every
        # BALLAST_VERIFIER_CHECK_NEW_EVERY_S) long ago, so it is trusted
        from django.conf import settings

        Device.objects.filter(id__in=[d.id for d in devices]).update(
            verifier_passes=settings.BALLAST_VERIFIER_TRUST_PASSES
        )
        fleet.calibration_jobs = fleet.calibrate()
        fleet.costs = Costs()  # (the calibration's jobs are no part of the measure)
        return fleet

    def calibrate(self, most: int = 5000) -> int:
        """Until the model's verification is calibrated
        (``trust.verification.calibration``), staff mark the honest devices
        reference devices (trusted) and they serve honest jobs, their drawn
        answers scored as samples by each other; unmarked after. Returns the
        jobs it took (0: calibrated already, as SmolLM2 is by its migration).
        Raises ``RuntimeError`` past ``most`` jobs."""
        from hosts.models import Device
        from trust.verification.calibration import thresholds_of

        if thresholds_of(self.model.id) is not None:
            return 0
        honest = [d for d in self.devices if d.kind == "honest"]
        ids = [d.id for d in honest]
        Device.objects.filter(id__in=ids).update(reference=True)
        jobs = 0
        while thresholds_of(self.model.id) is None:
            if jobs >= most:
                raise RuntimeError(f"{self.model.id} not calibrated after {most} jobs")
            dev = self.rng.choice(honest)
            self._answered(dev, "honest", temperature_draw(self.rng), False)
            jobs += 1
        Device.objects.filter(id__in=ids).update(reference=False)
        for dev in honest:  # (their calibration jobs are no part of the measure)
            dev.jobs = 0
        return jobs

    def cheats(self) -> list[SimDevice]:
        return [d for d in self.devices if d.kind in CHEATS]

    def serve(self, *, jobs: int) -> None:
        """``jobs`` real jobs, each to a device drawn among the unquarantined."""
        for _ in range(jobs):
            live = [d for d in self.devices if not d.quarantined]
            self.job_serve(self.rng.choice(live))

    def serve_cheats(self, *, horizon: int) -> None:
        """Serve the cheats only (the honest devices verify), each until it is
        caught or ``horizon`` jobs past the first it cheated on."""
        active = self.cheats()
        while active:
            dev = self.rng.choice(active)
            self.job_serve(dev)
            if dev.quarantined or (
                dev.cheating_from is not None and dev.jobs - dev.cheating_from >= horizon
            ):
                active.remove(dev)

    def job_serve(self, dev: SimDevice) -> None:
        from django.conf import settings

        if self.rng.random() < settings.BALLAST_CANARY_RATE:
            self.check_run(dev)
            if dev.quarantined:
                return
        if dev.cheating() and dev.cheating_from is None:
            dev.cheating_from = dev.jobs
        dev.jobs += 1
        self.costs.jobs += 1
        temperature = temperature_draw(self.rng)
        constrained = self.rng.random() < CONSTRAINED_SHARE
        behaviour = dev.behaviour(temperature=temperature, constrained=constrained)
        if behaviour == "refuse" or (
            behaviour == "honest" and self.rng.random() < HONEST_ERROR_RATE
        ):
            self._failed(dev, temperature)
        else:
            self._answered(dev, behaviour, temperature, constrained)
        self._quarantine_read(dev)

    def _failed(self, dev: SimDevice, temperature: float) -> None:
        from hosts.services import device_outcome_record
        from jobs.models import Attempt, Job

        job, attempt = self._job(dev, temperature, prompt=0)
        Attempt.objects.filter(id=attempt.id).update(
            state=Attempt.State.ENDED, outcome=Attempt.Outcome.HOST_ERROR
        )
        Job.objects.filter(id=job.id).update(status=Job.Status.FAILED)
        device_outcome_record(
            device_id=dev.id, success=False, reason="host_error", model_id=self.model.id
        )

    def _answered(
        self, dev: SimDevice, behaviour: str, temperature: float, constrained: bool
    ) -> None:
        """The host answers from the bank (under a ``response_format`` when the
        job is ``constrained`` and the bank has its behaviour's); the attempt
        ends as ``jobs.services.attempts.attempt_end`` ends it: billed and
        count-checked by ``segment_tokens``, then told to trust's receiver
        (``jobs.hooks``: what a verifier is sent, a flagged count's failed
        check)."""
        from hosts.services import device_outcome_record
        from jobs.models import Attempt, Job
        from jobs.hooks import TrustHook, hook
        from jobs.services.segments import segment_tokens
        from jobs.tokens import canonical_split_expected
        from trust.verification.records import verification_choose

        pool = self._by_behaviour.get((behaviour, temperature, constrained))
        answer = self.rng.choice(pool or self._by_behaviour[(behaviour, temperature, False)])
        text, ids, reported = answer["text"], answer["token_ids"], answer["completion_tokens"]
        job, attempt = self._job(dev, temperature, prompt=answer["prompt"])
        billed, flagged = segment_tokens(
            model_id=self.model.id, text=text, reported=reported, token_ids=ids,
            canonical=canonical_split_expected(
                constrained=answer["constrained"], temperature=temperature
            ),
            budget=MAX_TOKENS,
        )  # fmt: skip
        Attempt.objects.filter(id=attempt.id).update(
            state=Attempt.State.ENDED,
            outcome=Attempt.Outcome.SUCCEEDED,
            ended_at=_now(),
            output_text=text,
            output_chars=len(text),
            completion_tokens_reported=reported,
            tokens_billed=billed,
            token_count_flagged=flagged,
        )
        Job.objects.filter(id=job.id).update(
            status=Job.Status.SUCCEEDED, output_text=text, tokens_billed=billed
        )
        # what a verifier is sent, and a flagged count's failed check: the
        # coordinator's own receiver, as attempt_end calls it
        attempt = Attempt.objects.select_related("job").get(id=attempt.id)
        hook().attempt_ended(attempt=attempt, token_ids=ids, now=_now())
        attempt.save(update_fields=list(TrustHook.ATTEMPT_FIELDS))
        self.costs.job_tokens += billed
        device_outcome_record(device_id=dev.id, success=True, model_id=self.model.id)
        if flagged:
            return
        job.refresh_from_db()
        attempt.refresh_from_db()
        ver = verification_choose(job=job, attempts=[attempt], now=_now())
        while ver is not None and ver.verifier_id is not None:
            ver = self._verify(ver, answer)

    def _verify(self, ver, answer):
        """The verifier answers ``ver`` with the bank's scores of what it is
        sent of ``answer`` (an honest verifier: the real model's),
        or, a sybil account verifying its cheat's answer, scores that call it
        plausible; returns the next round if one follows."""
        from agent.receipts import receipt_sign
        from jobs.models import Verification
        from jobs.tokens import token_count
        from trust.verification.plausibility import TokenScore, token_scores_parse
        from trust.verification.records import VERIFY_MAX_TOKENS, verification_scored

        machine_id, key = self.keys[ver.verifier_id]
        verified = answer["verify_text"] if answer["verify_text"] is not None else answer["text"]
        if self.sybils.get(ver.verifier_id) == ver.device_id:
            fair = TokenScore(rank=0, logprob=-1.0, mean=-1.0, var=1.0)
            sent = answer["verify_ids"]
            tokens = [fair] * (len(sent) if sent else token_count(self.model.id, verified))
        else:
            tokens = token_scores_parse(answer["scores"], max_tokens=VERIFY_MAX_TOKENS)
        self.costs.verifications += 1
        self.costs.verified_tokens += len(tokens)
        receipt = receipt_sign(key, ver.id.hex, len(tokens), verified)
        second = verification_scored(
            verification_id=ver.id.hex, machine_id=machine_id, tokens=tokens, receipt=receipt
        )
        return Verification.objects.get(id=second) if second else None

    def check_run(self, dev: SimDevice) -> None:
        from hosts.models import DeviceOutcome
        from hosts.services import device_outcome_record, device_quarantine_release_judge
        from trust.canaries import answer_right
        from trust.failures import device_check_failed
        from jobs.tokens import token_count_inflated

        if not self.bank["canaries"]:
            return  # the model's pool has no calibrated check: none is sent
        self.costs.checks += 1
        behaviour = dev.canary_behaviour()
        canary = self.rng.choice(self.bank["canaries"])
        if behaviour == "refuse":
            passed = False
        else:
            answer = canary["answers"]["honest" if behaviour == "inflate" else behaviour]
            reported = answer["completion_tokens"]
            if behaviour == "inflate":
                reported = int(reported * INFLATE + 0.999)
            self.costs.check_tokens += answer["completion_tokens"]
            passed = answer_right(
                canary["expected"], canary["distractors"], answer["text"]
            ) and not token_count_inflated(
                reported=reported, text=answer["text"], recount=answer["recount"]
            )
        if passed:
            device_outcome_record(
                device_id=dev.id, success=True, source=DeviceOutcome.Source.SPOT_CHECK,
                reason="spot_check", model_id=self.model.id,
            )  # fmt: skip
            device_quarantine_release_judge(device_id=dev.id)
        else:
            device_check_failed(
                device_id=dev.id, model_id=self.model.id, detail="spot check", now=_now()
            )
        self._quarantine_read(dev)

    def _job(self, dev: SimDevice, temperature: float, *, prompt: int):
        import json

        from bench.trustbank import prompt_messages, prompt_schema, response_format
        from jobs.models import Attempt, Job
        from jobs.services import job_create
        from jobs.services.deadlines import claim_deadline

        params = {"max_tokens": MAX_TOKENS, "temperature": temperature}
        schema = prompt_schema(prompt)
        if schema is not None:
            params["response_format"] = json.dumps(response_format(schema))
        job = job_create(
            renter=self.renter, api_key=None, model=self.model, endpoint=Job.Endpoint.CHAT,
            messages=prompt_messages(prompt), prompt=None, params=params, placement={},
            stream=True,
        )  # fmt: skip
        now = _now()
        attempt = Attempt.objects.create(
            job=job, device_id=dev.id, offered_at=now, claim_deadline=claim_deadline(now)
        )
        return job, attempt

    def _quarantine_read(self, dev: SimDevice) -> None:
        from hosts.models import Device

        quarantined = Device.objects.filter(id=dev.id, quarantined=True).exists()
        if quarantined and not dev.quarantined:
            if dev.kind == "honest":
                self.honest_quarantined += 1
            elif dev.caught_after is None and dev.cheating_from is not None:
                dev.caught_after = dev.jobs - dev.cheating_from
        dev.quarantined = quarantined
        if quarantined and dev.kind in ("honest", "sybil_account"):
            self.check_run(dev)  # quarantined: spot checks until 3 pass in a row


def cost_lines(costs: Costs, *, devices: int = 0, seconds: float = 0.0) -> list[str]:
    """What the checks cost ``costs`` counted; with ``devices`` served for
    ``seconds``, the checks of verifiers their clock sends in that time
    (``BALLAST_VERIFIER_CHECK_EVERY_S`` each, a spot check's size)."""
    from django.conf import settings

    costs.verifier_checks = round(devices * seconds / settings.BALLAST_VERIFIER_CHECK_EVERY_S)
    costs.verifier_check_tokens = costs.verifier_checks * costs.check_tokens // max(1, costs.checks)
    generated = costs.job_tokens + costs.check_tokens
    work = generated + costs.verified_tokens + costs.verifier_check_tokens
    return [
        f"spot checks: {costs.checks:,} ({costs.checks / max(1, costs.jobs):.1%} of jobs),"
        f" {costs.check_tokens / max(1, work):.1%} of the fleet's tokens",
        f"verifications: {costs.verifications:,} rounds"
        f" ({costs.verifications / max(1, costs.jobs):.1%} of jobs),"
        f" {costs.verified_tokens / max(1, work):.1%} of the fleet's tokens (prefilled;"
        " a prefilled token costs about a generated one here: docs/trust.md)",
        f"checks of verifiers (on their own clock): {costs.verifier_checks:,}"
        f" ({costs.verifier_checks / max(1, costs.jobs):.1%} of jobs),"
        f" {costs.verifier_check_tokens / max(1, work):.1%} of the fleet's tokens (prefilled)",
    ]


def _renter(tag: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create(username=f"{tag}-renter@bench")


def _index(traffic: list[dict]) -> dict:
    index: dict = {}
    for answer in traffic:
        if answer["text"]:
            key = (answer["behaviour"], answer["temperature"], answer["constrained"])
            index.setdefault(key, []).append(answer)
    return index


def _now():
    from django.utils import timezone

    return timezone.now()
