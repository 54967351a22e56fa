"""The agent's names for ``modeldata.template``: the model's chat template,
rendered the same way by the agent and the coordinator (one implementation)."""

from modeldata.template import (
    TEMPLATE_KEY,
    ChatTemplate,
    ChatTemplateError,
    message_flatten,
    prompt_build,
)

__all__ = [
    "TEMPLATE_KEY",
    "ChatTemplate",
    "ChatTemplateError",
    "message_flatten",
    "prompt_build",
]
