"""Function calling (OpenAI's ``tools``): the request's tools and the
conversation's calls checked and rendered for the host (``requests``), in the
model's own tool-call format (``native``: Hermes/Qwen's ``<tool_call>``
blocks, Llama 3.1's bare object, rendered by the model's chat template) or
the generic JSON format for any other model (``generic``); the constraint the
host generates under; and the host's text parsed into tool calls by the
format's parser (``generic.CallParser``, ``sequence.SequenceParser``, sharing
``calls`` and ``scanner``), streamed as it arrives (``answers``).
docs/tools.md says what renters get.
"""
