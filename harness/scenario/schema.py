"""The JSON Schema of a scenario file (`chaos schema`), for editors: unit strings as
strings with their patterns, each fault kind flat with its timing fields."""
from __future__ import annotations

from typing import Any

from pydantic.json_schema import GenerateJsonSchema

from chaos import units
from chaos.faults import FAULT_KINDS
from harness.job.policies import LABEL as POLICY_LABEL, PolicySpec
from harness.scenario.scenario import TIMING_FIELDS, FaultEvent, Scenario, one_or_more

_NUMBER = r"[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?"
# What each unit parser accepts besides a bare number, as a JSON Schema for editors.
_UNIT_FORMS = {
    units.parse_duration: ({"type": "string", "pattern": rf"^\s*{_NUMBER}\s*(us|ms|s|m|min|h)?\s*$"},
                           {"type": "number", "minimum": 0}, units.DURATION_FORM),
    units.parse_percent: ({"type": "string", "pattern": rf"^\s*{_NUMBER}\s*%\s*$"}, None, units.PERCENT_FORM),
    units.parse_rate: ({"type": "string", "pattern": rf"^\s*{_NUMBER}\s*[A-Za-z]+\s*$"}, None, units.RATE_FORM),
    units.parse_size: ({"type": "string", "pattern": rf"^\s*{_NUMBER}\s*[A-Za-z]*\s*$"},
                       {"type": "integer", "minimum": 1}, units.SIZE_FORM),
}


class _UnitsJsonSchema(GenerateJsonSchema):
    """Fields parsed from unit strings ("250ms", "20%") are strings (or numbers) in a file."""

    def function_before_schema(self, schema: Any) -> dict[str, Any]:
        parser = schema["function"]["function"]
        if parser in _UNIT_FORMS:
            text, number, form = _UNIT_FORMS[parser]
            return {"anyOf": [text, number] if number else [text], "description": form}
        inner = super().function_before_schema(schema)
        if parser is one_or_more:
            return {"anyOf": [inner["items"], inner]}
        if inner.get("type") in ("integer", "number"):
            return {"anyOf": [inner, {"type": "string"}]}  # numbers that take names too (signals)
        return inner


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file (what `chaos schema` prints), for editors."""
    schema = Scenario.model_json_schema(schema_generator=_UnitsJsonSchema)
    defs = schema["$defs"]
    timing = {k: v for k, v in defs["FaultEvent"]["properties"].items() if k in TIMING_FIELDS}
    kinds = []
    for cls in FAULT_KINDS:
        fault = cls.model_json_schema(schema_generator=_UnitsJsonSchema)
        defs.update(fault.pop("$defs", {}))
        fault["properties"].update(timing)
        fault["required"] = ["kind", "target", *fault.get("required", [])]
        fault["additionalProperties"] = False
        defs[f"{cls.__name__}Event"] = fault
        kinds.append({"$ref": f"#/$defs/{cls.__name__}Event"})
    for cls in FAULT_KINDS:
        defs.pop(cls.__name__, None)  # the model's nested form; a file uses the flat events above
    defs["FaultEvent"] = {"description": FaultEvent.__doc__, "oneOf": kinds}
    overrides = PolicySpec.model_json_schema(schema_generator=_UnitsJsonSchema)
    defs.update(overrides.pop("$defs", {}))
    overrides["properties"].pop("name")
    overrides.pop("required", None)
    overrides["title"] = "PolicyOverrides"
    defs["PolicyOverrides"] = overrides
    names = {"propertyNames": {"pattern": POLICY_LABEL}}  # a policy's name, or a label with `base:`
    schema["properties"]["policies"] = {**names, "type": "object", "description": "policies to compare",
                                        "additionalProperties": {"anyOf": [{"$ref": "#/$defs/PolicyOverrides"},
                                                                           {"type": "null"}]}}
    schema["properties"]["expect"] = {**names, "type": "object",
                                      "additionalProperties": {"$ref": "#/$defs/Expectation"}}
    for form in schema["properties"]["tier"]["anyOf"]:  # one tier for all, or trial -> tier
        if form["type"] == "object":
            form.update(names)
    schema["required"] = []  # name defaults to the file name
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "chaos-harness scenario"
    return schema
