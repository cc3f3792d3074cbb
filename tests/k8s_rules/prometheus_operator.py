"""The PodMonitor's shape, as prometheus-operator documents its monitoring.coreos.com/v1 API.

The CRD itself is not vendored under tests/crds (a fetched file the lead has yet to add), so a PodMonitor is NOT
validated against its CRD like the other custom resources: this is a strict JSON Schema written from the documented
fields the chart uses or could use (PodMonitorSpec: selector, namespaceSelector, podMetricsEndpoints, jobLabel,
podTargetLabels; PodMetricsEndpoint: port, portNumber, targetPort, path, scheme, interval, scrapeTimeout,
honorLabels), so a misspelt or invented field, or a duration Prometheus cannot read, fails.
"""

from __future__ import annotations

import jsonschema

# The operator's Duration pattern (monitoring/v1 types.go): 30s, 1m30s, 500ms.
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": LABELS, "matchExpressions": {"type": "array", "items": {"type": "object"}}},
}
ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "portNumber": {"type": "integer", "minimum": 1, "maximum": 65535},
        "targetPort": {"type": ["integer", "string"]},
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": {"type": "string", "pattern": DURATION},
        "scrapeTimeout": {"type": "string", "pattern": DURATION},
        "honorLabels": {"type": "boolean"},
    },
}
PODMONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
}


def podmonitor_problems(obj: dict) -> list[str]:
    """What the documented PodMonitor API does not allow in `obj`, one line each."""
    validator = jsonschema.Draft7Validator(PODMONITOR)
    name = obj.get("metadata", {}).get("name")
    return [f"PodMonitor/{name} {'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
