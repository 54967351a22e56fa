"""Auth, i18n, static files (WhiteNoise), the REST framework, the API schema
and logging."""

from __future__ import annotations

import os
from pathlib import Path

from .base import BASE_DIR

# --- auth, i18n, static ---------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/machines/"
LOGOUT_REDIRECT_URL = "/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- static files (WhiteNoise) ---------------------------------------------------
# The application serves its own static files in every mode (the demo, the README's
# production command, the tests): WhiteNoise from STATIC_ROOT, which
# ``collectstatic`` fills with compressed files under content-hashed names
# (``ballast.3f2a….css``, cached for ever). ./dev runs collectstatic before the
# demo and the tests; a page naming a file collectstatic has not seen fails loudly
# (ValueError from the manifest) instead of linking a 404.
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("BALLAST_STATIC_ROOT", BASE_DIR / "var" / "static"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_AUTOREFRESH = False  # the files of STATIC_ROOT only, as in production

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["jobs.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "jobs.drf.openai_exception_handler",
    # the renter API takes JSON only (a form's fields would all be strings: 415)
    "DEFAULT_PARSER_CLASSES": ["jobs.parsers.JsonParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Ballast renter API",
    "VERSION": "1",
    # the completions are plain async views: documented by twins (jobs.schema.completions)
    "PREPROCESSING_HOOKS": ["jobs.schema.completions.completions_endpoints"],
    "SERVE_INCLUDE_SCHEMA": False,  # the schema itself is no renter endpoint
    "ENUM_NAME_OVERRIDES": {
        "ChatCompletionObjectEnum": "jobs.schema.completion_answers.CHAT_OBJECT",
        "ChatCompletionChunkObjectEnum": "jobs.schema.completion_answers.CHAT_CHUNK_OBJECT",
        "TextCompletionObjectEnum": "jobs.schema.completion_answers.TEXT_OBJECT",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "ballast": {
            "handlers": ["console"],
            "level": os.environ.get("BALLAST_LOG_LEVEL", "INFO"),
        },
    },
}
