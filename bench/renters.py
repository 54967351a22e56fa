"""Renter clients of the benchmarks: a streamed completion over SSE
(``sse_stream``) and over the renter websocket (``ws_stream``), each giving a
``StreamResult`` (timings, and the arrival of each token to compare with the
host's send times, ``bench.fasthost.FastHost.sent``).
"""

from __future__ import annotations

import json
import time

import httpx

from bench.harness import MODEL, WORD, now_ns, stream_id


class StreamResult:
    """What a renter saw of one stream: timings (perf_counter s) and token arrivals.

    ``arrivals`` holds one ``perf_counter_ns`` per token received (a chunk of k
    ``WORD``s counts k tokens, all arrived with the chunk; any other text counts 1).
    """

    def __init__(self, stream: str = "") -> None:
        self.stream = stream
        self.start = 0.0
        self.first = 0.0
        self.end = 0.0
        self.tokens = 0
        self.arrivals: list[int] = []
        self.error = ""

    def text_seen(self, text: str, at_ns: int) -> None:
        n = text.count(WORD) or (1 if text else 0)
        self.tokens += n
        self.arrivals.extend([at_ns] * n)

    def latencies(self, sent_ns: list[int]) -> list[float]:
        """Seconds from the host's send of token k to its arrival here, for every k."""
        return [(a - s) / 1e9 for a, s in zip(self.arrivals, sent_ns, strict=False)]


def chat_body(max_tokens: int = 1900, content: str = "hello") -> dict:
    return {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": content}]}


async def sse_stream(client: httpx.AsyncClient, url: str, key: str, body: dict) -> StreamResult:
    """POST a streamed completion and read its server-sent events to ``[DONE]``."""
    result = StreamResult(stream_id(body))
    result.start = time.perf_counter()
    async with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as resp:
        if resp.status_code != 200:
            result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            result.end = time.perf_counter()
            return result
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            at = now_ns()
            payload = line[6:]
            if payload == "[DONE]":
                continue  # read on to the response's end, as clients do: the connection is reused
            chunk = json.loads(payload)
            choices = chunk.get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            text = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
            if text:
                if not result.first:
                    result.first = time.perf_counter()
                result.text_seen(text, at)
            if choice.get("finish_reason") == "error":
                result.error = json.dumps(chunk.get("error"))[:200]
    result.end = time.perf_counter()
    return result


async def ws_stream(ws_url: str, key: str, body: dict) -> StreamResult:
    """Send one request on the renter websocket and read chunks until ``done``."""
    from websockets.asyncio.client import connect

    result = StreamResult(stream_id(body))
    result.start = time.perf_counter()
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"},
                       max_size=None, open_timeout=60) as ws:
        await ws.send(json.dumps(body))
        async for raw in ws:
            at = now_ns()
            message = json.loads(raw)
            if message.get("type") in ("done", "error"):
                if message.get("type") == "error":
                    result.error = json.dumps(message)[:200]
                break
            choices = message.get("choices") or []
            text = choices[0].get("delta", {}).get("content") if choices else None
            if text:
                if not result.first:
                    result.first = time.perf_counter()
                result.text_seen(text, at)
    result.end = time.perf_counter()
    return result
