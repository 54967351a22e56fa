"""Scoring an answer by prefill with llama.cpp: the model's logits at every
answer position, without generating (DESIGN.md "Verifying real answers").

The prompt is tokenized and evaluated exactly as generation does (one batch,
BOS once), then the answer's tokens one at a time, each position's logits read
after its token's predecessor: the same sequence of evaluations a generation of
that answer makes, so on the same build an honest answer at temperature 0 scores
rank 0 everywhere. (Evaluating the answer in one batch with every position's
logits costs about half as much on this CPU — 9–14 ms a token against 22–25 ms
for SmolLM2-135M on 2 shared cores — but its slightly different arithmetic
flipped 5 near-ties among 128 greedy tokens, misses an honest host would pay for.)
The context never keeps all logits (``logits_all``), only the last position's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from agent.engines.base import GenerationError
from agent.engines.constrained import GrammarMask, grammar_of
from agent.engines.sampling import AnswerScores, TokenScore, token_score


def prompt_tokenize(llama: Any, prompt: str) -> list[int]:
    """The tokens of a rendered ``prompt`` as generation evaluates them: BOS
    first, once (a template that prints BOS already gets no second one),
    special tokens parsed.

    Raises ``GenerationError`` when the prompt leaves no room in the context.
    """
    tokens = llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    bos = llama.token_bos()
    if len(tokens) >= 2 and tokens[0] == tokens[1] == bos:
        tokens = tokens[1:]  # the template printed BOS already
    if len(tokens) >= llama.n_ctx():
        raise GenerationError(
            f"prompt of {len(tokens)} tokens exceeds the context window "
            f"of {llama.n_ctx()} tokens"
        )
    return list(tokens)


def answer_score(
    llama: Any,
    prompt: str,
    answer: str,
    *,
    temperature: float,
    top_p: float,
    max_tokens: int,
    token_ids: list[int] | None = None,
    constraint: tuple[Any, dict[str, Any] | None] = (None, None),
) -> AnswerScores:
    """Score ``answer`` after the rendered ``prompt`` with the loaded ``llama``
    (the caller holds the engine's lock; the context is reset first, as a
    generation does).

    The answer's tokens are ``token_ids`` when given (the ids its host drew,
    which the coordinator found to spell it: the tokens scored are the ones
    sampled), else the answer tokenized as text (no BOS, special tokens not
    parsed: text that spells one is text). At most ``max_tokens`` tokens are scored, and no
    more than the context holds after the prompt; the rest is not scored (the
    ``scores`` frame then has fewer tokens than the answer). ``temperature``
    and ``top_p`` are the request's, as ``sampling.sampling_params`` reads them.
    ``constraint``: (the model's llama.cpp vocabulary, the request's
    ``response_format`` or None), applied as generation applies it
    (``constrained.GrammarMask``): each position is scored on the logits the
    grammar leaves (the distribution the constrained sampler drew from), the
    grammar advanced over the token; a token it forbids, and every token
    after it, is scored outside the support (no constrained sampler draws it).

    Raises ``GenerationError`` when the prompt does not fit the context, a
    token id is not in the model's vocabulary or the schema has no grammar.
    """
    vocab, response_format = constraint
    grammar = (
        GrammarMask(vocab, grammar_of(response_format), llama.n_vocab())
        if response_format
        else None
    )
    try:
        return _scored(
            llama, prompt, answer, temperature=temperature, top_p=top_p,
            max_tokens=max_tokens, token_ids=token_ids, grammar=grammar,
        )  # fmt: skip
    finally:
        if grammar is not None:
            grammar.close()


def _scored(
    llama: Any,
    prompt: str,
    answer: str,
    *,
    temperature: float,
    top_p: float,
    max_tokens: int,
    token_ids: list[int] | None,
    grammar: GrammarMask | None,
) -> AnswerScores:
    """``answer_score``'s work, with the grammar built (see there)."""
    tokens = prompt_tokenize(llama, prompt)
    n_vocab = llama.n_vocab()
    if token_ids is None:
        answer_ids = llama.tokenize(answer.encode("utf-8"), add_bos=False, special=False)
    else:
        outside = next((t for t in token_ids if not 0 <= t < n_vocab), None)
        if outside is not None:
            raise GenerationError(
                f"token id {outside} is not in the vocabulary ({n_vocab} tokens)"
            )
        answer_ids = token_ids
    room = llama.n_ctx() - len(tokens)
    answer_ids = list(answer_ids)[: max(0, min(max_tokens, room))]
    scores: list[TokenScore] = []
    left = False  # whether the answer left the grammar
    llama.reset()
    llama.eval(tokens)
    for position, token in enumerate(answer_ids):
        if position:
            llama.eval([answer_ids[position - 1]])
        logits = np.ctypeslib.as_array(llama._ctx.get_logits_ith(-1), shape=(n_vocab,))
        if grammar is not None and not left:
            left = not grammar.allows(token)
            masked = grammar(None, np.array(logits, dtype=np.single))
            if np.isfinite(masked).any():
                logits = masked
            if not left:
                grammar.accept(token)
        score = token_score(logits, token, temperature=temperature, top_p=top_p)
        # no constrained sampler draws a token its grammar forbids, nor any after it
        scores.append(replace(score, logprob=None) if left else score)
    return AnswerScores(tokens=scores, prompt_tokens=len(tokens))
