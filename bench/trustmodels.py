"""The models ``bench/trust.py`` runs its fleet on, one table each (issue 31
item 5): SmolLM2-135M-Instruct Q4_1 (the reference model, its entry and
verification calibration written by the migrations) and a second family, the
tiny Llama 3 of ``tests/models/build.py``, added to the scratch catalog as an
operator adds a model (``catalog_add``), its verification calibrated by the
fleet's trusted devices (``trust.verification.calibration``)."""

from __future__ import annotations

from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-llama3"
BENCH_MODELS = (SMOLLM2, TINY)
"""The catalog ids ``bench/trust.py`` runs: the reference model, and the
second family (``tests/models/build.tiny_llama3``: Llama 3's tokenizer and
chat template, random weights fixed by a seed, a context of 512)."""


def model_file(model_id: str) -> Path:
    """The GGUF file of a bench model (built the first time for the tiny one)."""
    if model_id == SMOLLM2:
        from modeldata.reference import smollm2_gguf_path

        return smollm2_gguf_path()
    from tests.models.build import tiny_llama3

    return tiny_llama3()


def model_catalogued(model_id: str) -> None:
    """Put a bench model in the scratch catalog as an operator does
    (``catalog_add``: digest, quantization, tokenizer, template), unless its
    entry is there (SmolLM2's is, with its data and calibration, by the
    migrations)."""
    from catalog.models import CatalogModel
    from catalog.services import catalog_model_add

    if not CatalogModel.objects.filter(id=model_id).exists():
        catalog_model_add(path=model_file(model_id), model_id=model_id,
                          price_prompt_nano=0, price_completion_nano=100)  # fmt: skip
