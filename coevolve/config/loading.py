"""Loading a configuration: defaults < YAML file < ``COEVOLVE_*`` environment < ``--set`` overrides."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, InitSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from coevolve.config.base import deep_merge, explain
from coevolve.config.pipeline import PipelineConfig
from coevolve.errors import ConfigError


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with the 1.2 booleans only: ``mode: off`` must stay the string 'off', not become False."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


# The most values (mappings, lists and scalars, an alias counted as often as it is used) one configuration file or
# --set value may hold. The largest shipped configuration holds about 200; ten aliases of ten aliases, nine deep
# (the "billion laughs"), stand for 10^9 and held the loading process at 2 GB until it was killed.
MAX_CONFIG_VALUES = 100_000
# The largest configuration file read: the shipped ones are under 4 KB, and a file is read whole before parsing.
MAX_CONFIG_BYTES = 1024 * 1024


def _load_yaml(text: str, what: str) -> Any:
    """``text`` parsed as YAML 1.2 by a safe loader; ConfigError naming ``what`` when it is not valid YAML, nests
    too deeply, or stands for more than MAX_CONFIG_VALUES values once its aliases are expanded."""
    try:
        loaded = yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"{what} is not valid YAML: {detail}") from None
    except RecursionError:
        raise ConfigError(f"{what} nests its values too deeply to be a configuration; flatten it.") from None
    if _expanded_size(loaded) > MAX_CONFIG_VALUES:
        raise ConfigError(
            f"{what} stands for more than {MAX_CONFIG_VALUES} values once its aliases (*name) are expanded; a "
            "configuration holds a few hundred, so write the values out instead of repeating aliases of aliases."
        )
    return loaded


def _expanded_size(value: Any) -> int:
    """How many values ``value`` holds, each alias counted every time it is used; stops counting past the limit."""
    count = 0
    stack = [value]
    while stack and count <= MAX_CONFIG_VALUES:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
    return count


def _nested(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ``["rollout.group_size=8", ...]`` into a nested dict; values are parsed as YAML scalars."""
    merged: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(
                f"Override {pair!r} has no '='; write it as section.field=value, e.g. rollout.group_size=8."
            )
        key, raw = pair.split("=", 1)
        shown = pair if len(pair) <= 80 else f"{pair[:79]}…"
        value = _load_yaml(raw, f"The value of override {shown!r}") if raw != "" else ""
        merged = deep_merge(merged, _nested(key.strip(), value))
    return merged


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
    data: dict[str, Any] | None = None,
) -> PipelineConfig:
    """Build the configuration from ``data``, a YAML file, the environment and CLI overrides, later ones winning.

    ``environ`` defaults to the process environment. Raises ConfigError, with what to change, for a
    missing or malformed file and for any invalid value.
    """
    merged: dict[str, Any] = dict(data or {})
    if path is not None:
        merged = deep_merge(merged, _read_file(Path(path)))
    environ = dict(os.environ if environ is None else environ)
    _check_env_names(environ)
    sources = (
        InitSettingsSource(_LayeredConfig, init_kwargs=parse_overrides(overrides or [])),
        _MappingEnvSource(_LayeredConfig, environ),
        InitSettingsSource(_LayeredConfig, init_kwargs=merged),
    )
    try:
        layered = _LayeredConfig(_build_sources=(sources, {}))
        return PipelineConfig.model_validate(layered.model_dump())
    except ValidationError as exc:
        raise ConfigError(explain(exc)) from None
    except SettingsError as exc:
        raise ConfigError(
            f"A COEVOLVE_ environment variable could not be parsed ({exc}); list values are JSON, "
            'e.g. \'["boundary", "rare"]\'.'
        ) from None


def _read_file(file: Path) -> dict[str, Any]:
    if not file.exists():
        raise ConfigError(f"Config file {file} does not exist; pass an existing YAML file to --config.")
    if not file.is_file():
        # A folder, a device such as /dev/zero (which never ends) or a pipe: never read.
        raise ConfigError(f"Config file {file} is not a regular file; pass a YAML file to --config.")
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"Config file {file} cannot be read ({exc.strerror}); check its permissions.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"Config file {file} is larger than {MAX_CONFIG_BYTES // 1024} KiB, far more than any configuration; "
            "pass the YAML file of the sections you set."
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"Config file {file} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); save it as "
            "UTF-8."
        ) from None
    loaded = _load_yaml(text, f"Config file {file}") or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"Config file {file} must hold a mapping of sections, not {type(loaded).__name__}.")
    unnamed = [key for key in loaded if not isinstance(key, str)]
    if unnamed:
        # YAML allows any value as a key (`?` alone is a null key, `1:` a number); sections are named.
        raise ConfigError(
            f"Config file {file} has a key that is not a section name ({unnamed[0]!r}); name each section, "
            "e.g. rollout:."
        )
    return loaded


class _LayeredConfig(BaseSettings, PipelineConfig):
    """PipelineConfig as pydantic-settings layers it: ``COEVOLVE_<SECTION>__<FIELD>`` variables.

    Used only inside `load_config`; everything else passes the plain PipelineConfig it returns, so a
    configuration handed to a flow, a worker or `with_overrides` never reads the environment again.
    """

    model_config = SettingsConfigDict(
        env_prefix="COEVOLVE_",
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        validate_assignment=True,
    )


class _MappingEnvSource(EnvSettingsSource):
    """The environment source reading a given mapping, so tests and callers can pass their own."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, False, False, None)


def _check_env_names(environ: Mapping[str, str]) -> None:
    """A ``COEVOLVE_<SECTION>__...`` variable naming no section fails loudly instead of being ignored.

    Other COEVOLVE_ variables without a section separator, such as the API keys named by
    rollout.api_key_env, are not configuration and are left alone (a secret is never stored with it).
    """
    sections = set(PipelineConfig.model_fields)
    for name in environ:
        if name.upper().startswith("COEVOLVE_") and "__" in name:
            section = name[len("COEVOLVE_") :].split("__", 1)[0].lower()
            if section not in sections:
                raise ConfigError(
                    f"Environment variable {name}: {section!r} is not a configuration section; "
                    f"use one of {', '.join(sorted(sections))} (check its spelling against `coevolve config --show`)."
                )
