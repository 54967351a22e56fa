from django.apps import AppConfig


class TrustConfig(AppConfig):
    name = "trust"
    verbose_name = "Trust: spot checks, verification and the checks of verifiers"

    def ready(self) -> None:
        """Tell the layers below what trust decides: jobs its hook's receiver
        (``jobs.hooks``, ``hooks.Trust``), hosts which models have calibrated
        spot checks (``hosts.checkpools``). Imported here, once the app
        registry is ready, as Django asks of modules that import models."""
        from hosts.checkpools import models_checked_register
        from jobs.hooks import hook_register

        from .checkpools import models_checked
        from .hooks import Trust

        hook_register(Trust())
        models_checked_register(models_checked)
