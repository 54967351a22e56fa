"""``python manage.py canary_calibrate MODEL --count N`` (DESIGN.md "Spot checks").

Draws new spot-check prompts of the model (``trust.canarypool``) and calibrates
them on the reference model now (``refengine.engines``), the agent's own llama.cpp
engine rendering the
model's chat template exactly as a host does, until N have joined the pool
(at most ``--tries``, 20 × N by default); a prompt joins only if the model
gives its right answer; then N of the calibrated prompts not tried yet are
made checks of verifiers if they qualify (``trust.verification.checks``). Celery beat keeps the pool
topped up the same way (``trust.tasks.canary_pool_top_up``); this fills it at once (a first start,
the demo). Prints how many joined, never a prompt or an answer.
"""

from __future__ import annotations

import asyncio

from django.core.management.base import BaseCommand, CommandError

from catalog.models import CatalogModel
from refengine.engines import engine_answerer, engine_checks, reference_engine
from trust.canarypool import canary_pool_fill
from trust.verification.check_calibration import checks_calibrate


class Command(BaseCommand):
    help = "Draw spot-check prompts and keep those the reference model answers right."

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument(
            "--count", type=int, default=16, help="prompts to add to the pool"
        )
        parser.add_argument(
            "--tries", type=int, default=0, help="prompts to try at most (20 × count)"
        )

    def handle(self, *args, model: str, count: int, tries: int, **options):
        if not CatalogModel.objects.filter(id=model).exists():
            raise CommandError(f"model {model!r} is not in the catalog")
        if count < 1:
            raise CommandError("--count must be at least 1")
        engine = reference_engine(model)
        if engine is None:
            raise CommandError(
                f"no reference engine is known for {model!r} on the coordinator"
            )
        asyncio.run(engine.load())
        try:
            kept = canary_pool_fill(
                model_id=model,
                keep=count,
                tries=tries or 20 * count,
                answer=engine_answerer(engine),
            )
            judge, sample = engine_checks(engine)
            checks = checks_calibrate(
                model_id=model, judge=judge, sample=sample, tries=count
            )
        finally:
            asyncio.run(engine.close())
        self.stdout.write(
            f"{kept} spot-check prompts calibrated for {model};"
            f" {checks} made checks of verifiers"
        )
