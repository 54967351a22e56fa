"""Validation of renters' OpenAI-style request bodies (PROTOCOL.md §1).

``completion_request_parse`` turns a decoded JSON body into a
``CompletionRequest`` or raises ``ApiError(400)`` naming the bad field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from hosts.regions import region_codes
from modeldata.template import ChatTemplate

from .errors import ApiError
from .formats import logprobs_parse, response_format_parse, response_format_stored
from .schematext import json_text_checked
from .toolcalls.requests import (
    ToolRequest,
    message_tool_fields,
    messages_rendered,
    native_rendered,
    tool_results_checked,
    tools_parse,
)

# The bounds of a request (also the OpenAPI schema's: jobs.schema.completion_requests)
DEFAULT_MAX_TOKENS = 256
MAX_MAX_TOKENS = 8192
ROLES = {"system", "user", "assistant", "developer", "tool"}
MODEL_ID_MAX_CHARS = 100
STOP_MAX = 4  # stop sequences
TEMPERATURE_RANGE = (0, 2)
TOP_P_RANGE = (0, 1)
SEED_RANGE = (-(2**63), 2**63 - 1)  # inclusive
PLACEMENT_TEXT_FIELDS = ("gpu", "region", "rental")
PLACEMENT_TEXT_MAX_CHARS = 100
MIN_VRAM_GB_MAX = 4096


@dataclass
class CompletionRequest:
    """A checked request: model, chat ``messages`` or raw ``prompt``, sampling
    params. A chat request keeps its ``conversation`` (the checked messages,
    tool fields included) and ``tools``, which ``request_for_model`` renders
    in the model's own tool-call format once the model is known; until then
    ``messages`` and ``params`` hold the generic format's."""

    model: str
    endpoint: str
    messages: list[dict] | None
    prompt: str | None
    params: dict
    stream: bool
    include_usage: bool
    placement: dict = field(default_factory=dict)
    conversation: list[dict] | None = None
    tools: ToolRequest | None = None


def request_for_model(
    request: CompletionRequest, *, tool_call_format: str, template: ChatTemplate | None
) -> CompletionRequest:
    """``request`` as its model is sent it: a conversation with tools or
    calls, for a model whose catalog ``tool_call_format`` is served natively
    (``toolcalls.native``), becomes the ``prompt`` its own ``template``
    renders, its answer parsed and constrained in that format; any other
    request is returned as it is. Raises ApiError 400 when the template
    refuses the conversation."""
    if request.conversation is None:
        return request
    native = native_rendered(
        request.conversation,
        request.tools,
        tool_call_format=tool_call_format,
        template=template,
    )
    if native is None:
        return request
    params = dict(request.params)
    if native.format is not None:
        params["tool_format"] = native.format
        params["response_format"] = response_format_stored(native.response_format)
    return replace(request, messages=None, prompt=native.prompt, params=params)


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param)


def _text(value: str, param: str) -> str:
    """``value`` if it is storable text: valid UTF-8 (no lone surrogates), no
    NUL (``schematext.json_text_checked``)."""
    json_text_checked(value, param)
    return value


def _number(body: dict, name: str, lo: float, hi: float, default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not lo <= value <= hi
    ):
        raise _bad(name, f"'{name}' must be a number from {lo:g} to {hi:g}")
    return value


def _max_tokens(body: dict) -> int:
    """The completion budget: ``max_completion_tokens`` (OpenAI's newer name) or
    else ``max_tokens``, ``DEFAULT_MAX_TOKENS`` when both are absent or null.
    Each one given is checked, so a bad one is never silently ignored."""
    budget = DEFAULT_MAX_TOKENS
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 1 <= value <= MAX_MAX_TOKENS
        ):
            raise _bad(
                name,
                f"'{name}' must be an integer from 1 to {MAX_MAX_TOKENS}, and"
                " below the model's context_length (GET /v1/models)",
            )
        budget = value
    return budget


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", "'messages' must be a non-empty list")
    cleaned = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}]", f"'messages[{i}]' must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(
                f"messages[{i}].role",
                f"'messages[{i}].role' must be one of {sorted(ROLES)}",
            )
        content = message.get("content")
        tool_fields = message_tool_fields(message, i)
        if content is None and tool_fields.get("tool_calls"):
            content = ""  # an assistant's calls alone (OpenAI: content null)
        if isinstance(content, list):  # content parts: keep the text ones
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise _bad(
                        f"messages[{i}].content",
                        "only text content parts are supported",
                    )
                if not isinstance(part.get("text"), str):
                    raise _bad(
                        f"messages[{i}].content", "a text part needs a string 'text'"
                    )
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise _bad(
                f"messages[{i}].content", f"'messages[{i}].content' must be a string"
            )
        _text(content, f"messages[{i}].content")
        cleaned.append(
            {
                "role": "system" if role == "developer" else role,
                "content": content,
                **tool_fields,
            }
        )
    tool_results_checked(cleaned)
    return cleaned


# OpenAI request fields Ballast cannot honour, with the values that ask for
# nothing (what clients send by default): any other value is a 400, not a
# plain-text answer that silently ignored what was asked
UNSUPPORTED: dict[str, tuple] = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
}


def _unsupported_refused(body: dict) -> None:
    """Raise ApiError 400 naming the first field of ``UNSUPPORTED`` that asks
    for something (tools, echo, a suffix, …)."""
    for name, neutral in UNSUPPORTED.items():
        value = body.get(name)
        if not any(_same_value(value, ok) for ok in neutral):
            allowed = " or ".join(json.dumps(ok) for ok in neutral if ok is not None)
            raise _bad(
                name,
                f"'{name}' is not supported by Ballast"
                + (f" (only {allowed}, or leave it out)" if allowed else ""),
            )


def _same_value(value: Any, neutral: Any) -> bool:
    """JSON equality: 1 and 1.0 are the same number, but false is not 0."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return value == neutral
    return type(value) is type(neutral) and value == neutral


def _tools_constraint(tools, response_format: dict | None, endpoint: str):
    """The response format a request with ``tools`` is generated under: the
    tool-call format's constraint (none under ``tool_choice: "none"``: plain
    text, or the request's own ``response_format``). Chat only; a
    ``response_format`` beside a tool choice is a 400 (one constraint)."""
    if endpoint != "chat":
        raise _bad("tools", "'tools' is supported on /v1/chat/completions only")
    if tools.choice is None:
        return response_format
    if response_format is not None:
        raise _bad(
            "response_format",
            "'response_format' cannot be combined with 'tools' unless "
            "'tool_choice' is 'none'",
        )
    return tools.response_format


def _placement(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad("placement", "'placement' must be an object")
    unknown = set(value) - {*PLACEMENT_TEXT_FIELDS, "min_vram_gb"}
    if unknown:
        raise _bad(
            "placement", f"unknown placement field(s): {', '.join(sorted(unknown))}"
        )
    out: dict[str, Any] = {}
    for name in PLACEMENT_TEXT_FIELDS:
        if value.get(name) is not None:
            if (
                not isinstance(value[name], str)
                or not value[name]
                or len(value[name]) > PLACEMENT_TEXT_MAX_CHARS
            ):
                raise _bad(
                    f"placement.{name}",
                    f"'placement.{name}' must be a non-empty string",
                )
            out[name] = _text(value[name], f"placement.{name}")
    if "region" in out and out["region"] not in region_codes():
        raise _bad(
            "placement.region",
            "'placement.region' must be one of " + ", ".join(region_codes()),
        )
    if value.get("min_vram_gb") is not None:
        gb = value["min_vram_gb"]
        if (
            isinstance(gb, bool)
            or not isinstance(gb, (int, float))
            or not 0 <= gb <= MIN_VRAM_GB_MAX
        ):
            raise _bad(
                "placement.min_vram_gb",
                "'placement.min_vram_gb' must be a number of GB",
            )
        out["min_vram_gb"] = gb
    return out


def completion_request_parse(body: Any, *, endpoint: str) -> CompletionRequest:
    """Check an OpenAI chat (``endpoint='chat'``) or completion body.

    Raises ApiError(400) naming the field: missing model, empty messages, a
    temperature out of 0..2, ``n`` other than 1, etc. ``params`` holds
    ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``, and only
    when asked ``response_format`` (JSON text: ``formats.response_format_of``
    reads it) and ``logprobs`` (``jobs.formats``).
    """
    if not isinstance(body, dict):
        raise _bad("body", "the request body must be a JSON object")
    model = body.get("model")
    if model is None or model == "":
        raise _bad("model", "'model' is required")
    if not isinstance(model, str) or len(model) > MODEL_ID_MAX_CHARS:
        raise _bad("model", "'model' must be a model id string")
    _text(model, "model")
    messages = prompt = None
    if endpoint == "chat":
        messages = _messages(body.get("messages"))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise _bad("prompt", "'prompt' must be a non-empty string")
        _text(prompt, "prompt")
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):  # null: the default, 1
        raise _bad("n", "only n=1 is supported")
    max_tokens = _max_tokens(body)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list)
        or len(stop) > STOP_MAX
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise _bad(
            "stop", f"'stop' must be a string or a list of at most {STOP_MAX} strings"
        )
    for item in stop or []:
        _text(item, "stop")
    seed = body.get("seed")
    if seed is not None and (
        isinstance(seed, bool)
        or not isinstance(seed, int)
        or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]
    ):
        raise _bad("seed", "'seed' must be an integer from -2^63 to 2^63-1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be true or false")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("stream_options", "'stream_options' must be an object")
        if not stream:  # as OpenAI answers it
            raise _bad(
                "stream_options",
                "'stream_options' is only allowed when 'stream' is true",
            )
        if not isinstance(options.get("include_usage", False), bool):
            raise _bad(
                "stream_options",
                "'stream_options.include_usage' must be true or false",
            )
    _unsupported_refused(body)
    tools = tools_parse(body)  # jobs.toolcalls: function calling
    conversation = messages
    if messages is not None:
        messages = messages_rendered(messages, tools)
    params = {
        "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", *TEMPERATURE_RANGE, 1.0),
        "top_p": _number(body, "top_p", *TOP_P_RANGE, 1.0),
        "stop": stop,
        "seed": seed,
    }
    # what the output must be beyond text (jobs.formats): kept only when asked,
    # so a plain request's params are as they always were
    response_format = response_format_parse(
        body.get("response_format"), endpoint=endpoint
    )
    if tools is not None:
        response_format = _tools_constraint(tools, response_format, endpoint)
        if tools.choice is not None:  # the answer is parsed into tool calls
            params["tool_format"] = tools.format
    if response_format is not None:
        params["response_format"] = response_format_stored(response_format)
    logprobs = logprobs_parse(body, endpoint=endpoint)
    if logprobs is not None:
        if "tool_format" in params:
            raise _bad("logprobs", "'logprobs' cannot be combined with 'tools'")
        params["logprobs"] = logprobs
    return CompletionRequest(
        model=model,
        endpoint=endpoint,
        messages=messages,
        prompt=prompt,
        params=params,
        stream=stream,
        include_usage=bool((options or {}).get("include_usage", False)),
        placement=_placement(body.get("placement")),
        conversation=conversation,
        tools=tools,
    )
