"""Continuations at temperature 0: is prefix + continuation the uninterrupted answer?

Usage: ``.venv/bin/python bench/continuation.py [--max-tokens 32] [--every 6]``

SmolLM2-135M-Instruct on this CPU. For each prompt the in-process engine
(``llamacpp``) answers once; that answer is cut every ``--every`` characters
(most cuts fall inside a word), and each prefix is continued by

* ``llamacpp``: the in-process engine (token healing);
* ``llamacpp-server``: llama-cpp-python's server (``python -m llama_cpp.server``,
  started here on 127.0.0.1) through the ``llamacpp-server`` engine (text healing);
* ``server unhealed``: the same server sent the whole prefix as is (the baseline
  in the same run: what a raw completion does without healing).

A continuation is exact when prefix + continuation and the uninterrupted answer
agree over the shorter of the two. Also counted: the server's fresh answers equal
to the in-process engine's. Prints the machine and the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine_line  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPTS = (
    "Explain photosynthesis briefly.",
    "Describe the sea in two sentences.",
    "Give three tips for sleeping well.",
)


def server_start(log: Path) -> tuple[subprocess.Popen, str]:
    """llama-cpp-python's server with SmolLM2 on a free port; waits until it answers."""
    import httpx

    from agent.engines.llamacpp import smollm2_gguf_path

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf_path()),
         "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(port),
         "--n_ctx", "2048"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a separate process: poll, bounded
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.terminate()
    raise TimeoutError("llama_cpp.server did not start")


async def measure(url: str, max_tokens: int, every: int) -> dict[str, int]:
    from agent.engines.base import GenerationRequest, GenerationResult
    from agent.engines.llamacpp import LlamaCppEngine
    from agent.engines.openai_server import LlamaCppServerEngine

    class Unhealed(LlamaCppServerEngine):
        async def stream(self, request, result):
            async for piece in self._answer(request, request.continue_from, result, ""):
                yield piece

    engines = {
        "llamacpp": LlamaCppEngine(),
        "llamacpp-server": LlamaCppServerEngine(base_url=url),
        "server unhealed": Unhealed(base_url=url),
    }
    for engine in engines.values():
        await engine.load()

    async def answer(name: str, messages, prefix: str = "") -> str:
        request = GenerationRequest(
            model=MODEL,
            messages=messages,
            params={"temperature": 0, "max_tokens": max_tokens},
            continue_from=prefix,
        )
        result = GenerationResult()
        return "".join([p async for p in engines[name].stream(request, result)])

    counts = dict.fromkeys(("cuts", "fresh equal", *engines), 0)
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        full = await answer("llamacpp", messages)
        counts["fresh equal"] += await answer("llamacpp-server", messages) == full
        for cut in range(4, len(full) - 4, every):
            prefix = full[:cut]
            counts["cuts"] += 1
            for name in engines:
                whole = prefix + await answer(name, messages, prefix)
                counts[name] += whole.startswith(full) or full.startswith(whole)
        print(f"after {prompt!r}: {counts}", flush=True)
    for engine in engines.values():
        await engine.close()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--every", type=int, default=6, help="characters between cuts")
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    print(
        f"settings: SmolLM2-135M-Instruct Q4_1, temperature 0, {len(PROMPTS)} prompts, "
        f"answers of {args.max_tokens} tokens, a cut every {args.every} characters"
    )
    with tempfile.TemporaryDirectory() as scratch:
        process, url = server_start(Path(scratch) / "server.log")
        try:
            counts = asyncio.run(measure(url, args.max_tokens, args.every))
        finally:
            process.terminate()
            process.wait(timeout=30)
    cuts = counts.pop("cuts")
    fresh = counts.pop("fresh equal")
    print(f"fresh answers equal to the in-process engine's: {fresh}/{len(PROMPTS)}")
    for name, exact in counts.items():
        print(f"{name:16s} exact continuations {exact}/{cuts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
