"""SentencePiece-style BPE as llama.cpp runs it for ``tokenizer.ggml.model`` "llama".

The text (spaces already "▁") starts as one symbol per UTF-8 character; the
adjacent pair whose concatenation is a token with the highest score merges
first (the leftmost on a tie), until no pair is a token. A final symbol that is
not a token is split back along the merges that made it, and a character no
token covers becomes its byte tokens ``<0xXX>``. No library runs this rule: HF
``tokenizers`` has BPE by merge rank and Unigram, not merges by token score.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence


def spm_tokenize(
    text: str,
    token_ids: Mapping[str, int],
    scores: Sequence[float],
    byte_token: Callable[[int], int],
) -> list[int]:
    """Token ids of ``text`` (already escaped: " " as "▁").

    ``token_ids``: each token's text to its id; ``scores``: each id's score;
    ``byte_token``: the id of a byte's token. Raises ``KeyError`` when a byte
    has no token.
    """
    pieces = list(text)  # one symbol per character; "" once merged away
    count = len(pieces)
    after = list(range(1, count + 1))
    before = list(range(-1, count - 1))
    if count:
        after[-1] = -1
    queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, length)
    made_of: dict[str, tuple[int, int]] = {}

    def pair_add(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        joined = pieces[left] + pieces[right]
        token = token_ids.get(joined)
        if token is None or token >= len(scores):
            return
        heapq.heappush(queue, (-scores[token], left, right, len(joined)))
        made_of[joined] = (left, right)

    for index in range(1, count):
        pair_add(index - 1, index)
    while queue:
        _, left, right, length = heapq.heappop(queue)
        if (
            not pieces[left]
            or not pieces[right]
            or len(pieces[left]) + len(pieces[right]) != length
        ):
            continue  # one side merged since this pair was queued
        pieces[left] += pieces[right]
        pieces[right] = ""
        after[left] = after[right]
        if after[right] >= 0:
            before[after[right]] = left
        pair_add(before[left], left)
        pair_add(left, after[left])

    output: list[int] = []

    def resegment(piece: str) -> None:
        token = token_ids.get(piece)
        if token is not None:
            output.append(token)
            return
        parts = made_of.get(piece)
        if parts is None:
            output.extend(byte_token(b) for b in piece.encode("utf-8"))
            return
        resegment(pieces_at[parts[0]])
        resegment(pieces_at[parts[1]])

    pieces_at = pieces
    index = 0 if count else -1
    while index >= 0:
        resegment(pieces[index])
        index = after[index]
    return output
