"""How long the fuzzers run, from the environment (CI: the defaults; ``bench/fuzz.py``
sets them for the long form).

``BALLAST_FUZZ_EXAMPLES``: programs of host frames, and random cases per API
operation (default 25); ``BALLAST_FUZZ_RANDOM=1``: a new random sequence each
run (default: a fixed one, the same in every CI run); ``BALLAST_FUZZ_FULL=1``:
the API's coverage phase also sends the completions' valid boundary cases
(hundreds, each waiting for an answer).
"""

from __future__ import annotations

import os


def examples() -> int:
    return int(os.environ.get("BALLAST_FUZZ_EXAMPLES", "25"))


def random_sequence() -> bool:
    return os.environ.get("BALLAST_FUZZ_RANDOM") == "1"


def full() -> bool:
    return os.environ.get("BALLAST_FUZZ_FULL") == "1"
