"""Running fuzzed ``ballast.host.v1`` programs (``tests.fuzz.host_frames``) on a
connected machine of the real ASGI application while an honest machine streams
an answer to a renter. Shared by ``tests/fuzz/test_host_frames.py`` (bounded) and
``bench/fuzz.py host`` (longer).

Each example: a renter's request pinned to the honest machine (its region) is
offered and claimed, then the fuzzing machine connects and sends its program,
one frame at a time, the honest machine sending a piece of its answer after
each. Every frame is followed by a marker (a frame of an unknown type, always
answered with an ``error``), so the answers to each frame are known exactly.
What must hold, each example (``Breach`` otherwise):

* the honest renter gets the exact whole answer, ``[DONE]``, billed once for
  exactly its tokens, one attempt, no failover;
* the coordinator logs no error (nothing at ERROR, on any logger) and the
  fuzzing connection never dies of an exception;
* each frame gets at most one ``error``; what docs/protocol-notes.md says is
  refused (binary or oversized frames, invalid JSON, not an object, an unknown
  type, anything before ``hello``, a claim/token/done/cancelled for an attempt
  not offered to this machine) gets exactly one; an ``error`` frame naming
  another's attempt gets none; the connection is closed only after a ``hello``,
  with 4403 or 4426;
* a request the fuzzing machine was offered ends cleanly (200, 502, 503, 504);
  the system settles (no job open, no slot held) and the ledger balances.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.utils import timezone

from tests.hostsim import HostSim
from tests.jobs.helpers import (
    chat_request,
    heartbeat_applied,
)

from .host_checks import (
    HONEST_PIECES,
    Breach,
    honest_answer_checked,
    own_answer_checked,
    settled,
    tokens,
)
from .host_frames import MAX_FRAME_BYTES, OTHER, OWN, RECEIPT, Hello, Raw, Ref
from .host_frames import RenterRequest as RenterRequestAction

KNOWN_TYPES = {
    "hello",
    "heartbeat",
    "model_load_failed",
    "benchmark",
    "claim",
    "token",
    "done",
    "error",
    "cancelled",
}
ANSWERED_WHEN_STRAY = {"claim", "token", "done", "cancelled"}
CLOSE_AFTER_HELLO = {4403, 4426}
REPLY_TIMEOUT_S = 20.0


class ErrorRecords(logging.Handler):
    """Keeps every log record at ERROR or above (any logger)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class World:
    """The run's fixed parts: the honest machine (connected, live, in region
    ``eu``), the fuzzing machine's token and pinned key (region ``us-west``),
    the renter's key, the error records, and counts of what was sent and seen."""

    honest: HostSim
    fuzz_token: str
    fuzz_key: Ed25519PrivateKey
    api_key: str
    log: ErrorRecords
    counts: Counter = field(default_factory=Counter)


async def world_open(*, machine_token, api_key: str) -> World:
    """Register both machines (``machine_token``: the tests' factory), connect the
    honest one live and pin the fuzzing one's key with one honest hello."""
    honest_machine, honest_token = await database_sync_to_async(machine_token)(
        "honest", region="eu"
    )
    _, fuzz_token = await database_sync_to_async(machine_token)("fuzz", region="us-west")
    honest = HostSim(honest_token, name="Honest GPU")
    await honest.connect()
    await honest.heartbeat()
    await heartbeat_applied(honest_machine)
    pin = HostSim(fuzz_token, name="Fuzz GPU")
    await pin.connect()
    await pin.close()
    log = ErrorRecords()
    logging.getLogger().addHandler(log)
    return World(honest, fuzz_token, pin.key, api_key, log)


async def world_close(world: World) -> None:
    logging.getLogger().removeHandler(world.log)
    await world.honest.close()


@dataclass
class Fuzzing:
    """One example's fuzzing connection and what it has seen."""

    host: HostSim
    other: str  # the honest machine's attempt
    greeted: bool = False
    closed: int | None = None
    own: str | None = None  # the last attempt offered to this machine
    offered: set[str] = field(default_factory=set)
    marker: int = 0


async def example_run(world: World, program: list) -> None:
    """Run one program (see the module doc); raises Breach. Whatever happens,
    its requests and its connection end before it returns, so the next
    example starts from a quiet system."""
    errors_before = len(world.log.records)
    honest = world.honest
    await _drain(honest)
    await honest.heartbeat()
    request = chat_request(
        world.api_key, content="fuzz", placement={"region": "eu"}
    )
    fuzz = own_request = None
    try:
        offer = await honest.recv(timeout=REPLY_TIMEOUT_S)
        if offer["type"] != "offer":
            raise Breach(f"the honest machine was sent {offer}, not its offer")
        attempt = offer["job"]
        await honest.claim(attempt)
        pieces = list(HONEST_PIECES)
        await honest.token(attempt, pieces.pop(0))
        fuzz = Fuzzing(HostSim(world.fuzz_token, name="Fuzz GPU"), other=attempt)
        fuzz.host.key = world.fuzz_key
        await fuzz.host.connect(hello=False)
        for action in program:
            if fuzz.closed is not None:
                break
            if isinstance(action, RenterRequestAction):
                if own_request is None:
                    own_request = await _own_request(world, fuzz)
                continue
            world.counts[type(action).__name__] += 1
            await _send_checked(world, fuzz, action)
            if pieces:
                await honest.token(attempt, pieces.pop(0))
        for piece in pieces:
            await honest.token(attempt, piece)
        await honest.done(attempt, tokens("".join(HONEST_PIECES)))
        await honest_answer_checked(await asyncio.wait_for(request, REPLY_TIMEOUT_S))
        await fuzz.host.ws.disconnect()  # raises what the connection died of
        fuzz = None
        if own_request is not None:
            await own_answer_checked(
                world.counts, await asyncio.wait_for(own_request, 60)
            )
        await settled()
        if not await honest.ws.receive_nothing(timeout=0.02):
            raise Breach(f"the honest machine was sent {await honest.recv()}")
    finally:
        await _abandoned(request, own_request, fuzz)
    fresh = [r for r in world.log.records[errors_before:] if not _designed(r)]
    if fresh:
        raise Breach(
            "the coordinator logged an error: "
            + "; ".join(f"{r.name}: {r.getMessage()}" for r in fresh[:3])
        )


def _designed(record: logging.LogRecord) -> bool:
    """Django's request log of a response the completions answer by design (a
    502/503/504 of PROTOCOL.md §1), which it writes at ERROR like any 5xx."""
    return record.name == "django.request" and getattr(record, "status_code", None) in (
        502,
        503,
        504,
    )


async def _abandoned(request, own_request, fuzz: Fuzzing | None) -> None:
    """After a breach: cancel the requests still running, close the fuzzing
    connection, wait for the system to settle (a breach is already raised)."""
    leftovers = [t for t in (request, own_request) if t is not None and not t.done()]
    if not leftovers and fuzz is None:
        return
    for task in leftovers:
        task.cancel()
    for task in leftovers:
        with contextlib.suppress(BaseException):
            await task
    if fuzz is not None:
        with contextlib.suppress(BaseException):
            await fuzz.host.ws.disconnect()
    with contextlib.suppress(BaseException):
        await settled()


async def _own_request(world: World, fuzz: Fuzzing) -> asyncio.Task:
    """Start a request only the fuzzing machine can take; when its heartbeat made
    it live, wait (up to 2 s) for the offer, so its next frames can name it."""
    from hosts.liveness import live_q
    from hosts.models import Machine

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 2.0
    while loop.time() < deadline and fuzz.greeted:
        if await Machine.objects.filter(
            live_q(timezone.now()), region="us-west", devices__slots_total__gt=0
        ).aexists():
            break
        await asyncio.sleep(0.02)
    task = chat_request(world.api_key, content="mine", placement={"region": "us-west"})
    while loop.time() < deadline and fuzz.own is None and fuzz.closed is None:
        fuzz.marker += 1
        await _answers(fuzz, f"zz_marker_{fuzz.marker}")
        if fuzz.own is None:
            await asyncio.sleep(0.02)
    return task


async def _drain(host: HostSim) -> None:
    """Skip what the honest machine was sent after an example that failed (a
    cancel of its abandoned attempt): each example starts from a quiet
    connection."""
    while not await host.ws.receive_nothing(timeout=0.02):
        await host.recv()


# --- one frame --------------------------------------------------------------------
async def _send_checked(world: World, fuzz: Fuzzing, action) -> None:
    """Send ``action``, then a marker; check the answers to it (module doc)."""
    ws = fuzz.host.ws
    if isinstance(action, Hello):
        text = json.dumps(_hello(world, fuzz, action))
    elif isinstance(action, Raw) and action.binary is not None:
        text = None
    elif isinstance(action, Raw):
        text = action.text
    else:
        text = json.dumps(_filled(fuzz, action.template), allow_nan=True)
    # (not ``send_to``: it refuses an empty message, which a host may send)
    if text is None:
        await ws.send_input({"type": "websocket.receive", "bytes": action.binary})
    else:
        await ws.send_input({"type": "websocket.receive", "text": text})
    expected = _refusal(text, fuzz.greeted)
    frame = _decoded(text)
    kind = frame.get("type") if isinstance(frame, dict) else None
    fuzz.marker += 1
    marker = f"zz_marker_{fuzz.marker}"
    answers = await _answers(fuzz, marker)
    errors = [a["message"] for a in answers if a.get("type") == "error"]
    world.counts["errors answered"] += len(errors)
    what = f"{(text or repr(action.binary))[:200]!r}"
    if fuzz.closed is not None:
        world.counts[f"closed {fuzz.closed}"] += 1
        if kind != "hello" or fuzz.closed not in CLOSE_AFTER_HELLO:
            raise Breach(f"the connection closed with {fuzz.closed} after {what}")
        return
    if len(errors) > 1:
        raise Breach(f"{len(errors)} errors answered {what}: {errors}")
    if (
        expected is not None
        and errors != [expected]
        and not (errors and errors[0].startswith(expected))
    ):
        raise Breach(f"{what} was answered {errors}, not {expected!r}")
    job = frame.get("job") if isinstance(frame, dict) else None
    stray = fuzz.greeted and isinstance(job, str) and job not in fuzz.offered
    if expected is None and stray and kind in ANSWERED_WHEN_STRAY and not errors:
        raise Breach(f"{what} (not this machine's attempt) got no error")
    if expected is None and stray and kind == "error" and errors:
        raise Breach(f"{what} (another's attempt) was answered {errors}")


def _decoded(text: str | None):
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _refusal(text: str | None, greeted: bool) -> str | None:
    """The error docs/protocol-notes.md promise for this frame, whatever its
    fields (None when it depends on them)."""
    if text is None or len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
        return "frames must be JSON text of at most 256 KiB"
    frame = _decoded(text)
    if frame is None:
        return "frame is not valid JSON"
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        return "frame must be a JSON object with a string 'type'"
    if frame["type"] not in KNOWN_TYPES:
        return "unknown frame type"
    if not greeted and frame["type"] != "hello":
        return "send hello first"
    return None


async def _answers(fuzz: Fuzzing, marker: str) -> list[dict]:
    """Send ``marker`` and collect what comes back until its error (or the close):
    offers and welcomes update ``fuzz``."""
    ws = fuzz.host.ws
    await ws.send_to(text_data=json.dumps({"type": marker}))
    answers = []
    while True:
        output = await ws.receive_output(timeout=REPLY_TIMEOUT_S)
        if output["type"] == "websocket.close":
            fuzz.closed = output.get("code", 1000)
            return answers
        frame = json.loads(output["text"])
        if frame.get("type") == "error" and marker in frame.get("message", ""):
            return answers
        if frame.get("type") == "welcome":
            fuzz.greeted = True
        elif frame.get("type") == "offer":
            fuzz.own = frame["job"]
            fuzz.offered.add(frame["job"])
        answers.append(frame)


def _hello(world: World, fuzz: Fuzzing, hello: Hello) -> dict:
    host = fuzz.host
    if hello.proof == "none":
        frame = host.hello_frame(proof=None)
    elif hello.proof == "wrong":
        frame = host.hello_frame(proof=host.proof(nonce="another-challenge"))
    elif hello.proof in ("stranger", "honest"):
        signer = HostSim(world.fuzz_token, name=host.name)
        if hello.proof == "honest":
            signer.key = world.honest.key
        signer.nonce = host.nonce
        frame = signer.hello_frame()
    else:
        frame = host.hello_frame()
    for name, value in hello.fields:
        frame[name] = value
    return frame


def _filled(fuzz: Fuzzing, template):
    """``template`` with its ``Ref`` values filled in (module doc of host_frames)."""
    if isinstance(template, Ref):
        if template is OTHER:
            return fuzz.other
        if template is OWN:
            return fuzz.own or str(uuid.uuid4())
        return ""  # a receipt outside a frame of a job
    if isinstance(template, list):
        return [_filled(fuzz, item) for item in template]
    if not isinstance(template, dict):
        return template
    frame = {k: _filled(fuzz, v) for k, v in template.items() if v is not RECEIPT}
    job, text = frame.get("job"), frame.get("text")
    if frame.get("type") == "token" and isinstance(job, str) and isinstance(text, str):
        fuzz.host.sent_text[job] = fuzz.host.sent_text.get(job, "") + text
    if template.get("receipt") is RECEIPT:
        usage = frame.get("usage")
        count = usage.get("completion_tokens") if isinstance(usage, dict) else 0
        count = count if isinstance(count, int) and not isinstance(count, bool) else 0
        frame["receipt"] = fuzz.host.receipt(job if isinstance(job, str) else "", count)
    return frame
