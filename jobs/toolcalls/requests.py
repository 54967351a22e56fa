"""A request's function calling, checked: ``tools``, ``tool_choice``,
``parallel_tool_calls`` and the conversation's assistant ``tool_calls`` and
``tool`` messages (OpenAI's shapes), turned into what a host is sent: plain
chat messages (the tool-call format's preamble and rendering) and the
constraint its answer is generated under (docs/tools.md).

Raises ``ApiError(400)`` naming the field, as ``jobs.requests`` does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from modeldata.template import ChatTemplate

from ..errors import ApiError
from ..schemas import schema_checked
from ..schematext import json_text_checked
from . import generic, native

MAX_TOOLS = 64
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DESCRIPTION_MAX_CHARS = 4096
CHOICES = ("none", "auto", "required")
NO_PARAMETERS = {"type": "object", "properties": {}}


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, "invalid_request", param=param)


@dataclass(frozen=True)
class ToolRequest:
    """What a request with ``tools`` asks: the functions, the choice, the
    format the answer is written in (``generic.NAME``), and the constraint
    (a ``json_schema`` response format) — None under ``tool_choice: "none"``,
    whose answer is plain text."""

    functions: list[generic.Function]
    choice: generic.Choice | None
    format: str
    response_format: dict | None


def tools_parse(body: dict) -> ToolRequest | None:
    """The request's ``tools`` and ``tool_choice`` checked, or None when it
    has no tools (``tools`` absent, null or ``[]``; then ``tool_choice`` may
    only be absent, null or ``"none"``, what clients send by default)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):  # auto: no tool, so text
            raise _bad("tool_choice", "'tool_choice' needs 'tools'")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _bad("tools", f"'tools' must be a list of at most {MAX_TOOLS} tools")
    json_text_checked(tools, "tools")
    functions = [_function(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = [f.name for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _bad(
                f"tools[{i}].function.name",
                f"'tools[{i}].function.name' repeats {name!r}: each tool needs its own name",
            )
    mode, named = _choice(choice, names)
    if mode == "none":
        return ToolRequest(functions, None, generic.NAME, None)
    picked = generic.Choice(mode=mode, parallel=parallel is not False, name=named)
    schema = schema_checked(generic.constraint(functions, picked), param="tools")
    return ToolRequest(
        functions,
        picked,
        generic.NAME,
        {
            "type": "json_schema",
            "json_schema": {"name": "tool_calls", "schema": schema, "strict": True},
        },
    )


def _function(tool: Any, param: str) -> generic.Function:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise _bad(f"{param}.type", f"'{param}.type' must be 'function'")
    unknown = set(tool) - {"type", "function"}
    if unknown:
        field = sorted(unknown)[0]
        raise _bad(f"{param}.{field}", f"'{param}.{field}' is not a tool field")
    spec = tool.get("function")
    if not isinstance(spec, dict):
        raise _bad(f"{param}.function", f"'{param}.function' must be an object")
    unknown = set(spec) - {"name", "description", "parameters", "strict"}
    if unknown:
        field = sorted(unknown)[0]
        raise _bad(
            f"{param}.function.{field}",
            f"'{param}.function.{field}' is not a function field",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        raise _bad(
            f"{param}.function.name",
            f"'{param}.function.name' must be 1-64 letters, digits, '_' or '-'",
        )
    description = spec.get("description") or ""
    if not isinstance(description, str) or len(description) > DESCRIPTION_MAX_CHARS:
        raise _bad(
            f"{param}.function.description",
            f"'{param}.function.description' must be a string of at most "
            f"{DESCRIPTION_MAX_CHARS} characters",
        )
    if spec.get("strict") not in (None, True, False):
        raise _bad(
            f"{param}.function.strict",
            f"'{param}.function.strict' must be true or false",
        )
    shown = spec.get("parameters")
    if shown is None:
        shown = NO_PARAMETERS
    parameters = schema_checked(shown, param=f"{param}.function.parameters")
    if parameters.get("type") != "object":
        raise _bad(
            f"{param}.function.parameters",
            f"'{param}.function.parameters' must be a schema of type object",
        )
    if "properties" not in parameters and "additionalProperties" not in parameters:
        # an object schema lists its properties (docs/tools.md): the
        # converter would read this one as any object at all
        parameters = {**parameters, "properties": {}}
    return generic.Function(name, description, parameters, shown)


def _choice(choice: Any, names: list[str]) -> tuple[str, str | None]:
    """(mode, the named function or None) of ``tool_choice`` (default auto)."""
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise _bad(
                "tool_choice",
                f"'tool_choice' must be one of {list(CHOICES)} or a function",
            )
        return choice, None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(choice.get("function"), dict)
    ):
        raise _bad(
            "tool_choice",
            "'tool_choice' must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
        )
    name = choice["function"].get("name")
    if name not in names:
        raise _bad(
            "tool_choice.function.name",
            f"'tool_choice.function.name' names no tool: {name!r}",
        )
    return "named", name


def message_tool_fields(message: dict, i: int) -> dict:
    """The tool fields of ``messages[i]``, checked: an assistant's
    ``tool_calls`` as ``[{"id", "name", "arguments"}]`` (``arguments`` JSON
    text) and a tool message's ``tool_call_id``; ``{}`` when it has none."""
    role = message.get("role")
    param = f"messages[{i}]"
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(
                f"{param}.tool_call_id",
                f"'{param}.tool_call_id' must name the call this message answers",
            )
        json_text_checked(call_id, f"{param}.tool_call_id")
        return {"tool_call_id": call_id}
    calls = message.get("tool_calls")
    if calls is None or calls == []:
        return {}

    if role != "assistant":
        raise _bad(f"{param}.tool_calls", "only an assistant message has 'tool_calls'")
    if not isinstance(calls, list):
        raise _bad(f"{param}.tool_calls", f"'{param}.tool_calls' must be a list")
    out = []
    for j, call in enumerate(calls):
        where = f"{param}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise _bad(where, f"'{where}' must be a function call")
        name, arguments = function.get("name"), function.get("arguments", "")
        if not isinstance(name, str) or not name:
            raise _bad(
                f"{where}.function.name", f"'{where}.function.name' must be a string"
            )
        if not isinstance(arguments, str) or not _json_text(arguments):
            raise _bad(
                f"{where}.function.arguments",
                f"'{where}.function.arguments' must be a string of JSON text",
            )
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise _bad(f"{where}.id", f"'{where}.id' must be a string")
        json_text_checked([call_id, name, arguments], where)
        out.append({"id": call_id, "name": name, "arguments": arguments})
    return {"tool_calls": out}


def _json_text(text: str) -> bool:
    """Whether ``text`` is JSON ("" too: a call with no arguments)."""
    try:
        json.loads(text or "{}")
    except ValueError:
        return False
    return True


def tool_results_checked(messages: list[dict]) -> None:
    """ApiError 400 unless each ``tool`` message of ``messages`` (checked by
    ``message_tool_fields``) answers a call an earlier assistant message made
    (its ``tool_call_id`` among their ``tool_calls`` ids), as OpenAI's."""
    made: set[str] = set()
    for i, message in enumerate(messages):
        for call in message.get("tool_calls") or ():
            if call["id"]:
                made.add(call["id"])
        if message["role"] == "tool" and message["tool_call_id"] not in made:
            raise _bad(
                f"messages[{i}].tool_call_id",
                f"'messages[{i}].tool_call_id' answers no call of an earlier "
                "assistant message's 'tool_calls'",
            )


def messages_rendered(messages: list[dict], tools: ToolRequest | None) -> list[dict]:
    """The conversation as plain chat messages (system, user, assistant) a
    host's chat template renders whatever its engine: the format's preamble
    joins the first system message (or opens the conversation as one), an
    assistant's calls become the format's text, a tool result a user turn.
    ``messages``: checked messages (``role``, ``content``, and the fields of
    ``message_tool_fields``)."""
    names: dict[str, str] = {}
    out = []
    for message in messages:
        role, content = message["role"], message["content"]
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                if call["id"]:
                    names[call["id"]] = call["name"]
            out.append(
                {
                    "role": "assistant",
                    "content": generic.calls_text(message["tool_calls"], content),
                }
            )
        elif role == "tool":
            call_id = message.get("tool_call_id")
            text = generic.result_text(
                name=names.get(call_id or ""), tool_call_id=call_id, content=content
            )
            out.append({"role": "user", "content": text})
        else:
            out.append({"role": role, "content": content})
    if tools is None or tools.choice is None:
        return out
    preamble = generic.preamble(tools.functions, tools.choice)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{preamble}"}
    else:
        out.insert(0, {"role": "system", "content": preamble})
    return out


@dataclass(frozen=True)
class NativeRendering:
    """A conversation in its model's own tool-call format: the ``prompt`` its
    template renders, and for a request whose answer is parsed into calls
    the ``format`` (a key of ``native.LAYOUTS``) and the ``response_format``
    it is generated under (else None, None)."""

    prompt: str
    format: str | None
    response_format: dict | None


def native_rendered(
    messages: list[dict],
    tools: ToolRequest | None,
    *,
    tool_call_format: str,
    template: ChatTemplate | None,
) -> NativeRendering | None:
    """The conversation (checked messages) rendered in the model's own
    format when the catalog gives it one served natively
    (``tool_call_format`` among ``native.LAYOUTS``) and the coordinator has
    its template, and the request has tools or its conversation calls;
    None otherwise (the generic format: ``messages_rendered``). Raises
    ApiError 400 when the template refuses the conversation."""
    layout = native.LAYOUTS.get(tool_call_format)
    calling = tools is not None or any(
        m.get("tool_calls") or m["role"] == "tool" for m in messages
    )
    if layout is None or template is None or not calling:
        return None
    choice = tools.choice if tools is not None else None
    prompt = native.prompt_rendered(
        template, messages, tools.functions if choice is not None else None
    )
    if choice is None:
        return NativeRendering(prompt, None, None)
    return NativeRendering(
        prompt,
        tool_call_format,
        native.constraint(tools.functions, choice, layout),  # type: ignore[union-attr]
    )
