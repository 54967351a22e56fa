"""Writes of the catalog: an entry added (or replaced) from a model's GGUF file.

DESIGN.md "Models (the catalog)": a catalog model is data, read from the file
by one operator command (``catalog_add``, or "Add from a GGUF file" in the
admin); the coordinator keeps the vocabulary and template, never the weights.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

from django.db import transaction

from modeldata.entry import model_entry_read

from .modeldata import model_data_save
from .models import CatalogModel

MODEL_ID = re.compile(r"^[a-z0-9][a-z0-9._:-]{0,99}$")
"""A catalog id: lowercase letters, digits, ``.``, ``_``, ``:``, ``-``; ≤ 100."""


NANO_PER_USD_PER_MILLION = 1000
"""nano-USD per token in 1 USD per million tokens (10⁹ / 10⁶)."""


class CatalogAddError(ValueError):
    """The entry cannot be added: the message names what is wrong."""


def price_nano(text: str | None, option: str) -> int | None:
    """USD per million tokens (``"0.20"``) as integer nano-USD per token
    (200); None for None. Raises ``CatalogAddError`` naming ``option`` for a
    value that is not a non-negative amount in whole thousandths of a USD."""
    if text is None:
        return None
    try:
        nano = Decimal(text) * NANO_PER_USD_PER_MILLION
    except InvalidOperation:
        raise CatalogAddError(
            f"{option} must be USD per million tokens, like 0.20: got {text!r}"
        ) from None
    if not nano.is_finite() or nano < 0 or nano != nano.to_integral_value():
        raise CatalogAddError(
            f"{option} must be a non-negative USD amount per million tokens in"
            f" thousandths of a USD at most (like 0.2 or 1.125): got {text!r}"
        )
    return int(nano)


def per_million(nano: int) -> str:
    """nano-USD per token as USD per million tokens (``200`` → ``"0.2"``)."""
    return f"{(Decimal(nano) / NANO_PER_USD_PER_MILLION).normalize():f}"


def model_id_default(name: str) -> str:
    """The catalog id a file's ``general.name`` suggests: lowercased, runs of
    other characters as one ``-`` ("SmolLM2 135M Instruct" → "smollm2-135m-instruct")."""
    return re.sub(r"[^a-z0-9._]+", "-", name.lower()).strip("-._")[:100]


def _bad_id(model_id: str) -> str:
    return (
        f"model id {model_id!r}: lowercase letters, digits and . _ : - only,"
        " at most 100 characters (pass --id)"
    )


def _id_free(model_id: str, *, replace: bool, price: int | None) -> CatalogModel | None:
    """The entry ``model_id`` (locked inside a transaction) when it may be
    replaced, None when the id is free. Raises ``CatalogAddError`` for an id
    taken without ``replace``, or a new entry without its output ``price``."""
    existing = CatalogModel.objects.select_for_update().filter(id=model_id).first()
    if existing is not None and not replace:
        raise CatalogAddError(
            f"model {model_id!r} is in the catalog already (pass --replace to"
            " replace what it pins)"
        )
    if existing is None and price is None:
        raise CatalogAddError("a new entry needs its prices (--price-out, --price-in)")
    return existing


def catalog_model_add(
    *,
    path: str | Path,
    model_id: str | None = None,
    price_prompt_nano: int | None = None,
    price_completion_nano: int | None = None,
    context_length: int | None = None,
    replace: bool = False,
) -> CatalogModel:
    """Add the model of the GGUF file at ``path`` to the catalog, everything
    read from the file's own metadata (``modeldata.entry.model_entry_read``):
    the weights' digest and quantization, family, context length, special
    tokens, tool-call format, VRAM estimates, and (``catalog.modeldata``) its
    vocabulary and chat template.

    ``model_id``: the catalog id (default: from the file's name, see
    ``model_id_default``). Prices (nano-USD per token) are the operator's:
    required for a new entry, kept from the entry when it is replaced and not
    given. ``context_length`` (tokens): what the catalog promises renters,
    at most the file's (default: the file's; the hosts' engines must run at
    least this much). An existing id is refused unless ``replace``; an entry
    replaced keeps its prices and ``active`` flag unless given.

    Raises ``CatalogAddError`` naming what is wrong (an id, a price, a context
    length, an id taken), ``modeldata.modelfile.ModelFileError`` for a file
    that is not a GGUF model, ``modeldata.vocab.UnsupportedVocabulary`` for a
    tokenizer the coordinator cannot run, ``OSError`` when it cannot be read.
    """
    if model_id is not None and not MODEL_ID.match(model_id):
        raise CatalogAddError(_bad_id(model_id))
    for name, price in (
        ("price-in", price_prompt_nano),
        ("price-out", price_completion_nano),
    ):
        if price is not None and price < 0:
            raise CatalogAddError(f"--{name} must not be negative")
    if model_id is not None:  # refused before the file is read (minutes, for GBs)
        with transaction.atomic():  # the lock needs one (PostgreSQL refuses it bare)
            _id_free(model_id, replace=replace, price=price_completion_nano)
    entry = model_entry_read(path)
    file = entry.file
    if not file.weights_bytes:
        raise CatalogAddError(
            f"{path} holds no weights (a vocabulary-only file): hosts could not run it"
        )
    if model_id is None:
        model_id = model_id_default(file.name or Path(path).stem)
        if not MODEL_ID.match(model_id):
            raise CatalogAddError(_bad_id(model_id))
    trained = file.context_length
    if context_length is None:
        if not trained:
            raise CatalogAddError(
                "the file does not say its context length (pass --context-length)"
            )
        context_length = trained
    if context_length < 1 or (trained and context_length > trained):
        raise CatalogAddError(
            f"context length {context_length}: from 1 to the file's {trained}"
        )
    values = {
        "family": file.family[:64],
        "context_length": context_length,
        "vram_per_request_mb": entry.vram_per_request_mb(context_length),
        "vram_weights_mb": entry.vram_weights_mb,
        "weights_sha256": file.sha256,
        "quantization": file.quantization[:32],
        "special_tokens": entry.special_tokens,
        "tool_call_format": entry.tool_call_format,
    }
    if price_prompt_nano is not None:
        values["price_prompt_nano"] = price_prompt_nano
    if price_completion_nano is not None:
        values["price_completion_nano"] = price_completion_nano
    with transaction.atomic():  # what was checked before the read, again, locked
        if _id_free(model_id, replace=replace, price=price_completion_nano) is None:
            model = CatalogModel.objects.create(id=model_id, **values)
        else:
            CatalogModel.objects.filter(id=model_id).update(**values)
            model = CatalogModel.objects.get(id=model_id)
        model_data_save(model, file.vocab)
    return model
