"""The renter's ``max_tokens`` as a cut on the text relayed: a renter never
receives more than it asked for, whatever a host sends (DESIGN.md "Money")."""

from __future__ import annotations

from ..tokens import token_count


class OutputBudget:
    """The text a job delivered so far, held against its ``max_tokens``.

    Cheap while the UTF-8 bytes of the answer are within ``max_tokens``: every
    token of a byte-level BPE vocabulary is at least one byte, so tokens(answer)
    ≤ tokens at the last count + bytes since (+1 at the seam). Past that, the
    model's tokenizer counts the whole answer and the longest prefix of a piece
    that fits is found by bisection.
    """

    def __init__(self, *, model_id: str, max_tokens: int | None) -> None:
        self.model_id = model_id
        self.max_tokens = max_tokens
        self.pieces: list[str] = []
        self.bytes = 0
        self.mark = (0, 0)  # (bytes, tokens) at the tokenizer's last count

    @property
    def text(self) -> str:
        """Everything delivered so far, exactly."""
        return "".join(self.pieces)

    def take(self, text: str) -> tuple[str, bool]:
        """Deliver what of ``text`` fits; return (that part, whether the limit
        was passed: the rest of ``text`` is dropped and the answer must end)."""
        limit = self.max_tokens
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        marked_bytes, marked_tokens = self.mark
        total = self.bytes + size
        if not limit or marked_tokens + (total - marked_bytes) + 1 <= limit:
            return self._deliver(text, size), False
        before = self.text
        count = token_count(self.model_id, before + text)
        if count is None:
            return self._deliver(text, size), False
        self.mark = (total, count)
        if count <= limit:
            return self._deliver(text, size), False
        low, high = 0, len(text)
        while low < high:
            mid = (low + high + 1) // 2
            if (token_count(self.model_id, before + text[:mid]) or 0) <= limit:
                low = mid
            else:
                high = mid - 1
        cut = text[:low]
        return self._deliver(cut, len(cut.encode("utf-8"))), True

    def _deliver(self, text: str, size: int) -> str:
        if text:
            self.pieces.append(text)
            self.bytes += size
        return text
