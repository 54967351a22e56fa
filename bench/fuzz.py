"""The fuzzers' long form: ``.venv/bin/python bench/fuzz.py [api|host|both] [--examples N]``.

The same runs as ``tests/fuzz`` (schemathesis against the renter API's OpenAPI
schema on a real coordinator with a scripted agent; fuzzed ``ballast.host.v1``
programs beside an honest machine streaming), with more examples, a new random
sequence each run and, for the API, the completions' valid boundary cases too.
Prints the machine, the time taken and the counts (statuses by operation;
frames sent, errors answered, closes, the fuzzing machine's own requests by
ending); exits non-zero on any breach, with the failing case.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = {
    "api": "tests/fuzz/test_api_schema.py",
    "host": "tests/fuzz/test_host_frames.py",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "which", choices=("api", "host", "both"), nargs="?", default="both"
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=500,
        help="random cases per API operation, and host programs (default 500)",
    )
    parser.add_argument(
        "--fixed", action="store_true", help="the CI's fixed sequence, not a new one"
    )
    args = parser.parse_args()
    env = {
        **os.environ,
        "BALLAST_FUZZ_EXAMPLES": str(args.examples),
        "BALLAST_FUZZ_RANDOM": "0" if args.fixed else "1",
        "BALLAST_FUZZ_FULL": "1",
        "BALLAST_DEV": os.environ.get("BALLAST_DEV", "1"),
    }
    print(
        f"fuzz: {platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"database {'PostgreSQL' if env.get('DATABASE_URL') else 'SQLite'}, "
        f"{'Redis' if env.get('REDIS_URL') else 'in-memory'} layer, {args.examples} examples",
        flush=True,
    )
    failed = 0
    for name in ("api", "host") if args.which == "both" else (args.which,):
        started = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-s",
                "-p",
                "no:cacheprovider",
                TESTS[name],
            ],
            cwd=ROOT,
            env=env,
            check=False,
        )
        print(
            f"fuzz {name}: exit {done.returncode}, {time.monotonic() - started:.0f} s",
            flush=True,
        )
        failed |= done.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
