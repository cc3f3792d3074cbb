"""The vendored CRDs' CEL validation rules (x-kubernetes-validations), evaluated as the API server does.

How kube-apiserver runs them (k8s.io/apiextensions-apiserver, pkg/apiserver/schema/cel/validation.go):
- a rule runs on every value its schema node describes that is present in the object: object properties,
  array items, map values (additionalProperties), after the schema's defaults were applied;
- a transition rule (one naming `oldSelf`) runs on update only, and only where the old object has a value at
  the correlated place: the same property, the same map key, or the list item with the same keys in a
  `x-kubernetes-list-type: map` list; with `optionalOldSelf: true` it runs always, `oldSelf` an optional;
- a failed rule reports `messageExpression`'s string when it evaluates to a non-empty one, else `message`,
  else "failed rule: RULE", at the field path (plus the rule's `fieldPath`).
The CEL language is cel-python's (`celpy`); the Kubernetes additions the vendored rules need are below.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import yaml
from celpy import celtypes

CRDS = Path(__file__).resolve().parents[1] / "crds"
CRD_FILES = {
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
    "AIStore": "ais.nvidia.com_aistores.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
}
# Functions and macros the vendored rules call (test_cel_rules_call_only_known_functions keeps this true);
# all are CEL's own; the Kubernetes libraries (lists, strings, quantity, url...) are not needed yet.
FUNCTIONS = {"has", "size", "matches", "exists", "all", "filter"}
# optionalOldSelf's `oldSelf` is an optional: these are the optional library's members a rule can call.
OPTIONAL_FUNCTIONS = {"hasValue", "value", "orValue"}
MISSING = object()


class CelRuleError(AssertionError):
    """A rule the evaluator cannot parse or run: a test failure naming the CRD, the field and the rule."""


@dataclass(frozen=True)
class Rule:
    """One x-kubernetes-validations entry at its schema location."""

    kind: str
    path: str  # the schema location, `[]` for array items and `{}` for map values
    rule: str
    message: str = ""
    message_expression: str = ""
    field_path: str = ""
    optional_old_self: bool = False

    @property
    def transition(self) -> bool:
        return re.search(r"\boldSelf\b", self.rule) is not None


class Optional:
    """CEL's optional value, what `oldSelf` is for a rule with optionalOldSelf: true."""

    def __init__(self, value: Any = MISSING):
        self.value = value


def _has_value(optional: Optional) -> celtypes.BoolType:
    return celtypes.BoolType(optional.value is not MISSING)


def _value(optional: Optional) -> Any:
    if optional.value is MISSING:
        raise ValueError("optional.none() dereference")
    return optional.value


def _or_value(optional: Optional, default: Any) -> Any:
    return default if optional.value is MISSING else optional.value


OPTIONAL_LIBRARY = {"hasValue": _has_value, "value": _value, "orValue": _or_value}


@cache
def crd_schema(kind: str) -> dict:
    """The openAPIV3Schema of the CRD's served storage version."""
    crd = yaml.load((CRDS / CRD_FILES[kind]).read_text(), Loader=yaml.CSafeLoader)  # libyaml: 10x faster
    version = next(v for v in crd["spec"]["versions"] if v.get("storage", True))
    return version["schema"]["openAPIV3Schema"]


def _children(schema: dict, path: str):
    for name, sub in (schema.get("properties") or {}).items():
        yield sub, f"{path}.{name}" if path else name
    if isinstance(schema.get("items"), dict):
        yield schema["items"], f"{path}[]"
    if isinstance(schema.get("additionalProperties"), dict):
        yield schema["additionalProperties"], f"{path}{{}}"


class RuleSet:
    """A schema's rules, indexed by the schema node they sit on (so a walk finds them without searching)."""

    def __init__(self, kind: str, schema: dict):
        self.kind, self.schema = kind, schema
        self.at: dict[int, tuple[Rule, ...]] = {}
        self.below: dict[int, bool] = {}  # whether a node or anything under it has a rule (prunes the walk)
        self.rules: list[Rule] = []
        self._collect(schema, "")

    def _collect(self, schema: dict, path: str) -> bool:
        here = tuple(
            Rule(
                self.kind,
                path,
                entry["rule"],
                entry.get("message", ""),
                entry.get("messageExpression", ""),
                entry.get("fieldPath", ""),
                bool(entry.get("optionalOldSelf", False)),
            )
            for entry in schema.get("x-kubernetes-validations") or []
        )
        self.at[id(schema)] = here
        self.rules += here
        found = bool(here)
        for sub, sub_path in _children(schema, path):
            found = self._collect(sub, sub_path) or found
        self.below[id(schema)] = found
        return found


@cache
def ruleset(kind: str) -> RuleSet:
    """The rules of a vendored CRD."""
    return RuleSet(kind, crd_schema(kind))


def rules(kind: str) -> tuple[Rule, ...]:
    """Every CEL rule of a CRD, wherever it sits in the schema."""
    return tuple(ruleset(kind).rules)


@cache
def _environment() -> celpy.Environment:
    return celpy.Environment()


@cache
def program(expression: str) -> celpy.Runner:
    """A compiled CEL program (cached: each rule is parsed once per process)."""
    env = _environment()
    try:
        return env.program(env.compile(expression), functions=OPTIONAL_LIBRARY)
    except Exception as error:  # celpy's parse errors share no base class worth naming here
        raise CelRuleError(f"cannot parse CEL {expression!r}: {str(error).splitlines()[0]}") from error


def check_parses(kind: str) -> list[str]:
    """Rules of a CRD the evaluator cannot parse, each named by CRD and field."""
    failures = []
    for rule in rules(kind):
        for expression in filter(None, (rule.rule, rule.message_expression)):
            try:
                program(expression)
            except CelRuleError as error:
                failures.append(f"{kind} {rule.path}: {error}")
    return failures


def with_defaults(schema: dict, value: Any) -> Any:
    """`value` with the schema's `default`s filled in where a field is absent, as the API server stores it."""
    if isinstance(value, dict):
        out = dict(value)
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            if name in out:
                out[name] = with_defaults(sub, out[name])
            elif "default" in sub:
                out[name] = with_defaults(sub, copy.deepcopy(sub["default"]))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in out.keys() - properties.keys():
                out[name] = with_defaults(extra, out[name])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [with_defaults(schema["items"], item) for item in value]
    return value


def _type_name(value: Any) -> str:
    """How the API server names a value's type in `Invalid value: "TYPE"`."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def _old_item(schema: dict, item: Any, old: Any) -> Any:
    """The old list item a new one correlates with: same keys in a list-type map, nothing otherwise."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(old, list) or not isinstance(item, dict):
        return MISSING
    keys = schema.get("x-kubernetes-list-map-keys") or []
    return next((o for o in old if isinstance(o, dict) and all(o.get(k) == item.get(k) for k in keys)), MISSING)


@dataclass
class Evaluation:
    """The refusals of one object, and which rules ran (for the per-CRD counts)."""

    problems: list[str]
    ran: Counter


def _run(rule: Rule, value: Any, old: Any, where: str, out: Evaluation) -> None:
    if rule.transition and old is MISSING and not rule.optional_old_self:
        return  # the API server skips a transition rule on create and where nothing correlates
    activation: dict[str, Any] = {"self": celpy.json_to_cel(value)}
    if rule.transition:
        old_cel = MISSING if old is MISSING else celpy.json_to_cel(old)
        activation["oldSelf"] = Optional(old_cel) if rule.optional_old_self else old_cel
    out.ran[(rule.kind, rule.path, rule.rule)] += 1
    try:
        result = program(rule.rule).evaluate(activation)
    except CelRuleError:
        raise
    except Exception as error:
        raise CelRuleError(f"{rule.kind} {where}: rule {rule.rule!r} failed to run: {error}") from error
    if result is True or (isinstance(result, celtypes.BoolType) and bool(result)):
        return
    message = rule.message or f"failed rule: {rule.rule}"
    if rule.message_expression:
        try:
            text = program(rule.message_expression).evaluate(activation)
            message = str(text) if isinstance(text, str) and text.strip() else message
        except Exception:  # the API server falls back to `message` when messageExpression fails
            pass
    field = where + rule.field_path if rule.field_path else where
    out.problems.append(f'{field or "<root>"}: Invalid value: "{_type_name(value)}": {message}')


def _walk(rs: RuleSet, schema: dict, value: Any, old: Any, where: str, out: Evaluation) -> None:
    if not rs.below.get(id(schema)):
        return
    for rule in rs.at[id(schema)]:
        _run(rule, value, old, where, out)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            if name in value:
                before = old.get(name, MISSING) if isinstance(old, dict) else MISSING
                _walk(rs, sub, value[name], before, f"{where}.{name}" if where else name, out)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in value.keys() - properties.keys():
                before = old.get(name, MISSING) if isinstance(old, dict) else MISSING
                _walk(rs, extra, value[name], before, f"{where}[{name}]", out)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _walk(rs, schema["items"], item, _old_item(schema, item, old), f"{where}[{i}]", out)


def evaluate(obj: dict, old: dict | None = None, rs: RuleSet | None = None) -> Evaluation:
    """Every CEL rule `obj` breaks (as an update of `old` when given), with the rules that ran.

    The rules are the object's own CRD's unless `rs` is given (a test's hand-made schema).
    """
    rs = rs or ruleset(obj["kind"])
    out = Evaluation([], Counter())
    new = with_defaults(rs.schema, obj)
    before = with_defaults(rs.schema, old) if old is not None else MISSING
    _walk(rs, rs.schema, new, before, "", out)
    return out
