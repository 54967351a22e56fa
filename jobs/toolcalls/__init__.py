"""Function calling (OpenAI's ``tools``): the request's tools and the
conversation's calls checked and rendered for the host (``requests``), the
constraint the host generates under, and the host's text parsed into tool
calls by the parser of the model's tool-call format (``generic``, the JSON
format for a template that has none), streamed as it arrives (``answers``).
docs/tools.md says what renters get.
"""
