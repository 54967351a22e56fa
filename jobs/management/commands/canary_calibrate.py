"""``python manage.py canary_calibrate MODEL`` (PROTOCOL.md §3, DESIGN.md "Spot checks").

Runs the reference model at temperature 0 on every candidate canary and keeps in
the model's set only the prompts it answers right, so honest hosts pass. The
reference engine is the agent's own llama.cpp engine, rendering the model's chat
template exactly as a host does.
"""

from __future__ import annotations

import asyncio

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from catalog.models import CatalogModel
from jobs.canaries import CANDIDATES, answer_appears
from jobs.models import CanaryPrompt
from jobs.spotchecks import SPOT_CHECK_MAX_TOKENS


async def _answers(model_id: str, prompts: list[str]) -> list[str]:
    from agent.engines.base import GenerationRequest, GenerationResult
    from agent.engines.llamacpp import LlamaCppEngine

    engine = LlamaCppEngine(model=model_id)
    await engine.load()
    outputs = []
    try:
        for prompt in prompts:
            request = GenerationRequest(
                model=model_id,
                messages=[{"role": "user", "content": prompt}],
                params={
                    "max_tokens": SPOT_CHECK_MAX_TOKENS,
                    "temperature": 0,
                    "top_p": 1.0,
                },
            )
            outputs.append(
                "".join(
                    [
                        piece
                        async for piece in engine.stream(request, GenerationResult())
                    ]
                )
            )
    finally:
        await engine.close()
    return outputs


class Command(BaseCommand):
    help = "Keep the canary prompts the reference model answers right at temperature 0."

    def add_arguments(self, parser):
        parser.add_argument("model")
        parser.add_argument(
            "--limit", type=int, default=0, help="try only the first N candidates"
        )

    def handle(self, *args, model: str, limit: int, **options):
        if not CatalogModel.objects.filter(id=model).exists():
            raise CommandError(f"model {model!r} is not in the catalog")
        if not model.startswith("smollm2-135m"):
            raise CommandError(
                f"no reference engine is known for {model!r} on the coordinator"
            )
        candidates = CANDIDATES[:limit] if limit > 0 else CANDIDATES
        outputs = asyncio.run(_answers(model, [prompt for prompt, _ in candidates]))
        now = timezone.now()
        kept = 0
        for (prompt, expected), output in zip(candidates, outputs, strict=True):
            right = answer_appears(expected, output)
            CanaryPrompt.objects.update_or_create(
                model_id=model,
                prompt=prompt,
                defaults={
                    "expected": expected,
                    "calibrated": right,
                    "calibrated_at": now,
                    "reference_output": output[:2000],
                },
            )
            kept += right
            mark = "kept   " if right else "dropped"
            self.stdout.write(
                f"{mark} {prompt!r} expects {expected!r}: {output.strip()[:70]!r}"
            )
        self.stdout.write(
            f"{kept} of {len(candidates)} canaries calibrated for {model}"
        )
