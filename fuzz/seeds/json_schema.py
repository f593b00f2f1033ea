#!/usr/bin/env python3
"""Seeds for the `json_schema` fuzz target: a JSON Schema, then, with nothing between, the text
of an instance (the bytes that steer the walk through the grammar). The schemas are the
engine's constrained-decoding test schemas and the shapes tool calls bring (enums, nullable,
nested arrays of objects, `$ref` recursion, bounds). Writes fuzz/corpus/json_schema/seed-*;
rerun only to remake them.

  python3 fuzz/seeds/json_schema.py
"""
import json
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "json_schema")

SEEDS = {
    "weather": (
        {"type": "object", "properties": {"city": {"type": "string"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
         "required": ["city"], "additionalProperties": False},
        '{"city": "Oslo", "unit": "celsius"}',
    ),
    "bounds": (
        {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": -5, "maximum": 120},
            "x": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 3},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 4},
                     "minItems": 1, "maxItems": 3},
            "note": {"type": ["string", "null"]}},
         "required": ["n", "x", "tags", "note"], "additionalProperties": False},
        '{"n": 7, "x": 2.5e0, "tags": ["a", "\\u00e9t\\u00e9"], "note": null}',
    ),
    "order": (
        {"type": "object", "properties": {
            "items": {"type": "array", "items": {"type": "object", "properties": {
                "sku": {"type": "string", "maxLength": 8}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"], "additionalProperties": False}, "maxItems": 4},
            "shipping": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
                "address": {"type": "string"}, "express": {"type": "boolean"}},
                "required": ["address"], "additionalProperties": False}]}},
         "required": ["items"], "additionalProperties": False},
        '{"items": [{"sku": "A-1", "qty": 2}], "shipping": {"address": "1 Main St", "express": true}}',
    ),
    "tree": (
        {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
          "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
        '{"v": 1, "kids": [{"v": 2}, {"v": -3, "kids": []}]}',
    ),
    "const-enum": (
        {"type": "object", "properties": {"mode": {"const": "fast"}, "level": {"enum": [1, 2, 3, None]},
         "extra": {"type": "object"}}, "required": ["mode"]},
        '{"mode": "fast", "level": null, "extra": {"k": [1, {"z": false}]}}',
    ),
    "numbers": (
        {"type": "array", "items": {"type": "number"}, "maxItems": 5},
        '[0, -1.5, 3e2, 1E-3]',
    ),
    "json-mode": ({}, '{"anything": ["goes", 1, null, true]}'),
    "scalar": ({"type": "string", "minLength": 2, "maxLength": 6}, '"h\\"i\\n"'),
    "integer-range": ({"type": "integer", "exclusiveMinimum": 10, "maximum": 1000}, "999"),
    "open-object": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
        '{"a": 1, "b": "x", "c": ""}',
    ),
    "definitions": (
        {"definitions": {"p": {"type": "object", "properties": {"x": {"type": "number"},
          "y": {"type": "number"}}, "required": ["x", "y"]}},
         "type": "object", "properties": {"from": {"$ref": "#/definitions/p"}, "to": {"$ref": "#/definitions/p"}},
         "required": ["from", "to"]},
        '{"from": {"x": 0, "y": 1}, "to": {"x": -2.25, "y": 4}}',
    ),
    "bools": (
        {"type": "object", "properties": {"on": {"type": "boolean"}, "tags": {"type": "array",
         "items": {"enum": ["a", "b", 3]}, "minItems": 2}}, "required": ["on", "tags"]},
        '{"on": false, "tags": ["a", 3, "b"]}',
    ),
    # wider than the readings a state keeps (the engine's Switch), keys that prefix one another
    "wide-enum": (
        {"type": "object", "properties": {"code": {"enum": [f"c{i}" for i in range(60)]},
         "n": {"type": "array", "items": {"enum": [1, 12, 123, 1.5, -1, "1", None, {"a": [1]}]}}},
         "required": ["code", "n"], "additionalProperties": False},
        '{"code": "c47", "n": [12, 1, 123, 1.5, {"a": [1]}]}',
    ),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (schema, text) in SEEDS.items():
        # compact, as the grammar writes JSON (no whitespace between tokens)
        text = json.dumps(json.loads(text), separators=(",", ":"))
        with open(os.path.join(OUT, f"seed-{name}"), "wb") as f:
            f.write(json.dumps(schema, separators=(",", ":")).encode() + text.encode())


if __name__ == "__main__":
    main()
