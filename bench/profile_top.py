"""Summarise a py-spy collapsed-stack file (``--format raw``): where the CPU went.

Usage: ``.venv/bin/python bench/profile_top.py PROFILE.txt [--top 25] [--match jobs/,hosts/]``

Prints the share of samples per thread, then the functions with the largest
inclusive share (a function counted once per sample it appears in), and the
largest self share (the innermost frame). ``--match`` keeps only frames whose
file path contains one of the given parts (e.g. the project's own code).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

IDLE = re.compile(r"^(_worker|wait|Condition\.wait|Connection\.wait|Queue\.get|select|_run_once|"
                  r"Runner\.run|run_forever|_wait_for_tstate_lock|Event\.wait|acquire) ")
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:]*)(?::\d+)?\)$")


def short(frame: str) -> str:
    """``func (path/to/file.py:12)`` → ``func (file.py)`` keeping the last two path parts."""
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    parts = m["file"].split("/")
    return f"{m['func']} ({'/'.join(parts[-2:])})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", default="")
    parser.add_argument("--thread", default="", help="keep only samples of threads whose name contains this")
    parser.add_argument("--drop-idle", action="store_true",
                        help="drop samples whose innermost frame is a wait (lock, queue, socket, select)")
    args = parser.parse_args()
    matches = [m for m in args.match.split(",") if m]

    inclusive: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in open(args.path):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = stack.split(";")
        if args.thread and not any(args.thread in f for f in frames if f.startswith("thread")):
            continue
        if args.drop_idle and frames and IDLE.search(frames[-1]):
            continue
        if frames and frames[0].startswith(("thread", "process")):
            head = [f for f in frames if f.startswith("thread")]
            threads[head[0] if head else frames[0]] += n
            frames = [f for f in frames if not f.startswith(("thread", "process"))]
        names = [short(f) for f in frames]
        if matches:
            kept = [s for s, f in zip(names, frames, strict=True) if any(m in f for m in matches)]
        else:
            kept = names
        for name in set(kept):
            inclusive[name] += n
        if names:
            self_[names[-1]] += n
    print(f"{total} samples")
    for name, n in threads.most_common(6):
        print(f"  {100 * n / total:5.1f}%  {name}")
    print("inclusive:")
    for name, n in inclusive.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {name}")
    print("self:")
    for name, n in self_.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
