"""SIMULATION ONLY: kube-apiserver's ValidatingAdmissionPolicy step, which the embedded apiserver lacks.

Owns two things:

* :func:`annotation_policy`: the chart's annotation policy and its binding, built from the one file the
  chart's template also reads (``charts/hami/files/annotation-policy.yaml``) with the same ``writers``
  variable put in front, so the embedded cluster enforces exactly the expressions the chart ships.
* :func:`conditions_hold`: a webhook's ``matchConditions`` (kube-apiserver evaluates them before it calls
  the webhook; :mod:`hami_testkit.admission_standin` uses this).
* :func:`review`: the verdict of stored ValidatingAdmissionPolicies and their bindings on one
  AdmissionRequest-shaped dict, evaluated with a real CEL engine (``cel``, PyPI
  ``common-expression-language``, with its cel-go-style extensions such as ``join``, which
  Kubernetes' CEL has too): ``matchConstraints.resourceRules`` (group, version, resource or
  ``resource/subresource``, operation) and ``excludeResourceRules``, ``matchConditions``, ``variables``
  (in order, each visible to the later ones as ``variables.<name>``), ``validations`` (``expression``,
  ``messageExpression``, ``message``, ``reason`` -> HTTP status) and ``failurePolicy``. A binding acts
  when its ``validationActions`` hold ``Deny``.

Differences from kube-apiserver, none of which our policies use: no ``paramKind``/``paramRef``, no
``namespaceSelector``/``objectSelector`` (a policy or binding that sets one is treated as matching
nothing and named in :data:`UNSUPPORTED`), no ``auditAnnotations``, and variables are evaluated eagerly
(an error in any of them fails the policy per its ``failurePolicy``; Kubernetes evaluates them lazily).
Must not import ``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import cel
import cel.stdlib
import yaml

from hami import objects

JsonDict = dict[str, Any]

POLICY_GROUP_VERSION = "admissionregistration.k8s.io/v1"
POLICIES_PATH = f"/apis/{POLICY_GROUP_VERSION}/validatingadmissionpolicies"
BINDINGS_PATH = f"/apis/{POLICY_GROUP_VERSION}/validatingadmissionpolicybindings"
#: The chart's policy name for release "hami" (``<fullname>-annotations``).
ANNOTATION_POLICY = "hami-annotations"
#: Status codes of a denial by ``reason`` (Kubernetes' table; anything else is Invalid, 422).
REASON_CODES = {"Unauthorized": 401, "Forbidden": 403, "RequestEntityTooLarge": 413, "Invalid": 422}
UNSUPPORTED = ("paramKind", "paramRef", "namespaceSelector", "objectSelector")


def policy_source() -> Traversable:
    """The shared logic file: ``testkit/hami_testkit/annotation-policy.yaml``, a link to the chart's
    ``files/annotation-policy.yaml`` in a checkout and a copy of it in the wheel and the image."""
    return resources.files("hami_testkit").joinpath("annotation-policy.yaml")


def service_account(namespace: str, name: str) -> str:
    """The username Kubernetes gives a service account's requests."""
    return f"system:serviceaccount:{namespace}:{name}"


def annotation_policy(
    writers: Sequence[str], *, name: str = ANNOTATION_POLICY, source: Path | Traversable | None = None
) -> tuple[JsonDict, JsonDict]:
    """The policy and its binding, as ``templates/webhook/annotation-policy.yaml`` builds them."""
    logic = yaml.safe_load((source or policy_source()).read_text(encoding="utf-8"))
    writers_cel = "[" + ", ".join(f"'{w}'" for w in writers) + "]"
    policy = {
        "apiVersion": POLICY_GROUP_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": logic["matchConstraints"],
            "variables": [{"name": "writers", "expression": writers_cel}, *logic["variables"]],
            "validations": logic["validations"],
        },
    }
    binding = {
        "apiVersion": POLICY_GROUP_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return policy, binding


@dataclass(frozen=True, slots=True, kw_only=True)
class Denial:
    """A policy refused the request; ``message`` is what kube-apiserver would answer."""

    policy: str
    binding: str
    message: str
    reason: str
    code: int


class _EvaluationError(Exception):
    pass


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    return cel.compile(expression)


_MENTION = re.compile(r"\bvariables\b")
_REFERENCE = re.compile(r"\bvariables\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


@functools.lru_cache(maxsize=512)
def _references(expression: str) -> frozenset[str] | None:
    """The names ``expression`` reads as ``variables.<name>`` (a superset: a string literal counts too),
    or None when it mentions ``variables`` any other way (it may read any of them)."""
    names = _REFERENCE.findall(expression)
    return frozenset(names) if len(names) == len(_MENTION.findall(expression)) else None


class _Scope:
    """One CEL context for every expression of one request: ``object``, ``oldObject`` and ``request`` are
    converted to CEL values once (the conversion of a whole pod is most of an expression's cost), and
    ``variables`` is bound again only when an expression reads one not bound yet (each binding makes the
    engine rebuild its environment)."""

    def __init__(self, activation: Mapping[str, Any]) -> None:
        self._context = cel.Context(variables=dict(activation))
        cel.stdlib.add_stdlib_to_context(self._context)
        self._bound: frozenset[str] | None = None  # the names ``variables`` holds (None: not bound)

    def evaluate(self, expression: str, variables: Mapping[str, Any] | None = None) -> Any:
        """The value of ``expression``; with ``variables`` (those evaluated so far, in order), it reads
        them as ``variables.<name>``: it sees the ones it names, with the values they have there, and
        all of them when it reads ``variables`` any other way or names one not evaluated yet (so its
        value or error is the one of a context holding exactly ``variables``)."""
        if variables is not None:
            needs = _references(expression)
            if needs is None or not needs <= (self._bound or frozenset()):
                self._context.add_variable("variables", dict(variables))
                self._bound = frozenset(variables)
        try:
            return _program(expression).execute(self._context)
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:
            raise _EvaluationError(f"expression {expression!r} resulted in error: {exc}") from exc


def _rule_matches(rule: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    resource = request.get("resource") or {}
    wanted = str(resource.get("resource", ""))
    if request.get("subResource"):
        wanted += f"/{request['subResource']}"
    operations = rule.get("operations") or []
    return (
        (request.get("operation") in operations or "*" in operations)
        and any(g in (resource.get("group", ""), "*") for g in rule.get("apiGroups") or [])
        and any(v in (resource.get("version", ""), "*") for v in rule.get("apiVersions") or [])
        and any(r in (wanted, "*") for r in rule.get("resources") or [])
    )


def _matches(spec: Mapping[str, Any], request: Mapping[str, Any]) -> bool:
    constraints = spec.get("matchConstraints") or {}
    if any(constraints.get(key) for key in UNSUPPORTED):
        return False
    return any(_rule_matches(r, request) for r in constraints.get("resourceRules") or []) and not any(
        _rule_matches(r, request) for r in constraints.get("excludeResourceRules") or []
    )


def _activation(request: Mapping[str, Any]) -> JsonDict:
    return {
        "object": request.get("object"),
        "oldObject": request.get("oldObject"),
        "request": {k: v for k, v in request.items() if k not in ("object", "oldObject")},
    }


def _verdict(spec: Mapping[str, Any], request: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(message, reason)`` of the first failed validation, or None; raises _EvaluationError."""
    scope = _Scope(_activation(request))  # matchConditions see no ``variables``, as in Kubernetes
    for condition in spec.get("matchConditions") or []:
        if scope.evaluate(str(condition["expression"])) is not True:
            return None
    variables: JsonDict = {}
    for variable in spec.get("variables") or []:
        variables[str(variable["name"])] = scope.evaluate(str(variable["expression"]), variables)
    for validation in spec.get("validations") or []:
        expression = str(validation["expression"])
        if scope.evaluate(expression, variables) is True:
            continue
        message = str(validation.get("message") or f"failed expression: {expression}")
        if validation.get("messageExpression"):
            try:
                text = scope.evaluate(str(validation["messageExpression"]), variables)
            except _EvaluationError:
                text = None
            if isinstance(text, str) and text.strip():
                message = text
        return message, str(validation.get("reason") or "Invalid")
    return None


def conditions_hold(conditions: Iterable[Mapping[str, Any]], request: Mapping[str, Any]) -> bool:
    """Do all ``matchConditions`` (CEL over ``object``, ``oldObject``, ``request``) hold for an
    AdmissionRequest-shaped dict? A condition that fails to evaluate raises :class:`ConditionError`."""
    scope = _Scope(_activation(request))  # the engine converts (copies) what it reads
    for condition in conditions:
        try:
            result = scope.evaluate(str(condition.get("expression", "")))
        except _EvaluationError as exc:
            raise ConditionError(f"matchCondition {condition.get('name', '?')!r}: {exc}") from exc
        if result is not True:
            return False
    return True


class ConditionError(Exception):
    """A matchCondition that could not be evaluated (the caller applies the failurePolicy)."""


def review(
    policies: Iterable[Mapping[str, Any]], bindings: Iterable[Mapping[str, Any]], request: Mapping[str, Any]
) -> Denial | None:
    """The first denial among the bound policies matching ``request`` (AdmissionRequest-shaped), or None."""
    by_name = {objects.name(p): p for p in policies}
    for binding in bindings:
        spec = binding.get("spec") or {}
        policy = by_name.get(str(spec.get("policyName")))
        if policy is None or "Deny" not in (spec.get("validationActions") or []):
            continue
        if any((spec.get("matchResources") or {}).get(key) for key in UNSUPPORTED):
            continue
        policy_spec = policy.get("spec") or {}
        if not _matches(policy_spec, request):
            continue
        policy_name, binding_name = objects.name(policy), objects.name(binding)
        try:
            verdict = _verdict(policy_spec, request)  # read only: the engine converts it
        except _EvaluationError as exc:
            if policy_spec.get("failurePolicy", "Fail") == "Ignore":
                continue
            verdict = (str(exc), "InternalError")
        if verdict is None:
            continue
        message, reason = verdict
        return Denial(
            policy=policy_name,
            binding=binding_name,
            message=f"ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' "
            f"denied request: {message}",
            reason=reason,
            code=REASON_CODES.get(reason, 500 if reason == "InternalError" else 422),
        )
    return None
