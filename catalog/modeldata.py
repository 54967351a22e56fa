"""A catalog model's tokenizer and chat template, kept as data (``ModelData``)
and built once per process: how the coordinator counts and renders every
model's tokens without running it (issue 31 item 3).

``model_data_save(entry, vocab)`` stores what the coordinator needs of a GGUF
file (``modeldata.VocabData``: vocabulary, special tokens, chat template; never
the weights). ``model_tokenizer(model_id)`` gives the model's ``ModelTokenizer``
(``modeldata.Vocabulary`` and ``modeldata.ChatTemplate``), read and built the
first time a process needs it (0.2 s for SmolLM2's 49k tokens, up to 15 s for a
262k-token vocabulary) and kept for the process's life: an entry's data
replaced later reaches a process that built the old one at its restart.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

from modeldata.modelfile import VocabData
from modeldata.template import ChatTemplate, ChatTemplateError
from modeldata.vocab import Vocabulary

from .models import CatalogModel, ModelData

log = logging.getLogger("ballast.catalog")


@dataclass(frozen=True, eq=False)
class ModelTokenizer:
    """One catalog model's tokenizer (``vocab``, llama.cpp's rules) and chat
    template (``template``: None when the file has none or it does not compile,
    so chat requests of the model cannot be rendered here). Hashable by
    identity: one per model per process."""

    model_id: str
    vocab: Vocabulary
    template: ChatTemplate | None


_built: dict[str, ModelTokenizer] = {}
_lock = threading.Lock()


def model_data_save(entry: CatalogModel, vocab: VocabData) -> ModelData:
    """Store ``vocab`` (read from the GGUF file of ``entry``, e.g. with
    ``modeldata.modelfile.vocab_data_read``) as the entry's ``ModelData``,
    replacing what it had.

    Raises ``UnsupportedVocabulary`` for a tokenizer the coordinator cannot
    run (a BERT or T5 vocabulary, an unknown pre-tokenizer): such an entry
    would be counted by the host's word alone, so it is refused here.
    """
    Vocabulary(vocab)  # refuses what cannot be run, before anything is written
    data, _ = ModelData.objects.update_or_create(
        model=entry, defaults={"vocab_json": vocab.to_json()}
    )
    return data


def model_tokenizer(model_id: str) -> ModelTokenizer | None:
    """The tokenizer and chat template of catalog model ``model_id``, or None
    when the catalog keeps no data for it (or its data can no longer be read).

    Reads the database the first time a process asks for a model it has data
    for; in an event loop's thread (where Django forbids a query) it answers
    from what the process built already, None otherwise: async callers load it
    first through ``model_tokenizer_load`` in a thread (``JobRun.events``).
    """
    built = _built.get(model_id)
    if built is not None:
        return built
    if _in_event_loop():
        return None
    return model_tokenizer_load(model_id)


def model_tokenizer_load(model_id: str) -> ModelTokenizer | None:
    """``model_tokenizer`` from synchronous code: reads and builds the model's
    tokenizer unless the process has it (one builder at a time). A model
    without data is looked up again next time (one query by primary key)."""
    built = _built.get(model_id)
    if built is not None:
        return built
    text = (
        ModelData.objects.filter(model_id=model_id)
        .values_list("vocab_json", flat=True)
        .first()
    )
    if text is None:
        return None
    with _lock:
        built = _built.get(model_id)
        if built is None:
            built = _build(model_id, text)
            if built is not None:
                _built[model_id] = built
    return built


def model_tokenizers_forget() -> None:
    """Drop every tokenizer this process built (tests that replace an entry's
    data under the same id)."""
    with _lock:
        _built.clear()


def _build(model_id: str, text: str) -> ModelTokenizer | None:
    try:
        data = VocabData.from_json(text)
        vocab = Vocabulary(data)
    except (ValueError, TypeError) as exc:  # ModelFileError, UnsupportedVocabulary
        log.error("catalog model %s: its vocabulary cannot be used: %s", model_id, exc)
        return None
    try:
        template = ChatTemplate.from_vocab(data) if data.chat_template else None
    except ChatTemplateError as exc:
        log.error("catalog model %s: its chat template fails: %s", model_id, exc)
        template = None
    return ModelTokenizer(model_id=model_id, vocab=vocab, template=template)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
