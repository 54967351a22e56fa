"""The engine interface: what the protocol client needs from an inference backend.

An engine loads its model(s) once, then streams text for generation requests.
Engines are asyncio-friendly: ``load`` is a coroutine and ``stream`` an async
iterator, whatever blocking work happens behind them (threads, HTTP).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.engines.sampling import AnswerScores
    from modeldata.entry import Weights

DEFAULT_MAX_TOKENS = 256
"""Completion budget (tokens) when an offer's params carry no ``max_tokens``."""


class ModelLoadError(Exception):
    """A model could not be loaded; ``error`` is the engine's own message."""

    def __init__(self, model: str, error: str) -> None:
        super().__init__(f"cannot load model {model}: {error}")
        self.model = model
        self.error = error


class GenerationError(Exception):
    """A generation failed inside the engine; the message is sent to the coordinator."""


@dataclass
class GenerationRequest:
    """One generation, built from an ``offer`` frame.

    Exactly one of ``messages`` (OpenAI chat messages, ``[{"role", "content"}]``)
    and ``prompt`` (raw text) is set. ``params`` holds the offer's sampling
    parameters: ``max_tokens`` (tokens), ``temperature``, ``top_p``, ``stop``
    (str or list of str), ``seed`` (int); any may be missing or None.
    ``continue_from`` is text the answer must continue exactly (possibly
    mid-word); the engine's output is what comes *after* it.

    ``response_format`` (None: plain text) is ``{"type": "json_object"}``,
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``
    or ``{"type": "json_sequence", "json_sequence": {"name", "schema",
    "prefix", "suffix", "separator", "min_items", "max_items",
    "text_unless"}}`` (documents of the schema between literals: a model's
    own tool-call format): the answer — ``continue_from`` and the output
    together — must be JSON (an object) matching the schema, or that
    sequence. ``logprobs`` (None: not asked) is how
    many alternatives per token (0–20) the engine reports with each token's
    log-probability (``Piece``). Both need the engine's ``features``.
    """

    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    continue_from: str = ""
    response_format: dict[str, Any] | None = None
    logprobs: int | None = None

    def features_needed(self) -> set[str]:
        """The ``FEATURES`` this request needs of the engine."""
        needs = set()
        if self.response_format:
            needs.add(str(self.response_format.get("type")))
        if self.logprobs is not None:
            needs.add("logprobs")
        return needs

    def max_tokens(self) -> int:
        """The completion budget in tokens (``DEFAULT_MAX_TOKENS`` when absent)."""
        value = self.params.get("max_tokens")
        return DEFAULT_MAX_TOKENS if value is None else int(value)

    def seed(self) -> int | None:
        """The sampling seed as llama.cpp takes it (32 bits: a renter's 64-bit
        seed reduced modulo 2**32, never cut), or None when absent."""
        value = self.params.get("seed")
        return None if value is None else int(value) % 2**32

    def stop(self) -> list[str]:
        """Stop sequences as a list (an empty list when none)."""
        value = self.params.get("stop")
        if value is None:
            return []
        if isinstance(value, str):
            return [value] if value else []
        return [str(item) for item in value if item]


FEATURES = ("json_object", "json_schema", "json_sequence", "logprobs", "token_ids")
"""What an engine may do beyond text (announced in ``hello.features``):
``json_object`` / ``json_schema`` / ``json_sequence``, a ``response_format``
served by constrained decoding, also across a continuation; ``logprobs``, each token's
log-probability and its top alternatives (``Piece``)."""


class Piece(str):
    """A piece of output text with its tokens' log-probabilities, for a
    request that asked for them (``GenerationRequest.logprobs``).

    ``logprobs``: one entry per token whose bytes end within this piece, in
    order: ``{"token": text, "logprob": float <= 0, "bytes": [int],
    "top_logprobs": [{"token", "logprob", "bytes"}]}`` (OpenAI's chat shape).
    The entries of an answer's pieces, their ``bytes`` joined, are its text's
    UTF-8 bytes (a last token cut by a stop sequence keeps the bytes sent).
    """

    logprobs: list[dict[str, Any]]

    def __new__(cls, text: str, logprobs: list[dict[str, Any]] | None = None):
        piece = super().__new__(cls, text)
        piece.logprobs = list(logprobs or ())
        return piece


@dataclass
class GenerationResult:
    """What an engine reports once a stream ends normally.

    ``finish_reason`` is ``"stop"`` (end of answer or a stop sequence) or
    ``"length"`` (``max_tokens`` reached); token counts are in tokens.
    ``token_ids``: the ids of the ``completion_tokens`` counted tokens as the
    sampler drew them, in order (sent in ``done`` so the coordinator judges the
    count against the tokens drawn, not against a re-tokenization of the
    text); None from an engine that cannot tell them.
    """

    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    token_ids: list[int] | None = None


class Engine(ABC):
    """An inference backend serving one or more models on the agent's device.

    Subclasses set ``name`` and ``version`` (announced in ``hello`` as the
    machine's build), ``features`` (what they do beyond text, of
    ``FEATURES``: the coordinator offers a request needing one only to an
    engine that declares it) and implement the three methods below.
    """

    name: str = "engine"
    version: str = "unknown"
    features: frozenset[str] = frozenset()
    #: True when ``score`` works (announced in ``hello`` as ``verifies``).
    verifies: bool = False
    #: The weights of each loaded model, by model id (``modeldata.entry.Weights``:
    #: sha256 and quantization of the file the engine runs), set by ``load``
    #: where the engine can tell (``agent.weights``); declared in heartbeats.
    #: A model without an entry is declared without weights.
    weights_loaded: Mapping[str, Weights] = MappingProxyType({})

    #: Test doubles only: False makes the client ignore offers (never claim).
    claims_offers: bool = True
    #: Test doubles only: False makes the client sign a receipt over other text.
    signs_honestly: bool = True

    @abstractmethod
    def loaded_models(self) -> list[str]:
        """Ids of the catalog models ready to serve now (empty before ``load``)."""

    @abstractmethod
    async def load(self) -> None:
        """Load the configured model(s).

        Raises ``ModelLoadError(model, message)`` when a model cannot be loaded;
        the engine then lists nothing it failed to load in ``loaded_models``.
        """

    @abstractmethod
    def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[str]:
        """Generate text for ``request``, yielding non-empty pieces in order.

        Pieces are Python strings, so a UTF-8 character is never split; a
        request with ``logprobs`` gets ``Piece`` strings carrying them. When the
        iterator ends normally, ``result`` holds the finish reason and the token
        counts. Closing the iterator early (``aclose()`` or cancelling the task
        that iterates it) stops the generation promptly.

        Raises ``GenerationError`` (or any exception) when generation fails; the
        client reports it to the coordinator as an ``error`` frame.
        """

    async def score(
        self, request: GenerationRequest, answer: str, token_ids: list[int] | None = None
    ) -> AnswerScores:
        """Score ``answer`` as the completion of ``request`` by prefill (a
        ``verify`` offer): each answer token's rank and log-probability under
        the request's sampling parameters, without generating. ``token_ids``:
        the answer's tokens as its host drew them (the ``verify`` frame's),
        scored instead of the answer's text tokenized again.

        Engines that can (``verifies``) override it; this one raises
        ``GenerationError`` saying this engine cannot score.
        """
        raise GenerationError(f"engine {self.name} cannot score answers")

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing by default
        """Release the engine's resources (HTTP clients, model memory)."""
