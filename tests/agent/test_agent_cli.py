"""The command line, run as a real process against the fake coordinator."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from agent.client import ws_url_from_server

pytestmark = []

REPO = Path(__file__).resolve().parents[2]


async def agent_process(*args: str) -> asyncio.subprocess.Process:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("BALLAST_MACHINE_TOKEN", None)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _scripted_against(
    command: str, fake, tmp_path: Path, *extra: str
) -> asyncio.subprocess.Process:
    """``python -m agent COMMAND`` with the scripted engine against ``fake``."""
    return await agent_process(
        command,
        "--server",
        fake.url,
        "--token",
        fake.token,
        "--engine",
        "scripted",
        "--key-file",
        str(tmp_path / "key.pem"),
        *extra,
    )


async def _scripted_agent_offered(
    fake, tmp_path: Path, script: dict, params: dict
) -> asyncio.subprocess.Process:
    """``python -m agent run`` with the scripted engine against ``fake``, once
    connected sent the offer of job ``j`` (a raw prompt, ``params``)."""
    process = await _scripted_against(
        "run", fake, tmp_path, "--script", json.dumps(script)
    )
    try:
        await asyncio.wait_for(fake.connected.wait(), 60)
        await fake.send(
            {
                "type": "offer",
                "job": "j",
                "device": 0,
                "model": "smollm2-135m-instruct",
                "prompt": "count",
                "params": params,
                "continue_from": "",
            }
        )
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return process


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/host/"),
        ("https://ballast.example.com/", "wss://ballast.example.com/ws/host/"),
        ("https://example.com/prefix", "wss://example.com/prefix/ws/host/"),
        ("ws://127.0.0.1:8000/ws/host/", "ws://127.0.0.1:8000/ws/host/"),
    ],
)
def test_it_derives_the_websocket_address(server: str, expected: str) -> None:
    assert ws_url_from_server(server) == expected


def test_it_refuses_a_url_that_is_not_http() -> None:
    with pytest.raises(ValueError):
        ws_url_from_server("ftp://example.com")


@pytest.mark.asyncio
async def test_run_without_a_token_is_a_usage_error() -> None:
    process = await agent_process("run", "--server", "http://127.0.0.1:9")
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert b"BALLAST_MACHINE_TOKEN" in stderr


@pytest.mark.asyncio
async def test_die_at_kills_the_process_mid_stream(
    tmp_path: Path, coordinator_class
) -> None:
    """The scripted host sends 2 tokens, then exits with status 137."""
    async with coordinator_class() as fake:
        process = await _scripted_agent_offered(
            fake,
            tmp_path,
            {"mode": "die_at", "n": 2, "text": "one two three four"},
            params={},
        )
        try:
            await fake.expect("claim", job="j")
            assert (await fake.expect("token", job="j"))["text"] == "one"
            assert (await fake.expect("token", job="j"))["text"] == " two"
            assert await asyncio.wait_for(process.wait(), 30) == 137
            await asyncio.wait_for(fake.disconnected.wait(), 10)
            assert fake.frames.empty()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


@pytest.mark.asyncio
async def test_benchmark_prints_and_reports_the_figures(
    tmp_path: Path, coordinator_class
) -> None:
    async with coordinator_class() as fake:
        process = await _scripted_against(
            "benchmark",
            fake,
            tmp_path,
            "--name",
            "RTX 4090",
            "--kind",
            "gpu",
        )
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, stderr.decode()
        printed = json.loads(stdout.decode().strip().splitlines()[-1])
        frame = await fake.expect("benchmark")
        assert frame == {"type": "benchmark", **printed}
        assert frame["model"] == "smollm2-135m-instruct" and frame["device"] == 0
        assert frame["tokens_per_s"] > 0 and frame["ttft_ms"] >= 0
        assert fake.hellos[0]["devices"][0]["name"] == "RTX 4090"
        assert fake.hellos[0]["devices"][0]["kind"] == "gpu"  # as --kind says
        assert b"connected to ws://127.0.0.1:" in stderr


def test_the_agent_runs_on_uvloop_where_it_is_installed() -> None:
    """Cheaper wake-ups per offer and frame (docs/performance.md); asyncio's own
    loop where uvloop is missing (Windows hosts)."""
    import uvloop

    from agent.cli import _run_until_signal

    async def loop_kind() -> bool:
        return isinstance(asyncio.get_running_loop(), uvloop.Loop)

    assert _run_until_signal(loop_kind()) is True


async def _agent_streaming(
    fake, tmp_path: Path, pieces: int = 20
) -> asyncio.subprocess.Process:
    """An agent process mid-answer on job ``j`` (``pieces`` pieces, 50 ms
    apart), its claim and first token read."""
    process = await _scripted_agent_offered(
        fake,
        tmp_path,
        {"pieces": [f" w{i}" for i in range(pieces)], "delay_s": 0.05},
        params={"max_tokens": 1000},
    )
    await fake.expect("claim", job="j")
    assert (await fake.expect("token", job="j"))["text"] == " w0"
    return process


async def _paused_heartbeat(fake) -> None:
    while not (await fake.heartbeat())["paused"]:
        pass


@pytest.mark.asyncio
async def test_ctrl_c_takes_no_new_work_and_lets_the_running_job_finish(
    tmp_path: Path, coordinator_class
) -> None:
    """A host stopping its agent mid-answer: the heartbeat says paused at once
    (no new offers), the answer completes with its receipt (the host is paid,
    no death mid-stream on its score), then the process exits 0."""
    import signal

    async with coordinator_class() as fake:
        process = await _agent_streaming(fake, tmp_path)
        try:
            process.send_signal(signal.SIGINT)
            await _paused_heartbeat(fake)
            text, done = await fake.stream_collect("j")
            assert " w0" + text == "".join(f" w{i}" for i in range(20))
            assert done["finish_reason"] == "stop" and done["receipt"]
            assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


@pytest.mark.asyncio
async def test_a_second_ctrl_c_stops_at_once(tmp_path: Path, coordinator_class) -> None:
    import signal

    async with coordinator_class() as fake:
        process = await _agent_streaming(fake, tmp_path, pieces=400)  # 20 s
        try:
            process.send_signal(signal.SIGINT)
            await _paused_heartbeat(fake)
            process.send_signal(signal.SIGINT)
            assert await asyncio.wait_for(process.wait(), 30) == 0
            await asyncio.wait_for(fake.disconnected.wait(), 10)
            frames = []
            while not fake.frames.empty():
                frames.append(fake.frames.get_nowait())
            assert all(f["type"] == "token" for f in frames), "stopped: no done"
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "engine, exchanges_played",
    [
        ("ollama", ("tags", "version", "show", "load", "generate_stream", "generate_stream")),
        ("vllm", ("models", "version", "chat_stream", "chat_stream")),
    ],
)
async def test_the_engine_flags_drive_a_server_engine(engine, exchanges_played) -> None:
    """``--engine``, ``--engine-url``, ``--engine-model`` reach the engine: a
    benchmark (a warm-up and a measured answer) against the documented-exchange
    double of that server (Ollama and vLLM cannot run here)."""
    from .docserver import DocServer, exchanges

    with DocServer(exchanges(engine, *exchanges_played)) as double:
        extra = ["--engine-model", "smollm2:135m"] if engine == "ollama" else []
        process = await agent_process(
            "benchmark", "--engine", engine, "--engine-url", double.url, *extra,
            "--max-tokens", "8",
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, err.decode()
        figures = json.loads(out.decode().strip().splitlines()[-1])
        assert figures["model"] == "smollm2-135m-instruct"
        assert f"engine {engine} {engine}" in err.decode()  # "engine ollama ollama 0.5.1"
        assert len([r for r in double.requests if r[0] == "POST"]) >= 2
