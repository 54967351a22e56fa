#!/usr/bin/env bash
# Rerun every benchmark (bench/README.md), one after the other (they share 2 cores).
# Usage: [QUICK=1] bench/run_all.sh [OUT_DIR]   (default var/bench-<date>); needs PostgreSQL on
# 127.0.0.1:5432 (user postgres) and Redis on 127.0.0.1:6379 (db 7 is flushed).
# Every program prints the machine, its settings and its figures; each is bounded in time.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-var/bench-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' ':!docs' || echo ' (+ uncommitted changes)')" | tee "$OUT/commit.txt"
run() {  # name, timeout s, command...
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
}
if [ "${QUICK:-0}" = 1 ]; then  # ~8–30 min (machine-dependent): the headline figures
  run ratios 2400 $PY bench/ratios.py --rounds 2
  run ttft 900 $PY bench/ttft.py --sequential 200 --rounds 2 --plain
  run ttft-counted 900 $PY bench/ttft.py --sequential 100 --rounds 1
  run ttft-renters 900 $PY bench/ttft.py --sequential 50 --rounds 2 --renters 50 --plain
  run relay 1200 $PY bench/relay.py --scale 1 --streams 1,50 --servers bare,inmem,pubsub
  run heartbeats 900 $PY bench/heartbeats.py --machines 5000 --seconds 15 --settle 120
  run claim 1500 $PY bench/claim.py --fleets 1000,10000,100000 --claims 300
  run job_end 600 $PY bench/job_end.py --jobs 200 --rounds 2
  run credit_check 600 $PY bench/credit_check.py --histories 0,10000,100000 --checks 200
  run request_step 600 $PY bench/request_step.py --requests 400
  PROFILE=0
else
  run ratios 2400 $PY bench/ratios.py --rounds 2 --profile "$OUT/profiles"
  run ttft 900 $PY bench/ttft.py --plain
  run ttft-counted 900 $PY bench/ttft.py --sequential 100 --rounds 1
  run ttft-renters 900 $PY bench/ttft.py --sequential 50 --rounds 4 --renters 50 --plain
  run relay 1800 $PY bench/relay.py --scale 0.5 --servers bare,inmem,pubsub
  # channels_redis core stalls under load: a short check only
  run relay-core 600 $PY bench/relay.py --scale 0.5 --servers core --streams 1,50 --per-frame 1
  run heartbeats 900 $PY bench/heartbeats.py --machines 5000 --seconds 15 --settle 120
  run heartbeats-60s 900 $PY bench/heartbeats.py --machines 1000 --seconds 70 --settle 120
  run claim 1800 $PY bench/claim.py
  run claim_profile 300 $PY bench/claim_profile.py --devices 100000
  run job_end 900 $PY bench/job_end.py --jobs 300 --rounds 3 --profile "$OUT/job_end.prof"
  run credit_check 900 $PY bench/credit_check.py --histories 0,10000,100000,1000000
  run failover 900 $PY bench/failover.py --kills 10
  run request_step 600 $PY bench/request_step.py
fi
# Profiles (py-spy: .venv/bin/pip install py-spy; not in requirements.txt):
if [ -x .venv/bin/py-spy ] && [ "${PROFILE:-1}" = 1 ]; then
  run ttft-profiled 900 $PY bench/ttft.py --profile "$OUT/profiles" --sequential 100 --rounds 2 --layers pubsub
  run relay-profiled 1200 $PY bench/relay.py --profile "$OUT/profiles" --servers inmem --scale 0.5
  for f in "$OUT"/profiles/*.txt; do
    $PY bench/profile_top.py "$f" --drop-idle --top 40 > "${f%.txt}.top"
  done
fi
echo "figures in $OUT"
