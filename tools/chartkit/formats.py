"""The words values.yaml's `# @schema` lines use: each names one kind of value (a DNS-1123 label, a
Kubernetes quantity, a gs:// URL, ...) once, with its JSON Schema and the phrase the docs table shows.

Free strings refuse control characters (`text`): a newline in a value would start a new key or line in a
template or a command line. Every pattern here is anchored, and `$` is the end of the text for Helm's engine
and for chartkit.values (which reads `$` the same way).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
# Kubernetes' own rules (apimachinery validation): DNS-1123 label and subdomain, label value, qualified name.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_QUALIFIED_NAME = rf"^({_SUBDOMAIN}/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# Docker's reference grammar, narrowed: registry[:port]/path, tag, digest.
_REPOSITORY = r"[A-Za-z0-9][A-Za-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_PATH_TEXT = r"[^\x00-\x1f\x7f]*"

QUANTITY = {"anyOf": [{"type": "string", "pattern": _QUANTITY}, {"type": "integer", "minimum": 0}]}


@dataclass(frozen=True)
class Format:
    """One kind of value: its schema, what `NAME?` (or empty) makes of it, and its phrase in the docs."""

    schema: dict
    doc: str
    # How `NAME?` also takes "": "pattern" wraps the pattern in (...)?, "anyOf" adds an empty alternative (so an
    # if/then rule can demand the non-empty one), "null" also takes null (integers).
    empty: str = "pattern"

    def of(self, optional: bool) -> dict:
        """The schema, also taking the empty value when optional."""
        schema = copy.deepcopy(self.schema)
        if not optional:
            return schema
        if self.empty == "anyOf":
            # The kind first: of alternatives that fail alike, Helm 3 reports the first ("Does not match pattern").
            return {"anyOf": [schema, {"type": "string", "maxLength": 0}]}
        if self.empty == "null":
            schema["type"] = [schema["type"], "null"]
            return schema
        pattern = schema["pattern"]
        schema["pattern"] = f"^({pattern[1:-1]})?$"
        schema.pop("minLength", None)
        return schema


def _string(pattern: str, doc: str, empty: str = "pattern", **limits: int) -> Format:
    return Format({"type": "string", **limits, "pattern": pattern}, doc, empty)


FORMATS: dict[str, Format] = {
    "string": _string(NO_CONTROL, "text"),
    "text": _string(NO_CONTROL, "text"),
    "integer": Format({"type": "integer"}, "whole number", "null"),
    "number": Format({"type": "number"}, "number", "null"),
    "boolean": Format({"type": "boolean"}, "true/false"),
    "object": Format({"type": "object"}, "mapping, passed on as is"),
    "array": Format({"type": "array"}, "list"),
    "dns-label": _string(f"^{_LABEL}$", "DNS-1123 label", minLength=1, maxLength=63),
    "dns-subdomain": _string(f"^{_SUBDOMAIN}$", "DNS-1123 subdomain", minLength=1, maxLength=253),
    "image-repository": _string(f"^{_REPOSITORY}$", "image repository", minLength=1, maxLength=255),
    "image-tag": _string(f"^{_TAG}$", "image tag"),
    "image-digest": _string(r"^sha256:[a-f0-9]{64}$", "image digest (sha256:64 hex digits)"),
    "image-ref": _string(
        rf"^{_REPOSITORY}(:{_TAG})?(@sha256:[a-f0-9]{{64}})?$", "image[:tag][@digest]", minLength=1, maxLength=512
    ),
    "label-key": _string(
        _QUALIFIED_NAME,
        "label key (Kubernetes' rules, e.g. cloud.google.com/gce-topology-block)",
        "anyOf",
        maxLength=316,
    ),
    "env-name": _string(r"^[A-Za-z_][A-Za-z0-9_]*$", "environment variable name", minLength=1),
    "capability": _string(r"^[A-Z_]+$", "Linux capability, e.g. IPC_LOCK"),
    "secret-key": _string(r"^[-._A-Za-z0-9]+$", "Secret key name", minLength=1, maxLength=253),
    "abs-path": _string(f"^/{_PATH_TEXT}$", "absolute path"),
    "json-path": _string(rf"^/{_PATH_TEXT}\.json$", "absolute path of a .json file"),
    "index-path": _string(rf"^[^/\x00-\x1f\x7f]{_PATH_TEXT}\.json$", "relative path of a .json file", minLength=1),
    "gs-url": _string(rf"^gs://[a-z0-9][a-z0-9._-]{{1,221}}[a-z0-9](/{_PATH_TEXT})?$", "gs://BUCKET[/PREFIX]", "anyOf"),
    "http-url": _string(r"^https?://[^/\x00-\x20\x7f]+/?$", "http(s)://HOST[:PORT]", "anyOf"),
    "ais-bucket": _string(r"^[A-Za-z0-9._-]+$", "AIS bucket name", minLength=1),
    "ngc-instance": _string(r"^[a-z0-9]+\.[a-z0-9]+\.[0-9]+\.[a-z0-9]+$", "NGC instance type"),
    "ngc-runtime": _string(r"^([0-9]+D)?([0-9]+H)?([0-9]+M)?([0-9]+S)?$", "[nD][nH][nM][nS]", minLength=2),
    "ngc-label": _string(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$", "NGC label"),
    "prometheus-duration": _string(
        r"^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?)$",
        "Prometheus duration (30s, 1m)",
        minLength=1,
    ),
    "number-or-text": Format({"type": ["integer", "string"], "pattern": NO_CONTROL}, "number or text"),
    "quantity": Format(QUANTITY, "Kubernetes quantity (64Gi, 500m, 8)"),
    "quantities": Format({"type": "object", "additionalProperties": QUANTITY}, "resource name: quantity"),
    "labels": Format(
        {
            "type": "object",
            "additionalProperties": {"type": "string", "pattern": _LABEL_VALUE, "maxLength": 63},
            "propertyNames": {"pattern": _QUALIFIED_NAME},
        },
        "label key: label value (Kubernetes' rules)",
    ),
    "annotations": Format(
        {
            "type": "object",
            "additionalProperties": {"type": "string", "pattern": NO_CONTROL},
            "propertyNames": {"pattern": _QUALIFIED_NAME},
        },
        "annotation key: text",
    ),
}


def described(schema: dict) -> str:
    """What a schema node takes, in the docs' words (a kind named here, one of an enum, a range), for messages
    that would otherwise quote a pattern or say only that no alternative of an anyOf fits."""
    node = {key: value for key, value in schema.items() if key not in ("description", "$comment")}
    for form in FORMATS.values():
        if node == form.of(False):
            return form.doc
        if (form.empty != "pattern" or "pattern" in form.schema) and node == form.of(True):
            return f"{form.doc} or empty" if form.empty != "null" else f"{form.doc} or null"
    if "anyOf" in node or "oneOf" in node:
        return " or ".join(described(branch) for branch in node.get("anyOf") or node["oneOf"])
    if node.get("maxLength") == 0 or node.get("maxItems") == 0:
        return "empty"
    if "enum" in node:
        return "one of " + ", ".join(map(str, node["enum"]))
    if "const" in node:
        return json.dumps(node["const"])
    if "pattern" in node:
        return f"text matching {node['pattern']}"
    low, high = node.get("minimum"), node.get("maximum")
    kind = {"integer": "a whole number", "number": "a number", "boolean": "true or false"}.get(
        str(node.get("type")), ""
    )
    bounds = f" from {low} to {high}" if low is not None and high is not None else ""
    bounds = bounds or (f" >= {low}" if low is not None else (f" <= {high}" if high is not None else ""))
    return (kind or str(node.get("type", "a value"))) + bounds
