"""Kubernetes' name checks and field-error wording (k8s.io/apimachinery pkg/util/validation and .../field).

Ported from https://github.com/kubernetes/apimachinery/blob/master/pkg/util/validation/validation.go
(IsDNS1035Label, IsDNS1123Label, IsDNS1123Subdomain, IsDomainPrefixedPath, IsValidLabelValue) and
pkg/util/validation/field/errors.go (how Invalid, Required, Forbidden, NotSupported print), so a refusal
reads as the API server's would: `spec.runtimePatches.manager: Invalid value: "x": must be a domain-...`.
"""

from __future__ import annotations

import json
import re
from typing import Any

DNS1035_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FMT = rf"{DNS1123_LABEL_FMT}(\.{DNS1123_LABEL_FMT})*"
HTTP_PATH_FMT = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"
LABEL_VALUE_FMT = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"


def _regex_error(message: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    listed = ", ".join(f"'{e}'" for e in examples)
    return f"{message} (e.g. {listed}, regex used for validation is '{fmt}')"


def dns1035_label(value: str) -> list[str]:
    """IsDNS1035Label's messages (empty when valid)."""
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not re.fullmatch(DNS1035_FMT, value):
        errors.append(
            _regex_error(
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                "alphabetic character, and end with an alphanumeric character",
                DNS1035_FMT,
                "my-name",
                "abc-123",
            )
        )
    return errors


def dns1123_subdomain(value: str) -> list[str]:
    """IsDNS1123Subdomain's messages (empty when valid)."""
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not re.fullmatch(DNS1123_SUBDOMAIN_FMT, value):
        errors.append(
            _regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character",
                DNS1123_SUBDOMAIN_FMT,
                "example.com",
            )
        )
    return errors


def label_value(value: str) -> list[str]:
    """IsValidLabelValue's messages (empty when valid)."""
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not re.fullmatch(LABEL_VALUE_FMT, value):
        errors.append(
            _regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                "and must start and end with an alphanumeric character",
                LABEL_VALUE_FMT,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errors


def shown(value: Any) -> str:
    """A value as field.Invalid prints it: strings quoted, numbers bare, structures as JSON."""
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)


def invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {shown(value)}: {detail}"


def required(path: str, detail: str = "") -> str:
    return f"{path}: Required value" + (f": {detail}" if detail else "")


def forbidden(path: str, detail: str) -> str:
    return f"{path}: Forbidden: {detail}"


def not_supported(path: str, value: Any, supported: list[str]) -> str:
    return f"{path}: Unsupported value: {shown(value)}: supported values: " + ", ".join(
        json.dumps(s) for s in supported
    )


def domain_prefixed_path(path: str, value: str) -> list[str]:
    """IsDomainPrefixedPath: `acme.io/foo`, a DNS-1123 subdomain, a slash, HTTP path characters."""
    if not value:
        return [required(path)]
    host, slash, rest = value.partition("/")
    if not slash or not host or not rest:
        return [invalid(path, value, 'must be a domain-prefixed path (such as "acme.io/foo")')]
    errors = [invalid(path, host, message) for message in dns1123_subdomain(host)]
    if not re.fullmatch(HTTP_PATH_FMT, rest):
        errors.append(invalid(path, rest, _regex_error("Invalid path", HTTP_PATH_FMT)))
    return errors
