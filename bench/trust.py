"""Trust under attack: how soon each cheat is quarantined, and what the checks cost.

Usage: ``.venv/bin/python bench/trust.py [--runs 100] [--weeks 1] [--days 7]
[--cheats a,b] [--models smollm2-135m-instruct,tiny-llama3] [--bank FILE]``

Per model of ``--models`` (``bench.trustmodels``: SmolLM2 Q4_1, and the tiny
Llama 3 of a second family; one table each), a simulated fleet of 53 devices
(one of each cheat of ``bench.trustfleet``, the requantized one on SmolLM2
only, the rest of 50 honest, the sybil cheat's three verifier accounts) is
served one
week of traffic (a job every 14 minutes for each of 50 devices: 36,000 jobs)
through the coordinator's own trust code on a scratch SQLite database; then
``--runs`` runs of the cheats alone (beside honest verifiers) give the
distribution of jobs-to-catch: the cheat's real jobs from the first it cheated
on to its quarantine. Answers, and the scores verifiers return for them, come
from the real model (``bench.trustbank``; built once, in minutes, and kept in
``--bank``, ``{model}`` in it the model's id). A model whose verification is
not calibrated (the tiny one: no calibration but the reference model's is
written by a migration) is calibrated first by its fleet's honest devices,
marked reference devices (``trustrun.Fleet.calibrate``); a model whose bank
has no spot check (random weights answer none right) is checked by
verification alone, as production would. The requantized cheat (j) runs on
SmolLM2 only (its Q4_0 file).

What runs for real, per simulated job (``bench.trustfleet`` lists the functions):
the job and its attempt stored (``jobs.services.job_create``), the outcome on the
device's score, the token count checked, the spot-check draw and verdict, the
verification draw (``trust.verification.records.verification_choose``), each
verifier's scores judged and paid (``verification_scored``: rounds until two agree), a
failed check's consequences, quarantine. Not run: the websockets, the relay, the
renter's billing (``docs/trust.md``).

Prints, per cheat: caught in how many runs within 100 jobs, the jobs-to-catch
distribution (p50, p90, p99, max); honest devices quarantined; the share of the
fleet's work spent on spot checks and on verification.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import django_on, machine_line, percentile  # noqa: E402
from bench.trustfleet import CHEATS  # noqa: E402
from bench.trustmodels import BENCH_MODELS, SMOLLM2  # noqa: E402

CATCH_WITHIN = 100
FLEET = 50
JOBS_PER_DEVICE_WEEK = 7 * 24 * 60 // 14


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="cheat-only runs")
    parser.add_argument("--weeks", type=int, default=1, help="whole-fleet weeks")
    parser.add_argument(
        "--days", type=float, default=7.0, help="days of traffic in each whole-fleet 'week'"
    )
    parser.add_argument(
        "--bank", default=str(ROOT / "var" / "trust-bank-{model}.json"),
        help="the bank's file ({model}: the model's id)",
    )  # fmt: skip
    parser.add_argument("--models", default=SMOLLM2, help=f"of {', '.join(BENCH_MODELS)}")
    parser.add_argument(
        "--cheats", default=",".join(CHEATS), help="the cheats of the cheat-only runs"
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--per-prompt", type=int, default=1)
    parser.add_argument("--canaries", type=int, default=24)
    parser.add_argument("--seed", type=int, default=20261203, help="the traffic's draws")
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    with tempfile.TemporaryDirectory() as scratch:
        django_on(f"sqlite:///{scratch}/trust.sqlite3", BALLAST_SPOT_CHECKS="1")
        import logging

        logging.getLogger("ballast").setLevel(logging.ERROR)  # a check failed: often, here
        for model_id in args.models.split(","):
            model_run(args, model_id)
    return 0


def model_run(args, model_id: str) -> None:
    """Build or load ``model_id``'s bank, serve its fleets, print its tables."""
    from django.conf import settings

    from bench.trustbank import bank_load_or_build
    from bench.trustrun import Fleet, cost_lines
    from catalog.models import CatalogModel
    from trust.models import ModelCalibration

    started = time.monotonic()
    bank = bank_load_or_build(
        Path(args.bank.format(model=model_id)), model_id=model_id, prompts=args.prompts,
        per_prompt=args.per_prompt, canaries=args.canaries,
    )  # fmt: skip
    entry = CatalogModel.objects.get(id=model_id)
    print(f"\n== {model_id}: {entry.family}, {entry.quantization},"
          f" weights sha256 {entry.weights_sha256[:12]}…, context {entry.context_length}")  # fmt: skip
    print(
        f"bank: {len(bank['traffic'])} answers, {len(bank['canaries'])} spot checks"
        f" ({time.monotonic() - started:.0f} s); settings: canary rate"
        f" {settings.BALLAST_CANARY_RATE}, verify rate {settings.BALLAST_VERIFY_RATE},"
        f" new {settings.BALLAST_VERIFY_NEW_RATE} over {settings.BALLAST_VERIFY_NEW_JOBS}"
        f" jobs, suspect {settings.BALLAST_VERIFY_SUSPECT_RATE} halving every"
        f" {settings.BALLAST_VERIFY_SUSPECT_PASSES} passes"
    )

    def calibration_say(jobs: int) -> None:
        if jobs:
            calibration = ModelCalibration.objects.get(model_id=model_id)
            print(f"verification calibrated by the fleet in {jobs} jobs"
                  f" ({calibration.samples} honest samples): {calibration.thresholds}")  # fmt: skip
    rng = random.Random(args.seed)
    requantized = any(a["behaviour"] == "q4_0" for a in bank["traffic"])
    cheats = [c for c in args.cheats.split(",") if c != "requantized" or requantized]
    fleet_cheats = [c for c in CHEATS if c != "requantized" or requantized]
    honest = FLEET - len(fleet_cheats)
    caught: dict[str, list[int | None]] = {}
    honest_quarantined = 0
    for week in range(args.weeks):
        started = time.monotonic()
        fleet = Fleet.make(
            bank=bank, rng=rng, tag=f"{model_id}-w{week}", honest=honest,
            cheats=fleet_cheats,
        )  # fmt: skip
        calibration_say(fleet.calibration_jobs)
        fleet.serve(jobs=round(FLEET * JOBS_PER_DEVICE_WEEK * args.days / 7))
        honest_quarantined += fleet.honest_quarantined
        for dev in fleet.cheats():  # (those the run decided: caught, or 100 jobs past)
            if dev.cheating_from is not None and (
                dev.caught_after is not None or dev.jobs - dev.cheating_from >= CATCH_WITHIN
            ):
                caught.setdefault(dev.kind, []).append(dev.caught_after)
        print(
            f"week {week + 1}: {fleet.costs.jobs:,} jobs, honest quarantined"
            f" {fleet.honest_quarantined} ({time.monotonic() - started:.0f} s)"
        )
        for line in cost_lines(fleet.costs, devices=FLEET, seconds=args.days * 86400):
            print("  " + line)
    started = time.monotonic()
    for run in range(args.runs):
        fleet = Fleet.make(
            bank=bank, rng=rng, tag=f"{model_id}-r{run}", honest=6, cheats=cheats
        )
        calibration_say(fleet.calibration_jobs)
        fleet.serve_cheats(horizon=CATCH_WITHIN)
        for dev in fleet.cheats():
            caught.setdefault(dev.kind, []).append(dev.caught_after)
    print(f"cheat runs: {args.runs} ({time.monotonic() - started:.0f} s)")
    print(f"honest devices quarantined: {honest_quarantined} of {honest * args.weeks}")
    from trust.verification.calibration import thresholds_of

    thresholds = thresholds_of(model_id)
    if thresholds is None:
        print(f"{model_id}: verification not calibrated (no fleet ran): nothing judged")
    else:
        for line in bank_lines(bank, thresholds):
            print(line)
    print(f"{model_id}: jobs-to-catch")
    print(f"{'cheat':14s} {'caught ≤100':>12s} {'p50':>5s} {'p90':>5s} {'p99':>5s} {'max':>5s}")
    for kind, values in caught.items():
        within = [v for v in values if v is not None and v <= CATCH_WITHIN]
        seen = [v if v is not None else 10**6 for v in values]
        print(
            f"{kind:14s} {len(within):5d}/{len(values):<6d}"
            f" {percentile(seen, 50):5.0f} {percentile(seen, 90):5.0f}"
            f" {percentile(seen, 99):5.0f} {max(seen):5.0f}"
        )


def bank_lines(bank: dict, thresholds) -> list[str]:
    """What one verification and one spot check catch of each behaviour: the
    share of the bank's answers the judge finds implausible by the model's
    ``thresholds`` (``plausibility.Thresholds``), per temperature, and the
    share of spot checks answered right."""
    from trust.canaries import answer_right
    from trust.verification.plausibility import answer_plausible, token_scores_parse
    from trust.verification.records import VERIFY_MAX_TOKENS

    cells: dict = {}
    for answer in bank["traffic"]:
        tokens = token_scores_parse(answer["scores"], max_tokens=VERIFY_MAX_TOKENS)
        flagged = not answer_plausible(
            temperature=answer["temperature"], tokens=tokens, thresholds=thresholds
        ).plausible
        key = (answer["behaviour"], answer.get("constrained", False), answer["temperature"])
        cells.setdefault(key, []).append(flagged)
    lines = [
        "one verification flags (answers judged implausible; constrained: under a"
        " json_schema), one spot check passes:"
    ]
    for behaviour, constrained in sorted({key[:2] for key in cells}):
        flags = "  ".join(
            f"T={t:g} {sum(v)}/{len(v)}"
            for (b, c, t), v in sorted(cells.items()) if (b, c) == (behaviour, constrained)
        )  # fmt: skip
        answers = [c["answers"].get(behaviour) for c in bank["canaries"]]
        passes = sum(
            answer_right(c["expected"], c["distractors"], a["text"])
            for c, a in zip(bank["canaries"], answers) if a
        )  # fmt: skip
        checks = f"spot checks passed {passes}/{len(bank['canaries'])}" if any(answers) else ""
        label = behaviour + (" (constrained)" if constrained else "")
        lines.append(f"  {label:22s} {flags}  | {checks}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
