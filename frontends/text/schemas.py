"""JSON schemas the grammar converter can enforce, or a 400.

llama-cpp-python's ``json_schema_to_gbnf`` (the converter behind
``json_schema``, ``response_format`` and tool parameters) silently drops
what it does not implement: numeric bounds, ``not``/``if``, ``uniqueItems``,
``patternProperties``, min/maxProperties, the other keywords beside a
``$ref``, ``anyOf`` or a type list, ``minLength`` beside a ``pattern``, most
``format``s. A grammar built from such a schema lets the model write JSON
that does not validate -- the "accepted and ignored" answers of llama.cpp
issues 24097 and 10732. ``enforceable`` walks the schema first and answers
400 for anything the converter would not enforce exactly.

Invariant: every string that matches the grammar of a schema returned by
``enforceable`` validates against the schema the client sent. Where that
needs it, the schema is rewritten into an equivalent one the converter reads
correctly (a type list with constraints becomes an ``anyOf`` of one type
each; ``true`` sub-schemas become ``{}``; a one-element ``allOf`` is
inlined). The converter is stricter than JSON Schema in places (an object
gets no properties beyond ``properties`` unless ``additionalProperties``
says so; a tuple gets no extra items); stricter is still conforming.
"""
from __future__ import annotations

import json
import re

from .errors import bad

# Keywords that only annotate: ignoring them changes nothing a validator checks.
ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "example", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "nullable", "discriminator", "contentMediaType", "contentEncoding", "$anchor",
})
TYPES = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
# Keywords the converter implements, and for which type (None: any).
STRING_KW = frozenset({"pattern", "minLength", "maxLength", "format"})
ARRAY_KW = frozenset({"items", "prefixItems", "minItems", "maxItems"})
OBJECT_KW = frozenset({"properties", "required", "additionalProperties"})
KIND_KW = {"string": STRING_KW, "array": ARRAY_KW, "object": OBJECT_KW}
DEFS = ("$defs", "definitions")
MAX_DEPTH = 64
ANY = {"type": ["string", "number", "boolean", "null", "object", "array"]}  # any value, in converter form


def _fail(path: str, why: str):
    raise bad(f"json_schema{path}: {why} (the grammar cannot enforce it)")


def _type_ok(v, t: str) -> bool:
    return {"string": isinstance(v, str), "boolean": isinstance(v, bool), "null": v is None,
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
            "array": isinstance(v, list), "object": isinstance(v, dict)}[t]


def _count(v, key: str, path: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        _fail(f"{path}.{key}", "must be a non-negative integer")
    return v


def _ref(ref, path: str, root: dict) -> None:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        _fail(path, f"only local '#/...' references are supported, not {ref!r}")
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            _fail(path, f"reference {ref!r} does not resolve")
        node = node[part]


def _only(s: dict, t: str) -> dict:
    """``s`` as a schema of type ``t`` alone: the keywords of the other types
    do not apply to a ``t`` value (JSON Schema), so they are dropped."""
    other = (STRING_KW | ARRAY_KW | OBJECT_KW) - KIND_KW.get(t, frozenset())
    return {**{k: v for k, v in s.items() if k not in other and k != "type"}, "type": t}


def _disjoint(alts: list) -> bool:
    """oneOf is enforceable as anyOf only if no value can match two branches:
    here, each branch a const/enum with values no other has, or each branch of
    its own single type (integer and number overlap)."""
    seen: list = []
    if all(isinstance(a, dict) and ("const" in a or "enum" in a) for a in alts):
        for a in alts:
            vals = [a["const"]] if "const" in a else list(a["enum"])
            keys = {json.dumps(v, sort_keys=True) for v in vals}
            if any(keys & s for s in seen):
                return False
            seen.append(keys)
        return True
    kinds = []
    for a in alts:
        t = a.get("type") if isinstance(a, dict) else None
        if not isinstance(t, str) or "$ref" in a or "anyOf" in a or "oneOf" in a:
            return False
        kinds.append("number" if t == "integer" else t)
    return len(set(kinds)) == len(kinds)


class _Walk:
    def __init__(self, root: dict):
        self.root = root

    def node(self, s, path: str, depth: int = 0):
        """A checked (possibly rewritten) copy of sub-schema ``s``."""
        if depth > MAX_DEPTH:
            _fail(path, "nested too deeply")
        if s is True:
            return {}
        if not isinstance(s, dict):
            _fail(path, "a schema must be an object (or true)")
        s = dict(s)
        for k in list(s):
            if k in ANNOTATIONS or k.startswith("x-"):
                s.pop(k)
        if "allOf" in s:
            s = self._all_of(s, path)
        t = s.get("type")
        if isinstance(t, list):
            if not t or not all(isinstance(x, str) and x in TYPES for x in t):
                _fail(f"{path}.type", f"unknown type {t!r}")
            if len(t) == 1:
                s["type"] = t[0]
            else:  # the converter drops every sibling keyword of a type list: one branch per type
                return self.node({"anyOf": [_only(s, x) for x in t]}, path, depth)
        elif t is not None and t not in TYPES:
            _fail(f"{path}.type", f"unknown type {t!r}")
        keys = set(s) - set(DEFS)
        if "$ref" in s:
            if keys - {"$ref"}:
                _fail(path, "keywords beside '$ref' are ignored")
            _ref(s["$ref"], f"{path}.$ref", self.root)
            s.update(self._defs(s, path, depth))
            return s
        for alt in ("anyOf", "oneOf"):
            if alt in s:
                if keys - {alt, "type"} or not isinstance(s[alt], list) or not s[alt]:
                    _fail(path, f"'{alt}' must be a non-empty array with no other keywords beside it")
                if alt == "oneOf" and not _disjoint(s[alt]):
                    _fail(path, "'oneOf' alternatives may overlap (exactly one must match); use anyOf")
                alts = [self.node(a, f"{path}.{alt}[{i}]", depth + 1) for i, a in enumerate(s[alt])]
                if t is not None:  # the converter ignores the sibling type: push it into each branch
                    alts = [self._with_type(a, t, f"{path}.{alt}[{i}]") for i, a in enumerate(alts)]
                return {"anyOf": alts, **self._defs(s, path, depth)}
        if "const" in s or "enum" in s:
            return self._values(s, t, keys, path)
        allowed = {"type"}
        kind = t
        if kind is None:  # the converter picks the kind from the keywords it sees
            kind = "object" if keys & OBJECT_KW else "array" if keys & ARRAY_KW else "string" if keys & STRING_KW else None
            if sum(bool(keys & kw) for kw in (OBJECT_KW, ARRAY_KW, STRING_KW)) > 1:
                _fail(path, "keywords of several types without a 'type'")
        if kind == "object":
            allowed |= OBJECT_KW
            self._object(s, path, depth)
        elif kind == "array":
            allowed |= ARRAY_KW
            self._array(s, path, depth)
        elif kind == "string":
            allowed |= STRING_KW
            self._string(s, t, path)
        unknown = sorted(keys - allowed)
        if unknown:
            _fail(path, f"unsupported keyword(s) {', '.join(unknown)}" + (f" for type {kind}" if kind else ""))
        s.update(self._defs(s, path, depth))
        return s

    def _defs(self, s: dict, path: str, depth: int) -> dict:
        out = {}
        for d in DEFS:
            if d in s:
                if not isinstance(s[d], dict):
                    _fail(f"{path}.{d}", "must be an object")
                out[d] = {k: self.node(v, f"{path}.{d}.{k}", depth + 1) for k, v in s[d].items()}
        return out

    @staticmethod
    def _with_type(a: dict, t, path: str) -> dict:
        if "anyOf" in a:
            return {**a, "anyOf": [_Walk._with_type(x, t, path) for x in a["anyOf"]]}
        if "$ref" in a:
            _fail(path, "a '$ref' inside an anyOf with a sibling 'type'")
        have = a.get("type")
        if have is None:
            return {**a, "type": t}
        if have != t and not (t == "number" and have == "integer"):
            _fail(path, f"type {have!r} contradicts the outer type {t!r}")
        return a

    def _all_of(self, s: dict, path: str) -> dict:
        parts = s.pop("allOf")
        if not isinstance(parts, list) or not parts:
            _fail(f"{path}.allOf", "must be a non-empty array")
        if len(parts) == 1 and isinstance(parts[0], dict) and not set(s) - set(DEFS) - {"type"}:
            inner = dict(parts[0])
            if "type" in s and inner.get("type", s["type"]) != s["type"]:
                _fail(path, "allOf contradicts the sibling type")
            return {**{k: v for k, v in s.items() if k in DEFS}, **inner}
        # Several parts: the converter merges their properties (and nothing else) into one object.
        if set(s) - set(DEFS) - {"type"} or s.get("type", "object") != "object":
            _fail(path, "allOf beside other keywords")
        props, required = {}, []
        for i, p in enumerate(parts):
            if not isinstance(p, dict) or set(p) - {"type", "properties", "required"} - ANNOTATIONS \
                    or p.get("type", "object") != "object":
                _fail(f"{path}.allOf[{i}]", "only object parts with properties/required can be merged")
            for k, v in (p.get("properties") or {}).items():
                if k in props:
                    _fail(f"{path}.allOf[{i}]", f"property {k!r} appears twice")
                props[k] = v
            required += list(p.get("required") or [])
        return {**{k: v for k, v in s.items() if k in DEFS}, "type": "object", "properties": props,
                "required": required, "additionalProperties": False}

    @staticmethod
    def _values(s: dict, t, keys: set, path: str) -> dict:
        if keys - {"const", "enum", "type"}:
            _fail(path, "keywords beside 'const'/'enum' are ignored")
        if "enum" in s and (not isinstance(s["enum"], list) or not s["enum"]):
            _fail(f"{path}.enum", "must be a non-empty array")
        vals = [s["const"]] if "const" in s else s["enum"]
        if "const" in s and "enum" in s and s["const"] not in s["enum"]:
            _fail(path, "const is not in enum")
        if t is not None and not all(_type_ok(v, t) for v in vals):
            _fail(path, f"a const/enum value is not of type {t!r}")
        return {"const": s["const"]} if "const" in s else {"enum": list(vals)}

    def _object(self, s: dict, path: str, depth: int) -> None:
        props = s.get("properties", {})
        if not isinstance(props, dict):
            _fail(f"{path}.properties", "must be an object")
        req = s.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            _fail(f"{path}.required", "must be an array of strings")
        out = {}
        for k, v in props.items():
            if v is False:
                if k in req:
                    _fail(f"{path}.properties.{k}", "a required property with schema false")
                continue
            out[k] = self.node(v, f"{path}.properties.{k}", depth + 1)
        for r in req:  # the converter only ever writes keys listed in properties
            if r not in out:
                _fail(f"{path}.required", f"required property {r!r} is not in properties")
        if "properties" in s or out:
            s["properties"] = out
        ap = s.get("additionalProperties")
        if isinstance(ap, dict):
            s["additionalProperties"] = self.node(ap, f"{path}.additionalProperties", depth + 1)
        elif not isinstance(ap, bool) and ap is not None:
            _fail(f"{path}.additionalProperties", "must be a boolean or a schema")

    def _array(self, s: dict, path: str, depth: int) -> None:
        items, prefix = s.get("items"), s.get("prefixItems")
        lo = _count(s.get("minItems", 0), "minItems", path)
        hi = s.get("maxItems")
        if hi is not None and _count(hi, "maxItems", path) < lo:
            _fail(path, "maxItems < minItems")
        if prefix is not None:
            # a tuple: the converter writes exactly these items, no more
            if not isinstance(prefix, list) or items not in (None, False) or "minItems" in s or hi is not None:
                _fail(path, "prefixItems with items, minItems or maxItems")
            s.pop("items", None)
            s["prefixItems"] = [self.node(x, f"{path}.prefixItems[{i}]", depth + 1) for i, x in enumerate(prefix)]
            return
        if isinstance(items, list):  # draft-04 tuple form
            s["items"] = [self.node(x, f"{path}.items[{i}]", depth + 1) for i, x in enumerate(items)]
            if "minItems" in s or hi is not None:
                _fail(path, "tuple items with minItems or maxItems")
            return
        if items is False:
            _fail(f"{path}.items", "false")
        # no items: any values (the converter would drop min/maxItems on a bare array)
        s["items"] = self.node(items, f"{path}.items", depth + 1) if items is not None else {}
        if not s["items"]:  # the converter reads {} items as absent and fails; min/maxItems need items
            if "minItems" in s or hi is not None:
                s["items"] = ANY
            else:
                del s["items"]  # a bare array: the converter's any-array rule

    @staticmethod
    def _string(s: dict, t, path: str) -> None:
        fmt, pat = s.get("format"), s.get("pattern")
        has_len = "minLength" in s or "maxLength" in s
        if t != "string" and has_len:
            _fail(path, "minLength/maxLength need 'type': 'string'")
        if fmt is not None:
            if fmt not in FORMATS:
                _fail(f"{path}.format", f"format {fmt!r} is not supported (supported: {', '.join(sorted(FORMATS))})")
            if pat is not None or has_len:
                _fail(path, "format beside pattern, minLength or maxLength")
        if pat is not None:
            if not isinstance(pat, str) or not pat.startswith("^") or not pat.endswith("$"):
                _fail(f"{path}.pattern", "a pattern must be anchored with ^ and $")
            if re.search(r"\(\?[=!<]|\\[1-9bBk]", pat):
                _fail(f"{path}.pattern", "lookarounds, backreferences and word boundaries")
            if has_len:
                _fail(path, "pattern beside minLength or maxLength")
        if has_len:
            lo = _count(s.get("minLength", 0), "minLength", path)
            hi = s.get("maxLength")
            if hi is not None and _count(hi, "maxLength", path) < lo:
                _fail(path, "maxLength < minLength")


def enforceable(schema) -> dict:
    """The schema, rewritten where needed, if the converter enforces all of
    it; else an ApiError 400 naming the first part it would ignore."""
    if schema is True:
        return {}
    if not isinstance(schema, dict):
        raise bad("json_schema must be an object")
    return _Walk(schema).node(schema, "")
