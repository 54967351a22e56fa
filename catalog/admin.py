"""Staff view of the catalog: its models, what they pin, sizes and prices.

An entry is added from its GGUF file ("Add" asks for the file's path on the
coordinator, like ``catalog_add``); what the file says (digest, quantization,
special tokens, tool-call format, VRAM estimates) is read-only, prices and
``active`` are the operator's.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.shortcuts import redirect
from django.template.response import TemplateResponse

from modeldata.modelfile import ModelFileError
from modeldata.vocab import UnsupportedVocabulary

from .models import CatalogModel, ModelData
from .services import CatalogAddError, catalog_model_add, price_nano

FROM_FILE = (
    "weights_sha256",
    "quantization",
    "family",
    "special_tokens",
    "tool_call_format",
    "vram_weights_mb",
    "vram_per_request_mb",
)


class CatalogAddForm(forms.Form):
    """``catalog_add``'s arguments: the file on the coordinator, id, prices
    (USD per million tokens), context length."""

    path = forms.CharField(
        label="GGUF file", help_text="its path on the coordinator's machine"
    )
    model_id = forms.CharField(
        label="Catalog id", required=False, help_text="default: from the file's name"
    )
    price_in = forms.CharField(
        label="Price in", initial="0", help_text="USD per million prompt tokens"
    )
    price_out = forms.CharField(
        label="Price out", help_text="USD per million output tokens"
    )
    context_length = forms.IntegerField(
        label="Context length",
        required=False,
        min_value=1,
        help_text="tokens promised to renters (default: the file's)",
    )

    def clean(self):
        data = super().clean()
        for field in ("price_in", "price_out"):
            if field in data:
                try:
                    data[field] = price_nano(data[field], field.replace("_", " "))
                except CatalogAddError as exc:
                    self.add_error(field, str(exc))
        return data


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "family",
        "quantization",
        "context_length",
        "vram_per_request_mb",
        "price_prompt_nano",
        "price_completion_nano",
        "pinned",
        "active",
    ]
    list_filter = ["family", "quantization", "active"]
    search_fields = ["id", "family", "weights_sha256"]
    readonly_fields = FROM_FILE

    @admin.display(boolean=True, description="weights pinned")
    def pinned(self, obj: CatalogModel) -> bool:
        return bool(obj.weights_sha256)

    def add_view(self, request: HttpRequest, form_url="", extra_context=None):
        """Add an entry from a GGUF file (``catalog.services.catalog_model_add``)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = CatalogAddForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                model = catalog_model_add(
                    path=data["path"],
                    model_id=data["model_id"] or None,
                    price_prompt_nano=data["price_in"],
                    price_completion_nano=data["price_out"],
                    context_length=data["context_length"],
                )
            except (CatalogAddError, ModelFileError, UnsupportedVocabulary) as exc:
                form.add_error(None, str(exc))
            except OSError as exc:
                form.add_error("path", f"cannot read it: {exc.strerror or exc}")
            else:
                messages.success(
                    request,
                    f"{model.id} added: {model.quantization}, sha256 "
                    f"{model.weights_sha256}",
                )
                return redirect("admin:catalog_catalogmodel_change", model.id)
        return TemplateResponse(
            request,
            "admin/catalog/catalogmodel/add_from_file.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": "Add a model from its GGUF file",
                "form": form,
            },
        )


@admin.register(ModelData)
class ModelDataAdmin(admin.ModelAdmin):
    """What the coordinator keeps of each model's file (its vocabulary and
    chat template), read-only: written only by ``catalog_add`` (the file's
    own metadata), never by hand."""

    list_display = ["model", "vocabulary_size", "updated_at"]
    list_filter = ["updated_at"]
    search_fields = ["model__id"]
    fields = ["model", "vocabulary_size", "updated_at"]
    readonly_fields = fields

    @admin.display(description="vocabulary (bytes of JSON)")
    def vocabulary_size(self, obj: ModelData) -> str:
        return f"{len(obj.vocab_json):,}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
