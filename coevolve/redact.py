"""Credentials in a configuration: finding them by name, and masking them wherever a configuration is recorded.

The configuration travels whole: Prefect stores it as a flow run's parameters, the warehouse's run
record keeps it, and MLflow logs it as the params of every round. So credentials never belong in it:
`WarehouseConfig` refuses them in ``warehouse.storage_options`` (they come from the environment), and
API keys are named by ``*_api_key_env`` settings, never given. What still reaches a record is masked
here as a second line of defence: a value under a credential's name, and the password of a URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# What a masked value reads as.
REDACTED = "***"

# Words that make a name a credential when they are the whole name or one of its words
# (``aws_secret_access_key``, ``sas_token``, ``client_secret``, ``Authorization``, ``x-api-key``).
_CREDENTIAL_WORDS = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "passwd",
        "pwd",
        "credential",
        "credentials",
        "authorization",
        "auth",
        "apikey",
        "passphrase",
        "signature",
    }
)
# Names whose words hold a credential only together.
_CREDENTIAL_NAMES = frozenset({"connection_string", "sas_url"})


def is_credential_name(name: str) -> bool:
    """Whether a setting called ``name`` holds a credential.

    A name ending in ``_env`` names the environment variable that holds one (``rollout.api_key_env``),
    which is not itself secret.
    """
    normal = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    if normal.endswith("_env"):
        return False
    return normal in _CREDENTIAL_NAMES or any(word in _CREDENTIAL_WORDS for word in normal.split("_"))


def credential_keys(value: Any, prefix: str = "") -> list[str]:
    """The dotted names of the credentials in ``value`` (nested mappings and lists), e.g. ``client_kwargs.secret``."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = f"{prefix}{key}"
            if is_credential_name(str(key)) and item not in (None, "", {}, []):
                found.append(name)
            else:
                found.extend(credential_keys(item, name + "."))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found.extend(credential_keys(item, f"{prefix}{index}."))
    return found


def redact_url(text: str) -> str:
    """``text`` with the password of a URL (``scheme://user:password@host``) masked; anything else unchanged."""
    if "://" not in text or "@" not in text:
        return text
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return text
    if not password:
        return text
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:{REDACTED}@{host}"))


def redact(value: Any) -> Any:
    """A copy of ``value`` (a configuration as plain data) with every credential and URL password masked."""
    if isinstance(value, Mapping):
        return {
            key: REDACTED if is_credential_name(str(key)) and item not in (None, "", {}, []) else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(item) for item in value]
    if isinstance(value, str):
        return redact_url(value)
    return value


def redact_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Flattened settings (``warehouse.storage_options.secret``) with credentials masked, judged by each dotted word."""
    masked: dict[str, Any] = {}
    for name, value in params.items():
        if value not in (None, "", {}, []) and any(is_credential_name(part) for part in str(name).split(".")):
            masked[name] = REDACTED
        else:
            masked[name] = redact(value)
    return masked
