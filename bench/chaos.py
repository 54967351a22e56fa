"""The chaos run's long form: ``.venv/bin/python bench/chaos.py [--requests 500]``.

The same run as ``tests/chaos`` (``tests.chaos.run``: two coordinators behind
HAProxy, Celery worker and beat, scripted agents and one with the real model, on
a PostgreSQL cluster and a Redis server of its own; agents SIGKILLed and
stalled, coordinator B SIGKILLed, PostgreSQL and Redis restarted, renters
disconnecting), more requests. Prints the counts (requests by ending,
failovers, continuations, faults injected) and every breach; exits 1 on a
breach or on a run that injected none of a fault it names.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.chaos.run import Chaos, ChaosConfig  # noqa: E402
from tests.chaos.services import services_missing  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--no-real-model", action="store_true")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args()
    missing = services_missing()
    if missing:
        print(f"chaos: cannot run: {missing}", file=sys.stderr)
        return 2
    config = ChaosConfig(
        requests=args.requests,
        concurrency=args.concurrency,
        agents=args.agents,
        seed=args.seed,
        real_model=not args.no_real_model,
        log_dir=args.log_dir,
    )
    started = time.monotonic()
    result = Chaos(config).run()
    print(
        f"chaos run: seed {args.seed}, {args.requests} requests, {args.agents} scripted "
        f"agents{'' if args.no_real_model else ' + 1 real model'}, "
        f"{time.monotonic() - started:.0f} s"
    )
    print(json.dumps(result.report["counts"], indent=1))
    for breach in result.report["breaches"]:
        print(f"BREACH: {breach}")
    print(f"{len(result.report['breaches'])} breach(es)")
    return 1 if result.report["breaches"] else 0


if __name__ == "__main__":
    sys.exit(main())
