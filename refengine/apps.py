"""The ``refengine`` app registers the reference engines when Django starts."""

from django.apps import AppConfig


class RefEngineConfig(AppConfig):
    name = "refengine"
    verbose_name = "Reference engine"

    def ready(self) -> None:
        from trust.canarypool import ReferenceEngines, reference_engines_register

        from .engines import engine_answerer, engine_checks, reference_engine

        reference_engines_register(
            ReferenceEngines(
                engine_for=reference_engine,
                answerer_for=engine_answerer,
                checks_for=engine_checks,
            )
        )
