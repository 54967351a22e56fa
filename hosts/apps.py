from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "hosts"
    verbose_name = "Hosts: machines and devices"
