"""The demo: Ballast's main job on the embedded default, end to end.

``python -m ballast.demo`` migrates, creates a demo renter and a demo machine,
starts the coordinator (uvicorn), Celery (worker + beat) and one agent running
SmolLM2-135M-Instruct through llama.cpp, sends a real chat request with the
official ``openai`` client, prints the streamed answer, then keeps running with
the URL and the demo API key printed until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from openai import OpenAI

from ballast.stack import ROOT, Stack, last_line, manage

MODEL = "smollm2-135m-instruct"
QUESTION = "What is 2+2?"
CANARIES_CALIBRATED = (
    "from jobs.models import CanaryPrompt; "
    "print('calibrated' if CanaryPrompt.objects.filter(status='calibrated').exists() else 'none')"
)


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m ballast.demo")
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("BALLAST_DEMO_PORT", "8000"))
    )
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument(
        "--exit", action="store_true", help="stop after the demo request"
    )
    args = parser.parse_args(argv)

    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "ballast.settings")
    # a developer's machine (ballast/settings/base.py)
    env.setdefault("BALLAST_DEV", "1")
    # one machine's checks: a small spot-check pool, so the beat's calibration
    # does not take a core from the agent for long
    env.setdefault("BALLAST_CANARY_POOL_AHEAD", "20")
    var = Path(env.get("BALLAST_VAR_DIR", ROOT / "var"))
    with Stack(env=env, log_dir=var / "logs", port=args.port) as stack:
        print("migrating the database and loading the catalog ...", flush=True)
        stack.migrate()
        if "calibrated" not in manage("shell", "-c", CANARIES_CALIBRATED, env=env):
            print(
                "calibrating spot-check canaries on the reference model ...", flush=True
            )
            print(
                last_line(manage("canary_calibrate", MODEL, "--count", "4", env=env)),
                flush=True,
            )
        api_key = last_line(
            manage("renter_create", "demo@example.com", "--credit-up-to", "5", env=env)
        )
        token = last_line(
            manage(
                "machine_create",
                "host@example.com",
                f"demo-rig-{int(time.time())}",
                env=env,
            )
        )
        print(f"starting the coordinator on {stack.url} ...", flush=True)
        stack.start_coordinator()
        stack.start_celery()
        print(
            "starting an agent with SmolLM2-135M-Instruct (llama.cpp) ...", flush=True
        )
        stack.start_agent("agent", token)
        stack.wait_for_capacity(api_key, MODEL)

        client = OpenAI(base_url=stack.url + "/v1", api_key=api_key)
        print(f"\nrenter> {args.question}\nmodel > ", end="", flush=True)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": args.question}],
            temperature=0,
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
            if chunk.usage:
                usage = chunk.usage
        print()
        if usage:
            print(f"({usage.completion_tokens} tokens billed)")
        print(
            f"\nBallast is running at {stack.url}\n"
            f"  OpenAI base URL: {stack.url}/v1\n"
            f"  demo API key:    {api_key}\n"
            f"  logs:            {stack.log_dir}\n"
            "Try:\n"
            f"  curl -N {stack.url}/v1/chat/completions -H 'Authorization: Bearer {api_key}' "
            "-H 'Content-Type: application/json' "
            f'-d \'{{"model": "{MODEL}", "stream": true, '
            '"messages": [{"role": "user", "content": "Say hello"}]}\''
            + ("" if args.exit else "\nPress Ctrl-C to stop."),
            flush=True,
        )
        if args.exit:
            return 0
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while stack.processes["coordinator"].poll() is None:
                for name, process in list(stack.processes.items()):
                    if process.poll() is not None and name != "coordinator":
                        # a host vanishing is what Ballast survives: say so, keep serving
                        print(
                            f"{name} exited ({process.returncode}); restarting it",
                            flush=True,
                        )
                        stack.kill(
                            name
                        )  # its whole process group (beat with the worker)
                        if name == "agent":
                            stack.start_agent("agent", token)
                        else:
                            stack.start_celery()
                time.sleep(1)
            print(
                "the coordinator exited; see " + str(stack.log_dir / "coordinator.log")
            )
        except KeyboardInterrupt:
            pass
        print("stopping ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
