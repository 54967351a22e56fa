"""``bench/ttft.py --base REV``: commit REV's coordinator and agents beside this
checkout's and the direct app, their requests interleaved (``compare``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import scratch_postgres
from bench.harness import ROOT, coordinator_env, redis_flush
from bench.ttft_measure import line, measure_interleaved, print_added
from bench.ttft_sides import ballast_start, uvicorn_start, wait_http


def compare(args, script: str) -> int:
    """``--base REV``: commit REV's coordinator and agents beside this checkout's (each on its
    own scratch database; with pub/sub, this checkout on ``BENCH_REDIS_URL``'s db and REV on
    the next db, both flushed), and the direct app, measured interleaved. Returns the exit
    status (2: REV is not a commit)."""
    import contextlib
    import shutil

    from ballast.stack import ROOT as this_root
    from ballast.stack import Stack, port_free
    from bench.harness import REDIS_URL

    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.base}^{{commit}}"],
                           cwd=ROOT, capture_output=True, text=True)
    if known.returncode != 0:
        print(f"ttft: --base {args.base!r} is not a commit of this repository", file=sys.stderr)
        return 2
    this_db = int(REDIS_URL.rsplit("/", 1)[1] or 0)
    redis_dbs = {"this": REDIS_URL, "base": REDIS_URL.rsplit("/", 1)[0] + f"/{this_db + 1}"}
    work = Path(tempfile.mkdtemp())
    base_root = work / "base"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(base_root), args.base],
                   cwd=ROOT, check=True)
    rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    this_rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", ":!bench", ":!docs"],
                           cwd=ROOT).returncode != 0
    print(f"compare: base {args.base} ({rev}) vs this checkout ({this_rev}{' + uncommitted' if dirty else ''})",
          flush=True)
    (base_root / ".venv").symlink_to(ROOT / ".venv")
    try:
        port = port_free()
        direct = uvicorn_start("bench.ttft_sides:direct_app", port, dict(os.environ, BENCH_SCRIPT=script),
                               work / "direct.log")
        direct_url = f"http://127.0.0.1:{port}"
        try:
            wait_http(direct_url + "/")
            for layer in args.layers.split(","):
                with contextlib.ExitStack() as stacks:
                    targets = [(direct_url, "x")]
                    for side, root in (("base", base_root), ("this", this_root)):
                        db = stacks.enter_context(scratch_postgres())
                        redis_url = redis_dbs[side]
                        if layer != "inmem":
                            redis_flush(redis_url)
                        env = coordinator_env(db, layer, str(work), **(
                            {"REDIS_URL": redis_url} if layer != "inmem" else {}))
                        stack = stacks.enter_context(
                            Stack(env=env, log_dir=work / f"logs-{layer}-{side}", root=root))
                        key = ballast_start(stack, db, env, args, script, prefix=f"agent{layer}{side}",
                                            instrumented=False, root=root)
                        targets.append((stack.url, key))
                    got = asyncio.run(measure_interleaved(targets, args.sequential, args.concurrency,
                                                          args.rounds, pause_s=args.pause_s))
                (d_seq, d_conc, d_err), *sides = got
                print(line(f"direct  sequential (beside {layer})", d_seq))
                print(line(f"direct  {args.concurrency} concurrent", d_conc))
                for name, (seq, conc, err) in zip((f"base {rev}", f"this {this_rev}"), sides, strict=True):
                    print(line(f"{name}[{layer}] sequential", seq))
                    print(line(f"{name}[{layer}] {args.concurrency} concurrent", conc))
                    print_added(args.concurrency, seq, conc, d_seq, d_conc)
                    print(f"  errors {len(err)} {err[:2]}")
                print(f"  direct errors {len(d_err)} {d_err[:2]}", flush=True)
        finally:
            direct.terminate()
            direct.wait(10)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_root)], cwd=ROOT, check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0
