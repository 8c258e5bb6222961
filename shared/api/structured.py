"""response_format and structured_outputs -> one validated StructuredOutputsParams (step 2).

Every spec is checked here, before the request is queued, so a bad schema, regex or grammar is a
400 naming the field, never a silent fallback to free text.
"""
from __future__ import annotations

import json

from shared.api.protocol import _Common
from shared.api.protocol_tools import ResponseFormat, StructuredOutputs
from shared.errors import ParamError
from shared.messages import StructuredOutputsParams
from shared.structured.grammar import validate


def structured_spec(req: _Common) -> StructuredOutputsParams | None:
    """The request's output constraint, validated; None when it asks for free text."""
    rf, so = req.response_format, req.structured_outputs
    if so is not None and rf is not None and rf.type != "text":
        raise ParamError("give response_format or structured_outputs, not both",
                         param="structured_outputs")
    if so is not None:
        spec, param = from_structured_outputs(so), "structured_outputs"
    elif rf is not None:
        spec, param = from_response_format(rf)
    else:
        return None
    if spec is not None:
        validate(spec, param)
    return spec


def from_response_format(rf: ResponseFormat) -> tuple[StructuredOutputsParams | None, str]:
    if rf.type == "text":
        return None, "response_format"
    if rf.type == "json_object":
        return StructuredOutputsParams(json_object=True), "response_format"
    if rf.json_schema is None:
        raise ParamError("response_format of type json_schema needs a json_schema object",
                         param="response_format.json_schema")
    schema = rf.json_schema.schema
    if schema is None:     # as vLLM: no schema means any JSON object
        return StructuredOutputsParams(json_object=True), "response_format.json_schema"
    return StructuredOutputsParams(json=json.dumps(schema)), "response_format.json_schema.schema"


def from_structured_outputs(so: StructuredOutputs) -> StructuredOutputsParams:
    schema = so.json
    if schema is not None and not isinstance(schema, str):
        schema = json.dumps(schema)
    return StructuredOutputsParams(json=schema, json_object=bool(so.json_object), regex=so.regex,
                                   choice=so.choice, grammar=so.grammar)
