from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"

    def ready(self) -> None:
        from registry.api import schema_extensions  # noqa: F401  (registers the schema's auth schemes)
