"""What a simulated replica answers when a request asks for tools or a JSON shape.

vLLM enforces ``tool_choice="required"`` / a named function and ``response_format``
(``json_schema``, ``json_object``) with guided decoding: whatever the weights, the
output parses and matches the schema. The simulator does the same by building a value
from the schema with the request's seeded generator, so an agent's tool loop and its
structured outputs are exercised end to end (same seed and prompt, same answer).

``tool_choice="auto"`` (the default when tools are given) is decided the way a useful
model would: call a tool unless the last message is a tool result, so an agent loop
that runs the tools and asks again terminates. ``logprobs`` are made up per token
(byte tokenizer: one character is one token) but deterministic and well-formed.
"""

from __future__ import annotations

import json
import math
import random
import string
import uuid
from dataclasses import dataclass, field
from typing import Any

from taskplane.sim.textgen import WORDS, generate_text

MAX_DEPTH = 6


class SchemaError(ValueError):
    """A tool or response_format the simulator cannot honour (a 400, as vLLM answers)."""


@dataclass(slots=True)
class Choice:
    """One generated choice: text content or tool calls (never both)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"

    @property
    def text(self) -> str:
        """What the engine decodes for this choice (its token count is the output length)."""
        if self.tool_calls:
            return "".join(c["function"]["name"] + c["function"]["arguments"] for c in self.tool_calls)
        return self.content or ""


# ------------------------------------------------------------------ values from a schema

def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    if not ref.startswith("#/"):
        raise SchemaError(f"only local $ref is supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            raise SchemaError(f"$ref {ref!r} does not resolve")
        node = node[part]
    if not isinstance(node, dict):
        raise SchemaError(f"$ref {ref!r} is not a schema")
    return {**node, **{k: v for k, v in schema.items() if k != "$ref"}}


def _word(rng: random.Random) -> str:
    return rng.choice(WORDS)


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if fmt == "date-time":
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
    if fmt == "date":
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if fmt == "email":
        return f"{_word(rng)}@example.com"
    if fmt == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    lo = int(schema.get("minLength", 1))
    hi = int(schema.get("maxLength", max(lo, 24)))
    n = rng.randint(lo, max(lo, min(hi, lo + 24)))
    text = generate_text(rng, n) if n else ""
    if len(text) < lo:
        text += "".join(rng.choice(string.ascii_lowercase) for _ in range(lo - len(text)))
    return text[:hi]


def _number(schema: dict[str, Any], rng: random.Random, integer: bool) -> int | float:
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    lo_f = float(lo) if lo is not None else (float(hi) - 100 if hi is not None else 0.0)
    hi_f = float(hi) if hi is not None else lo_f + 100
    if integer:
        a = math.ceil(lo_f) + (1 if "exclusiveMinimum" in schema and float(schema["exclusiveMinimum"]) == math.ceil(lo_f) else 0)
        b = math.floor(hi_f) - (1 if "exclusiveMaximum" in schema and float(schema["exclusiveMaximum"]) == math.floor(hi_f) else 0)
        if a > b:
            raise SchemaError(f"no integer satisfies {schema}")
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0:
            first = math.ceil(a / step) * step
            if first > b:
                raise SchemaError(f"no integer satisfies {schema}")
            return first + step * rng.randint(0, (b - first) // step)
        return rng.randint(a, b)
    value = lo_f + (hi_f - lo_f) * rng.random()
    if "exclusiveMinimum" in schema and value <= lo_f:
        value = (lo_f + hi_f) / 2
    return round(value, 3) if lo_f < round(value, 3) < hi_f else value


def _object(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> dict[str, Any]:
    props = schema.get("properties") or {}
    if not isinstance(props, dict):
        raise SchemaError("properties must be an object")
    required = set(schema.get("required") or props)
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if name in required or rng.random() < 0.5:
            out[name] = value_for(sub, rng, root, depth + 1)
    if not props and schema.get("additionalProperties", True) is not False:
        out[_word(rng)] = _string({}, rng)  # json_object / a free-form object
    return out


def value_for(schema: Any, rng: random.Random, root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A JSON value valid against ``schema`` (the subset tool and output schemas use)."""
    if schema is True or schema == {}:
        return _word(rng)
    if not isinstance(schema, dict):
        raise SchemaError("a schema must be an object")
    root = schema if root is None else root
    if depth > MAX_DEPTH:
        raise SchemaError("schema nests deeper than the simulator follows")
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(list(schema["enum"]))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if not (isinstance(o, dict) and o.get("type") == "null")]
            return value_for(rng.choice(options or schema[key]), rng, root, depth + 1)
    if "allOf" in schema:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(part, root))
        return value_for(merged, rng, root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return _object(schema, rng, root, depth)
    if kind == "array":
        lo = int(schema.get("minItems", 1))
        hi = int(schema.get("maxItems", max(lo, 3)))
        items = schema.get("items", {})
        return [value_for(items, rng, root, depth + 1) for _ in range(rng.randint(lo, max(lo, hi)))]
    if kind == "string":
        return _string(schema, rng)
    if kind in ("integer", "number"):
        return _number(schema, rng, integer=kind == "integer")
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    raise SchemaError(f"unsupported schema type {kind!r}")


# ------------------------------------------------------------------ tools and formats

def _tools(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise SchemaError("tools must be a list")
    out: dict[str, dict[str, Any]] = {}
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or t.get("type", "function") != "function":
            raise SchemaError("each tool must be {'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
        out[fn["name"]] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def _wanted_tools(body: dict[str, Any], tools: dict[str, dict[str, Any]]) -> list[str] | None:
    """The tool names the reply must call (None: reply with text)."""
    if not tools:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise SchemaError("tool_choice needs tools")
        return None
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if name not in tools:
            raise SchemaError(f"tool_choice names {name!r}, which is not among the tools")
        return [name]
    if choice not in ("auto", "required"):
        raise SchemaError(f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}")
    messages = body.get("messages") or []
    if choice == "auto" and messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        return None  # the tools have answered: a model would now reply
    return list(tools)


def _format_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    fmt = body.get("response_format")
    if fmt is None:
        guided = body.get("guided_json")  # vLLM's own extra parameter
        return guided if isinstance(guided, dict) else None
    if not isinstance(fmt, dict):
        raise SchemaError("response_format must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise SchemaError("response_format json_schema needs json_schema.schema")
        return schema
    raise SchemaError(f"response_format type must be text, json_object or json_schema, got {kind!r}")


def _tool_call(name: str, params: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    args = value_for(params, rng)
    call_id = "chatcmpl-tool-" + "".join(rng.choice("0123456789abcdef") for _ in range(32))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def structured_choice(body: dict[str, Any], rng: random.Random) -> Choice | None:
    """The choice when tools or a JSON format decide its shape; None for plain text."""
    tools = _tools(body)
    wanted = _wanted_tools(body, tools)
    if wanted is not None:
        picks = [rng.choice(wanted)]
        if len(wanted) > 1 and body.get("parallel_tool_calls", True) is not False and rng.random() < 0.5:
            picks.append(rng.choice([w for w in wanted if w != picks[0]]))
        return Choice(content=None, tool_calls=[_tool_call(n, tools[n], rng) for n in picks], finish_reason="tool_calls")
    schema = _format_schema(body)
    if schema is None:
        return None
    return Choice(content=json.dumps(value_for(schema, rng)), finish_reason="stop")


def chat_message(choice: Choice) -> dict[str, Any]:
    return {"role": "assistant", "content": choice.content, "tool_calls": choice.tool_calls}


# ------------------------------------------------------------------ logprobs

def _top(token: str, rng: random.Random, k: int) -> tuple[float, list[tuple[str, float]]]:
    lp = -rng.random() * 2.0
    others = [(c, lp - 0.1 - rng.random() * 3.0) for c in rng.sample(string.ascii_lowercase, k)]
    return lp, [(token, lp), *others][:k] if k else []


def chat_logprobs(text: str, rng: random.Random, top: int) -> dict[str, Any]:
    """``choices[i].logprobs`` of a chat completion (one entry per byte token)."""
    content = []
    for ch in text:
        lp, tops = _top(ch, rng, top)
        content.append({"token": ch, "logprob": lp, "bytes": list(ch.encode()),
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in tops]})
    return {"content": content}


def completion_logprobs(text: str, rng: random.Random, top: int) -> dict[str, Any]:
    """``choices[i].logprobs`` of a text completion (the legacy shape)."""
    tokens, values, tops, offsets = [], [], [], []
    for i, ch in enumerate(text):
        lp, alts = _top(ch, rng, top)
        tokens.append(ch)
        values.append(lp)
        tops.append(dict(alts))
        offsets.append(i)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
