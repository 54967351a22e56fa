"""``python manage.py catalog_add PATH [--id ID] [--price-in USD --price-out USD]
[--context-length N] [--replace]``: a catalog entry from a GGUF file
(DESIGN.md "Models (the catalog)"; README "Adding a model")."""

from django.core.management.base import BaseCommand, CommandError

from catalog.services import (
    CatalogAddError,
    catalog_model_add,
    per_million,
    price_nano,
)
from modeldata.modelfile import ModelFileError
from modeldata.vocab import UnsupportedVocabulary


class Command(BaseCommand):
    help = (
        "Add a model to the catalog from its GGUF file: the weights' digest and "
        "quantization hosts must run, family, context length, special tokens, "
        "tool-call format, VRAM estimates, vocabulary and chat template, all read "
        "from the file (the weights are not kept). Prints the entry."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="the model's GGUF file")
        parser.add_argument(
            "--id", dest="model_id", help="catalog id (default: from the file's name)"
        )
        parser.add_argument(
            "--price-in", metavar="USD", help="USD per million prompt tokens (0)"
        )
        parser.add_argument(
            "--price-out",
            metavar="USD",
            help="USD per million output tokens (required for a new entry)",
        )
        parser.add_argument(
            "--context-length",
            type=int,
            metavar="TOKENS",
            help="context promised to renters, at most the file's (default: the "
            "file's); hosts' engines must run at least this",
        )
        parser.add_argument(
            "--replace",
            action="store_true",
            help="replace an entry of this id (its prices kept unless given)",
        )

    def handle(
        self,
        *args,
        path,
        model_id,
        price_in,
        price_out,
        context_length,
        replace,
        **options,
    ):
        try:
            model = catalog_model_add(
                path=path,
                model_id=model_id,
                price_prompt_nano=price_nano(price_in, "--price-in"),
                price_completion_nano=price_nano(price_out, "--price-out"),
                context_length=context_length,
                replace=replace,
            )
        except (CatalogAddError, ModelFileError, UnsupportedVocabulary) as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        special = ", ".join(
            f"{name} {token['text']!r}" for name, token in model.special_tokens.items()
        )
        self.stdout.write(
            f"{model.id}: {model.family}, {model.quantization},"
            f" context {model.context_length} tokens\n"
            f"  weights sha256 {model.weights_sha256}\n"
            f"  special tokens: {special or 'none'}\n"
            f"  tool calls: {model.tool_call_format or 'none'}\n"
            f"  VRAM (estimates): weights {model.vram_weights_mb} MiB,"
            f" per request {model.vram_per_request_mb} MiB\n"
            f"  price per million tokens: in {per_million(model.price_prompt_nano)}"
            f" USD, out {per_million(model.price_completion_nano)} USD"
        )
