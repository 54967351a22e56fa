"""``verify`` offers: score another host's answer by prefill and answer ``scores``
(DESIGN.md "Verifying real answers"; docs/protocol-notes.md, 2026-12-03).

A verify offer claims no slot and sends no ``claim``, ``token`` or ``done``: the
engine scores under its lock between generations, off the event loop, and the
session answers one ``scores`` frame (or an ``error`` naming what is wrong).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed

from agent.engines.base import GenerationRequest
from agent.frames import MAX_MESSAGE_CHARS, request_from_verify
from agent.receipts import receipt_sign

if TYPE_CHECKING:
    from agent.session import Session

log = logging.getLogger(__name__)

async def verify_handle(session: Session, frame: dict[str, Any]) -> None:
    """Start scoring a ``verify`` frame's answer (a task of the session, ended
    with it), or refuse it at once with an ``error`` frame: malformed (naming
    the field), a model not loaded here, an engine that cannot score."""
    agent = session.agent
    job = frame.get("job")
    if not isinstance(job, str) or not job:
        log.warning("ignoring a verify without a job id")
        return
    try:
        request, answer, token_ids = request_from_verify(frame, agent.config.device)
        loaded = agent.engine.loaded_models()
        if request.model not in loaded:
            raise ValueError(
                f"model {request.model} is not loaded here (loaded: {loaded})"
            )
        if not agent.engine.verifies:
            raise ValueError(f"engine {agent.engine.name} cannot score answers")
    except ValueError as exc:
        log.warning("verify %s refused: %s", job, exc)
        await session.send({"type": "error", "job": job, "message": str(exc)})
        return
    task = asyncio.create_task(
        _scores_send(session, job, request, answer, token_ids), name=f"verify-{job}"
    )
    session.answers.add(task)
    task.add_done_callback(session.answers.discard)


async def _scores_send(
    session: Session,
    job: str,
    request: GenerationRequest,
    answer: str,
    token_ids: list[int] | None,
) -> None:
    """Score ``answer`` (its ``token_ids`` when the frame gave them) and send ``scores``: one entry per scored token,
    ``usage`` (the prompt's tokens, ``completion_tokens`` = the entries) and a
    receipt over job, that count and the answer's text; ``error`` when the
    engine fails."""
    agent = session.agent
    try:
        scored = await agent.engine.score(request, answer, token_ids)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        message = (str(exc) or type(exc).__name__)[:MAX_MESSAGE_CHARS]
        log.warning("verify %s failed: %s", job, message)
        with contextlib.suppress(ConnectionClosed):
            await session.send({"type": "error", "job": job, "message": message})
        return
    count = len(scored.tokens)
    with contextlib.suppress(ConnectionClosed):
        await session.send(
            {
                "type": "scores",
                "job": job,
                "tokens": [token.frame() for token in scored.tokens],
                "usage": {
                    "prompt_tokens": int(scored.prompt_tokens),
                    "completion_tokens": count,
                },
                "receipt": receipt_sign(agent.key, job, count, answer),
            }
        )
    log.info("verify %s scored: %d tokens", job, count)
