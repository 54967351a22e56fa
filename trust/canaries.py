"""How a spot check's answer is judged (DESIGN.md "Spot checks").

No prompt or answer lives here, nor in any file of this repository: the pool is
drawn from a secret seed (``trust.canarygen``) and calibrated on the reference
model (``trust.canarypool``), and exists only in the coordinator's database.
"""

from __future__ import annotations

import re
import unicodedata


def normalize(text: str) -> str:
    """Lower-case, NFKC-normalized text with runs of white space folded to one space."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def answer_appears(expected: str, output: str) -> bool:
    """True when ``expected`` appears in ``output`` as a whole word or number.

    Case and white space do not matter; "4" is found in "The answer is 4." but not
    in "24" (temperature 0 is not bit-exact across GPUs, so never string equality).
    """
    needle = re.escape(normalize(expected))
    return (
        re.search(rf"(?<![a-z0-9]){needle}(?![a-z0-9])", normalize(output)) is not None
    )


def answer_right(expected: str, distractors: list[str], output: str) -> bool:
    """True when ``output`` gives the expected answer and none of the
    ``distractors``, the other candidate answers its prompt names (an output
    that repeats every value it was told answers nothing)."""
    return answer_appears(expected, output) and not any(
        answer_appears(other, output) for other in distractors
    )
