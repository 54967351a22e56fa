"""A scripted host that speaks ``ballast.host.v1`` through ``WebsocketCommunicator``.

A legitimate test double for the coordinator's side of the protocol: it drives
the real ASGI application and signs real receipts, and fails on purpose where a
test tells it to.
"""

from __future__ import annotations

import asyncio
import base64

from channels.testing import WebsocketCommunicator
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ballast.asgi import application
from billing.receipts import challenge_message, receipt_message
from jobs.tokens import token_count

MODEL = "smollm2-135m-instruct"


class HostSim:
    """One simulated machine with one device (index 0)."""

    def __init__(
        self,
        token: str,
        *,
        name: str = "Sim GPU",
        vram_total_mb: int = 24576,
        features: tuple[str, ...] = (),
        verifies: bool = False,
    ) -> None:
        """``features``: what its ``hello`` declares its engine does beyond
        text (``json_schema``, ``logprobs``, …; none by default);
        ``verifies``: its ``hello`` says it scores answers (``verify`` offers)."""
        self.machine_token = token
        self.features = list(features)
        self.verifies = verifies
        self.key = Ed25519PrivateKey.generate()
        self.name = name
        self.vram_total_mb = vram_total_mb
        self.sent_text: dict[str, str] = {}
        self.ws: WebsocketCommunicator | None = None
        self.nonce = ""  # the connection's challenge

    @property
    def public_key(self) -> str:
        raw = self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    async def connect(self, *, hello: bool = True) -> dict | None:
        """Open the host websocket, read its ``challenge`` and (with ``hello``)
        say a signed ``hello``; return the ``welcome``."""
        self.ws = WebsocketCommunicator(
            application,
            "/ws/host/",
            headers=[(b"authorization", f"Bearer {self.machine_token}".encode())],
            subprotocols=["ballast.host.v1"],
        )
        connected, _ = await self.ws.connect()
        assert connected, "host websocket refused"
        challenge = await self.recv()
        assert challenge["type"] == "challenge", challenge
        self.nonce = challenge["nonce"]
        if hello:
            await self.send(self.hello_frame())
            welcome = await self.recv()
            assert welcome["type"] == "welcome", welcome
            return welcome
        return None

    def proof(self, nonce: str | None = None, key=None) -> str:
        """The hello's proof: ``nonce`` (the connection's) signed with ``key``
        (this host's), over this host's announced public key."""
        message = challenge_message(
            self.nonce if nonce is None else nonce, self.public_key
        )
        return base64.b64encode((key or self.key).sign(message)).decode()

    def hello_frame(self, **overrides) -> dict:
        """A ``hello`` of this host with its proof; ``overrides`` replace fields
        (``proof=None`` leaves it out, as an agent of before the challenge)."""
        frame = {
            "type": "hello",
            "agent_version": "sim-1",
            "engine": {"name": "scripted", "version": "1"},
            "public_key": self.public_key,
            "accepts_serverless": True,
            "features": self.features or None,
            "verifies": True if self.verifies else None,
            "devices": [
                {"index": 0, "name": self.name, "vram_total_mb": self.vram_total_mb}
            ],
            "proof": self.proof(),
        }
        frame.update(overrides)
        return {k: v for k, v in frame.items() if v is not None}

    async def heartbeat(
        self,
        *,
        slots: int = 1,
        models=(MODEL,),
        temp_c=50.0,
        vram_free_mb=8000,
        paused=False,
    ) -> None:
        await self.send(
            {
                "type": "heartbeat",
                "paused": paused,
                "devices": [
                    {
                        "index": 0,
                        "temp_c": temp_c,
                        "vram_free_mb": vram_free_mb,
                        "loaded_models": list(models),
                        "slots": slots,
                    }
                ],
            }
        )

    async def send(self, frame: dict) -> None:
        await self.ws.send_json_to(frame)

    async def recv(self, timeout: float = 5) -> dict:
        return await self.ws.receive_json_from(timeout=timeout)

    async def errors_within(self, seconds: float) -> list[dict]:
        """The ``error`` frames that arrive within ``seconds`` (other frames,
        such as a repeated ``cancel``, are skipped). Waits with
        ``receive_nothing``: a receive that times out would end the connection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        errors = []
        while (left := deadline - loop.time()) > 0:
            if await self.ws.receive_nothing(timeout=min(left, 0.05)):
                continue
            frame = await self.recv()
            if frame["type"] == "error":
                errors.append(frame)
        return errors

    async def recv_type(self, kind: str, timeout: float = 5) -> dict:
        """Receive frames until one of ``kind`` arrives (errors are skipped)."""
        while True:
            frame = await self.recv(timeout)
            if frame["type"] == kind:
                return frame

    async def claim(self, job: str) -> None:
        await self.send({"type": "claim", "job": job})

    async def token(self, job: str, text: str, **extra) -> None:
        """A ``token`` frame of ``text`` (``extra``: more fields, as ``logprobs``)."""
        self.sent_text[job] = self.sent_text.get(job, "") + text
        await self.send({"type": "token", "job": job, "text": text, **extra})

    def receipt(self, job: str, completion_tokens: int) -> str:
        message = receipt_message(job, completion_tokens, self.sent_text.get(job, ""))
        return base64.b64encode(self.key.sign(message)).decode()

    async def done(
        self,
        job: str,
        completion_tokens: int,
        *,
        receipt: str | None = None,
        finish_reason: str = "stop",
    ) -> None:
        await self.send(
            {
                "type": "done",
                "job": job,
                "finish_reason": finish_reason,
                "usage": {"prompt_tokens": 10, "completion_tokens": completion_tokens},
                "receipt": self.receipt(job, completion_tokens)
                if receipt is None
                else receipt,
            }
        )

    async def cancelled(
        self, job: str, completion_tokens: int | None = None, *, receipt=None
    ) -> None:
        """Answer a ``cancel`` as the reference agent does: the usage and a
        receipt over the text this host sent for ``job`` (counted by the
        tokenizer unless ``completion_tokens`` says otherwise)."""
        text = self.sent_text.get(job, "")
        if completion_tokens is None:
            completion_tokens = token_count(MODEL, text) if text else 0
        await self.send(
            {
                "type": "cancelled",
                "job": job,
                "usage": {"prompt_tokens": 10, "completion_tokens": completion_tokens},
                "receipt": self.receipt(job, completion_tokens)
                if receipt is None
                else receipt,
            }
        )

    async def answer(
        self,
        offer: dict,
        pieces: list[str],
        tokens: int | None = None,
        *,
        finish_reason: str = "stop",
    ) -> None:
        """Claim an offer and stream ``pieces`` then a signed ``done`` (ending
        with ``finish_reason``).

        An honest host reports the tokenizer's count of its text unless ``tokens``
        says otherwise.
        """
        job = offer["job"]
        await self.claim(job)
        for piece in pieces:
            await self.token(job, piece)
        if tokens is None:
            tokens = token_count(MODEL, "".join(pieces))
        await self.done(job, tokens, finish_reason=finish_reason)

    def scores_frame(
        self, verify: dict, tokens: list[dict], *, receipt: str | None = None
    ) -> dict:
        """The ``scores`` answer to a ``verify`` frame: ``tokens`` (hand-built
        token scores, as a scripted verifier's), usage, and a receipt signed
        over the verification's id, their count and the answer's text (or
        ``receipt``)."""
        if receipt is None:
            message = receipt_message(verify["job"], len(tokens), verify["answer"])
            receipt = base64.b64encode(self.key.sign(message)).decode()
        return {
            "type": "scores",
            "job": verify["job"],
            "tokens": tokens,
            "usage": {"prompt_tokens": 10, "completion_tokens": len(tokens)},
            "receipt": receipt,
        }

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.disconnect()
