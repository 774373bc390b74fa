"""Generated bad input to the configuration: every ``--set`` value and YAML file either loads or is refused with
a ConfigError of one line per problem; nothing else escapes, and nothing hangs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from coevolve.config import PipelineConfig, load_config
from coevolve.errors import ConfigError


def _setting_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += _setting_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{field.alias or name}")
    return paths


SETTINGS = _setting_paths(PipelineConfig)
SECTIONS = sorted({path.split(".")[0] for path in SETTINGS if "." in path})
# Values that have broken loaders: non-finite and huge numbers, YAML tags, aliases, anchors, nesting, odd scalars.
TRICKY = [
    "inf", ".inf", "-.inf", ".nan", "nan", "1e400", "1e12", "1000000000000", "-1", "0", "0x10", "1_000", "0o7",
    "[]", "{}", "null", "~", "true", "off", "yes", "''", '"\\xff"', "!!python/object:os.system", "!!binary aGk=",
    "&a [*a]", "*a", "[1, [2, [3]]]", "{a: 1}", "2024-01-01", "'x' 'y'", "- a", "? a", "|", "%YAML 1.2", "\t",
]  # fmt: skip
values = st.one_of(
    st.sampled_from(TRICKY),
    st.text(max_size=40),
    st.integers().map(str),
    st.floats().map(repr),
)
keys = st.one_of(st.sampled_from(SETTINGS), st.sampled_from(SECTIONS), st.text(max_size=20))
# A setting of PipelineConfig: every one is a plain field or a section of plain fields.
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)


def _assert_one_line_per_problem(message: str) -> None:
    lines = message.splitlines()
    assert lines, "an empty refusal"
    if len(lines) > 1:  # several invalid fields: a heading, then one line each
        assert lines[0] == "The configuration is invalid:"
        assert all(line.startswith("  - ") for line in lines[1:])


def _load_or_refuse(**kwargs) -> None:
    try:
        config = load_config(environ={}, **kwargs)
    except ConfigError as exc:
        _assert_one_line_per_problem(str(exc))
    else:
        assert isinstance(config, PipelineConfig)


@settings(max_examples=120, deadline=None)
@given(keys, values)
@example(key="rollout.gates", value="[1, [2, [3]]]")  # two bad items of one list: still one line
def test_any_single_override_loads_or_is_one_line(key, value):
    try:
        config = load_config(overrides=[f"{key}={value}"], environ={})
    except ConfigError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(config, PipelineConfig)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(keys, values).map("=".join), max_size=4))
def test_any_overrides_together_load_or_are_refused_one_line_each(pairs):
    _load_or_refuse(overrides=pairs)


@settings(max_examples=80, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(SECTIONS) | st.text(max_size=8),
        st.dictionaries(st.sampled_from([p.split(".")[-1] for p in SETTINGS]), yaml_values, max_size=4) | yaml_values,
        max_size=4,
    )
)
def test_any_yaml_mapping_of_sections_loads_or_is_refused_one_line_each(document):
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "config.yaml"
        file.write_text(yaml.safe_dump(document, allow_unicode=True))
        _load_or_refuse(path=file)


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@example(b"?")  # a mapping whose one key is null
@example(b"1: 2")  # a number as a section's name
def test_any_file_content_loads_or_is_one_line(content):
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "config.yaml"
        file.write_bytes(content)
        _load_or_refuse(path=file)
