from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts and renter pages"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (connects the receivers)
