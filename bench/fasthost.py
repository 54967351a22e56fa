"""``FastHost``: a simulated machine speaking ``ballast.host.v1`` over a real
websocket, claiming every offer and pushing tokens as fast as asked.

Every token is ``WORD`` (one model token: the coordinator's ``max_tokens`` cut and
token recount see exactly one token per token); the host keeps each token's send
time beside the text (``FastHost.sent``: stream id -> ``perf_counter_ns`` per
token, CLOCK_MONOTONIC: comparable across processes on one machine). The stream id
is the last word of the renter's prompt, which the offer carries
(``bench.harness.stream_id``). Receipts are real Ed25519 signatures.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json

from bench.harness import MODEL, WORD, model_weights, now_ns, stream_id


class FastHost:
    """One simulated machine (one device, ``slots`` slots) over a real websocket.

    Claims every offer at once. ``gate`` (an asyncio.Event) holds token pushing
    until set (so a run can start all its streams first); each offer then gets
    ``tokens`` tokens (``WORD`` each) in frames of ``per_frame`` tokens, ``pace_s``
    apart (0: as fast as the socket takes them), then ``done``. The send time of
    every token (ns, ``perf_counter_ns``; the tokens of one frame share it) is kept in
    ``sent[stream id]``, the stream id being the last word of the offer's prompt: the
    renter's k-th token is the host's k-th, so latency = receipt − ``sent[id][k]``.
    """

    def __init__(self, ws_url: str, token: str, *, slots: int, tokens: int = 10,
                 per_frame: int = 1, pace_s: float = 0.0, gate: asyncio.Event | None = None):
        self.ws_url = ws_url
        self.token = token
        self.slots = slots
        self.tokens = tokens
        self.per_frame = per_frame
        self.pace_s = pace_s
        self.gate = gate
        self.offers = 0
        self.sent: dict[str, list[int]] = {}
        self.claimed = asyncio.Event()
        self.ws = None
        self.heartbeat_s = 10.0
        self.tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()
        self.weights = model_weights()  # the pinned file's: it gets work
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        # Derived from the token: the same machine keeps its pinned key across runs.
        self.key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(token.encode()).digest())

    @property
    def public_key(self) -> str:
        import base64

        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def receipt(self, job: str, tokens: int, text: str) -> str:
        """A real receipt (PROTOCOL.md §2), so the coordinator's check does its full work."""
        import base64

        digest = hashlib.sha256(text.encode()).hexdigest()
        message = f"ballast-receipt/v1\n{job}\n{tokens}\n{digest}".encode()
        return base64.b64encode(self.key.sign(message)).decode()

    async def send(self, frame: dict) -> None:
        async with self._lock:
            await self.ws.send(json.dumps(frame))

    def heartbeat_frame(self) -> dict:
        return {"type": "heartbeat", "paused": False, "devices": [
            {"index": 0, "temp_c": 50, "vram_free_mb": 20000, "loaded_models": [MODEL],
             "weights": {MODEL: self.weights}, "slots": self.slots}]}

    async def connect(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.ws_url, additional_headers={"Authorization": f"Bearer {self.token}"},
                                subprotocols=["ballast.host.v1"], max_size=None, open_timeout=60)
        nonce = json.loads(await self.ws.recv())["nonce"]  # the challenge
        proof = self.key.sign(f"ballast-hello/v1\n{nonce}\n{self.public_key}".encode())
        await self.send({"type": "hello", "agent_version": "bench-1",
                         "engine": {"name": "benchsim", "version": "1"},
                         "public_key": self.public_key, "accepts_serverless": True,
                         "proof": base64.b64encode(proof).decode(),
                         "devices": [{"index": 0, "name": "Bench GPU", "vram_total_mb": 24576}]})
        while (welcome := json.loads(await self.ws.recv()))["type"] != "welcome":
            pass
        # as the agent does: every ``heartbeat_interval_s`` the coordinator asks for
        self.heartbeat_s = float(welcome.get("heartbeat_interval_s") or 10)
        await self.send(self.heartbeat_frame())
        self.tasks.add(asyncio.create_task(self._serve()))
        self.tasks.add(asyncio.create_task(self._heartbeats()))

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self.send(self.heartbeat_frame())

    async def _serve(self) -> None:
        async for raw in self.ws:
            frame = json.loads(raw)
            if frame["type"] == "offer":
                self.offers += 1
                task = asyncio.create_task(self._job(frame["job"], stream_id(frame)))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _job(self, job: str, stream: str) -> None:
        await self.send({"type": "claim", "job": job})
        if self.gate is not None:
            await self.gate.wait()
        sent = 0
        pieces: list[str] = []
        times = self.sent.setdefault(stream, [])
        while sent < self.tokens:
            n = min(self.per_frame, self.tokens - sent)
            text = WORD * n
            pieces.append(text)
            times.extend([now_ns()] * n)
            await self.send({"type": "token", "job": job, "text": text})
            sent += n
            if self.pace_s:
                await asyncio.sleep(self.pace_s)
        await self.send({"type": "done", "job": job, "finish_reason": "stop",
                         "usage": {"prompt_tokens": 1, "completion_tokens": sent},
                         "receipt": self.receipt(job, sent, "".join(pieces))})

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.ws is not None:
            await self.ws.close()
