"""What the coordinator and the host agent both know about a model, read from its
GGUF file: the file's identity (digest, architecture, quantization, sizes), its
vocabulary and chat template.

- ``modeldata.modelfile``: read a GGUF file (``model_file_read``) into a
  ``ModelFile``; its ``VocabData`` (tokenizer and chat template, no weights)
  serializes to compact JSON and back.
- ``modeldata.vocab``: ``Vocabulary``, llama.cpp's tokenizer rebuilt from a
  ``VocabData`` (tokenize, token bytes, detokenize).
- ``modeldata.template``: the model's Jinja chat template rendered as llama.cpp's
  hosts render it (``ChatTemplate``, ``prompt_build``).

It imports nothing of the coordinator, of the agent, of Django or of llama.cpp
(import-linter contract ``modeldata-alone`` in ``pyproject.toml``).
"""
