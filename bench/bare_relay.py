"""The relay baseline: host websocket in, server-sent events out; no Django, no database.

``uvicorn bench.bare_relay:app`` speaks just enough of ``ballast.host.v1`` for the
benchmark's simulated hosts (challenge → hello → welcome, heartbeat → slots, offer →
claim, token, done; the hello's proof is not checked) and of ``POST
/v1/chat/completions`` for its renters: streamed, with the same chunk shape as
Ballast, or not (one ``chat.completion`` object with the whole text). A request
goes to the next host with a free slot (round robin); its tokens go through an
asyncio.Queue to the response.
"""

import asyncio
import itertools
import json
import secrets
import uuid

hosts: dict[int, dict] = {}  # id -> {"send", "lock", "free"}
jobs: dict[str, asyncio.Queue] = {}
turn = itertools.count()


async def host_ws(scope, receive, send):
    me = {"send": send, "lock": asyncio.Lock(), "free": 0}
    while True:
        event = await receive()
        if event["type"] == "websocket.connect":
            await send({"type": "websocket.accept", "subprotocol": "ballast.host.v1"})
            challenge = {"type": "challenge", "nonce": secrets.token_urlsafe(24)}
            await send({"type": "websocket.send", "text": json.dumps(challenge)})
        elif event["type"] == "websocket.disconnect":
            hosts.pop(id(me), None)
            return
        else:
            frame = json.loads(event["text"])
            kind = frame["type"]
            if kind == "token":
                jobs[frame["job"]].put_nowait(frame["text"])
            elif kind == "done":
                jobs[frame["job"]].put_nowait(None)
            elif kind == "hello":
                reply = {"type": "welcome", "machine_id": str(id(me)), "heartbeat_interval_s": 10}
                await send({"type": "websocket.send", "text": json.dumps(reply)})
            elif kind == "heartbeat" and id(me) not in hosts:
                me["free"] = frame["devices"][0]["slots"]
                hosts[id(me)] = me


async def chat(scope, receive, send):
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            break
    request = json.loads(body)
    free = [h for h in hosts.values() if h["free"] > 0]
    if not free:
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b"no host"})
        return
    host = free[next(turn) % len(free)]
    host["free"] -= 1
    job = str(uuid.uuid4())
    jobs[job] = queue = asyncio.Queue()
    offer = {"type": "offer", "job": job, "device": 0, "model": request["model"],
             "messages": request["messages"], "params": {}, "continue_from": ""}
    async with host["lock"]:
        await host["send"]({"type": "websocket.send", "text": json.dumps(offer)})
    try:
        if not request.get("stream"):
            await whole(send, job, request, queue)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-ballast-job-id", job.encode())]})
        while (text := await queue.get()) is not None:
            chunk = {"id": job, "object": "chat.completion.chunk", "model": request["model"],
                     "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            data = f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
            await send({"type": "http.response.body", "body": data.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
    finally:
        jobs.pop(job, None)
        host["free"] += 1


async def whole(send, job: str, request: dict, queue: asyncio.Queue) -> None:
    """A non-streamed answer: every token, then one ``chat.completion`` object."""
    pieces = []
    while (text := await queue.get()) is not None:
        pieces.append(text)
    body = {"id": job, "object": "chat.completion", "model": request["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(pieces)},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(pieces), "total_tokens": len(pieces) + 1}}
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"x-ballast-job-id", job.encode())]})
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


async def app(scope, receive, send):
    if scope["type"] == "websocket":
        await host_ws(scope, receive, send)
    elif scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
        await chat(scope, receive, send)
    elif scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
