"""The sampler the llama.cpp engine generates with, and one answer token's score
under it (DESIGN.md "Verifying real answers").

Both generation (``agent.engines.llamacpp``) and scoring by prefill
(``agent.engines.prefill``) take their constants and their defaults from here,
so the support a score is computed over is the one generation samples from.

What llama-cpp-python 0.3.36 does (``Llama._init_sampler``, used by
``Llama.generate`` for every token): a chain of samplers over the raw logits —
the logits processors (none for plain text), the repetition penalties (a no-op
at ``repeat_penalty=1.0``, which the engine passes), then at temperature 0
greedy (the argmax), else ``top_k`` (the ``TOP_K`` largest logits, sorted),
``typical`` (a no-op at 1.0), ``top_p`` (llama.cpp takes the softmax of the
logits *left by top_k*, at temperature 1, and keeps the smallest prefix whose
cumulative probability reaches ``top_p``, at least one token; a no-op at
``top_p >= 1``), ``min_p`` (keeps the logits within ``log(MIN_P)`` of the
largest: a probability at least ``MIN_P`` times the top one's), then the
temperature (logits divided by T) and the draw from the softmax of what is
left. So the sampling distribution is ``p_T(j) = softmax(l_j / T)`` over the
support S, and the filters do not depend on T.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

TOP_K = 40
"""Tokens kept by top-k, before top-p and min-p (llama.cpp's ``top_k``)."""
MIN_P = 0.05
"""min-p: a token is kept when its probability is at least this share of the
most likely token's (llama.cpp's ``min_p``)."""


def sampling_params(params: dict[str, Any]) -> tuple[float, float]:
    """``(temperature, top_p)`` of an offer's ``params`` as generation uses them:
    a missing or None temperature is 1.0, a missing top_p 1.0 (llama.cpp's
    defaults as the engine passes them)."""
    temperature = params.get("temperature")
    top_p = params.get("top_p")
    return (
        1.0 if temperature is None else float(temperature),
        1.0 if top_p is None else float(top_p),
    )


@dataclass(frozen=True)
class TokenScore:
    """One answer token under the sampler at one position (a ``scores`` entry).

    ``rank``: 0-based rank of the token among the raw logits (0: the argmax;
    ties rank by the count of strictly larger logits). ``logprob``: natural log
    of ``p_T(token)`` when the token is in the support S, else None (at T = 0,
    T = 1 is used: rank decides greedy plausibility). ``mean``: E[log p_T] over
    S (minus the entropy, nats); ``var``: Var[log p_T] (nats²).
    """

    rank: int
    logprob: float | None
    mean: float
    var: float

    def frame(self) -> dict[str, Any]:
        """The entry of a ``scores`` frame's ``tokens``, its numbers to 6
        significant digits (about 60 characters an entry: a whole 2,048-token
        context's scores stay far under the 256 KiB frame limit)."""
        return {
            "rank": self.rank,
            "logprob": None if self.logprob is None else _digits(self.logprob),
            "mean": _digits(self.mean),
            "var": _digits(self.var),
        }


def _digits(value: float) -> float:
    return float(f"{value:.6g}")


@dataclass(frozen=True)
class AnswerScores:
    """An answer scored by prefill: one ``TokenScore`` per answer token (as this
    model's tokenizer splits the answer after the prompt, no BOS), in order, and
    the prompt's length in tokens."""

    tokens: list[TokenScore]
    prompt_tokens: int


def support(logits: np.ndarray, top_p: float) -> np.ndarray:
    """Token ids of the sampler's support S for raw ``logits`` (shape
    ``(n_vocab,)``), most likely first: top-k ``TOP_K``, then top-p (softmax of
    the top-k logits at temperature 1), then min-p ``MIN_P``."""
    logits = np.asarray(logits, dtype=np.float64)
    k = min(TOP_K, logits.shape[0])
    kept = np.argpartition(-logits, k - 1)[:k]
    kept = kept[np.argsort(-logits[kept], kind="stable")]
    if top_p < 1.0:
        top = logits[kept]
        p = np.exp(top - top[0])
        cumulative = np.cumsum(p / p.sum())
        reached = np.nonzero(cumulative >= top_p)[0]
        if reached.size:
            kept = kept[: int(reached[0]) + 1]
    floor = logits[kept[0]] + math.log(MIN_P)
    return kept[logits[kept] >= floor]


def token_score(
    logits: np.ndarray, token: int, *, temperature: float, top_p: float
) -> TokenScore:
    """The ``TokenScore`` of ``token`` at a position with raw ``logits``
    (shape ``(n_vocab,)``) under temperature ``temperature`` (<= 0: greedy,
    scored at 1) and ``top_p`` (>= 1: no top-p).

    Raises ``ValueError`` when ``token`` is not an id of the vocabulary.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if not 0 <= token < logits.shape[0]:
        raise ValueError(f"token {token} is outside the vocabulary")
    rank = int(np.count_nonzero(logits > logits[token]))
    kept = support(logits, top_p)
    scale = temperature if temperature > 0 else 1.0
    scaled = logits[kept] / scale
    log_p = scaled - scaled.max()
    log_p -= math.log(float(np.exp(log_p).sum()))
    p = np.exp(log_p)
    mean = float(np.dot(p, log_p))
    var = float(np.dot(p, (log_p - mean) ** 2))
    where = np.nonzero(kept == token)[0]
    logprob = float(log_p[where[0]]) if where.size else None
    return TokenScore(rank=rank, logprob=logprob, mean=mean, var=var)
