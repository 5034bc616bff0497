"""schema/config.schema.json against the same examples the parser is tested on.

`core/tests/schema.rs` checks the filter's parser on schema/examples/ and on the plugin configs
in envoy/*.yaml; this file checks the JSON Schema on the very same documents, so the two agree:
every valid example passes both, every invalid one fails both.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from stack.procs import ROOT

SCHEMA = json.loads((ROOT / "schema" / "config.schema.json").read_text())
EXAMPLES = ROOT / "schema" / "examples"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"


def examples(kind: str) -> list[Path]:
    found = sorted((EXAMPLES / kind).glob("*.json"))
    assert found, f"no examples in {EXAMPLES / kind}"
    return found


def validator() -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(SCHEMA)
    cls.check_schema(SCHEMA)
    return cls(SCHEMA)


@pytest.mark.parametrize("path", examples("valid"), ids=lambda p: p.name)
def test_valid_example_passes_the_schema(path: Path):
    validator().validate(json.loads(path.read_text()))


@pytest.mark.parametrize("path", examples("invalid"), ids=lambda p: p.name)
def test_invalid_example_fails_the_schema(path: Path):
    assert not validator().is_valid(json.loads(path.read_text())), f"schema accepts {path.name}"


def plugin_configs(node):
    """The guard's plugin config: a StringValue's JSON text (Wasm `configuration`, native
    `filter_config`)."""
    if isinstance(node, dict):
        if node.get("@type") == STRING_VALUE and isinstance(node.get("value"), str):
            yield json.loads(node["value"])
        for v in node.values():
            yield from plugin_configs(v)
    elif isinstance(node, list):
        for v in node:
            yield from plugin_configs(v)


@pytest.mark.parametrize("path", sorted((ROOT / "envoy").glob("*.yaml")), ids=lambda p: p.name)
def test_envoy_plugin_configs_pass_the_schema(path: Path):
    configs = list(plugin_configs(yaml.safe_load(path.read_text())))
    assert configs, f"{path.name}: no plugin config found"
    for cfg in configs:
        validator().validate(cfg)
