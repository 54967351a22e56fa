#!/usr/bin/env bash
# A/B: one benchmark on another commit and on this checkout, alternated, in one session.
# Usage: bench/ab.sh REV [ROUNDS] -- bench/PROGRAM.py [ARGS...]
#   e.g. bench/ab.sh d419edd 2 -- bench/ttft.py --sequential 300 --rounds 2 --plain
# REV is checked out in a temporary git worktree that uses this checkout's .venv and
# this checkout's bench/ (the instrument stays the same: only the code under test
# differs). Each run's output goes to var/ab-<time>/<side>-<round>.txt; the "added"
# and "direct" lines, every p50 line and the heartbeat figures of every run are printed at the end. The same machine notes as
# bench/run_all.sh apply (PostgreSQL and Redis on loopback, one run at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bench/ab.sh REV [ROUNDS] -- bench/PROGRAM.py [ARGS...]}
shift
rounds=2
if [ "${1:-}" != "--" ]; then rounds=${1:?}; shift; fi
[ "${1:-}" = "--" ] || { echo "ab: missing -- before the program" >&2; exit 2; }
shift
here=$(pwd)
out=var/ab-$(date +%Y%m%d-%H%M%S)
base=$(mktemp -d)/base
mkdir -p "$out"
git worktree add -q --detach "$base" "$rev"
trap 'git worktree remove --force "$base"' EXIT
ln -s "$here/.venv" "$base/.venv"
rm -rf "$base/bench" && cp -r "$here/bench" "$base/bench"
echo "A/B: $rev ($(git rev-parse --short "$rev")) vs this checkout ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' ':!docs' || echo ' + uncommitted'))" | tee "$out/ab.txt"
for round in $(seq "$rounds"); do
  for side in base this; do
    dir=$here; [ "$side" = base ] && dir=$base
    (cd "$dir" && timeout 1800 .venv/bin/python "$@" > "$here/$out/$side-$round.txt" 2>&1) || echo "ab: $side run $round failed (see $out/$side-$round.txt)"
  done
done
grep -H "added\|direct\|p50\|heartbeats/s\|writes per heartbeat" "$out"/*-*.txt | tee -a "$out/ab.txt"
