"""The honest-host property's long form (issue 32 item 1; the CI run is
``tests/e2e/test_honest_host_property.py`` with 300 requests).

Usage: ``.venv/bin/python -m bench.honest [--requests 2000] [-- PYTEST ARGS]``

Runs that property on real processes — the coordinator and two agents of two
owners serving SmolLM2-135M-Instruct through llama.cpp — over ``--requests``
generated renter requests (every legal combination of response_format,
logprobs, stop, max_tokens down to 1, temperatures 0–2, top_p, seed, streamed
or not, raw prompts holding special tokens and end-of-turn text, multi-byte
text). Exits non-zero, naming the request, if an honest device got a failed
outcome, a flagged count, an implausible verdict or lost score. Takes about
0.5 s per request on two cores.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/e2e/test_honest_host_property.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    os.environ["BALLAST_HONEST_REQUESTS"] = str(args.requests)
    os.chdir(ROOT)
    return pytest.main([TEST, "-x", "-q", "-p", "no:cacheprovider", *args.pytest_args])


if __name__ == "__main__":
    sys.exit(main())
