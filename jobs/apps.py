from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs: API keys, jobs and attempts"

    def ready(self) -> None:
        """Tell ``hosts`` which models have calibrated spot checks
        (``hosts.checkpools``; the pools live here, above it)."""
        from hosts.checkpools import models_checked_register

        from .checkpools import models_checked

        models_checked_register(models_checked)
