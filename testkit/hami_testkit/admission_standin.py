"""SIMULATION ONLY: the admission step of kube-apiserver, which the embedded apiserver (kmock) lacks.

kmock stores MutatingWebhookConfigurations but never calls them. Pods of the demo are therefore
submitted through :meth:`AdmissionStandIn.submit`, which does what kube-apiserver does on a pod
CREATE: apply the defaults our webhook relies on (``schedulerName: default-scheduler``, requests
from limits for extended resources, a ``uid``, ``status.phase: Pending``), send an AdmissionReview v1
over HTTPS to every matching webhook (rules, ``objectSelector``, ``matchConditions``) of every
MutatingWebhookConfiguration (URL and ``caBundle`` read from the configuration our webhook created),
apply the returned JSONPatch, honour ``failurePolicy``, and then create the pod — or report the
refusal. Before the webhooks, ``spec.priority`` is resolved from the pod's PriorityClass as
kube-apiserver's built-in Priority plugin does (:func:`resolve_priority`). With ``server_admits``
(the embedded cluster, whose apiserver calls the webhooks itself on every pod CREATE, kubectl's
included: it uses :meth:`mutate`), :meth:`AdmissionStandIn.submit` only creates the pod and reads a
refusal back from the apiserver's answer. The create itself passes the apiserver's ValidatingAdmissionPolicies
(:class:`hami_testkit.apiserver.AdmittingEmulator`); their denial is reported the same way. Must not import
``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import json
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonpatch

from hami import objects
from hami.kube.admissionreview import pod_create_review
from hami_testkit.admission_policy import ConditionError, conditions_hold
from hami_testkit.kubeapi import MWC_PATH, ApiError, JsonDict, SimApi, pods_path

#: ``Refused.webhook`` when a ValidatingAdmissionPolicy of the apiserver refused the create.
POLICY = "ValidatingAdmissionPolicy"
#: ``Refused.webhook`` when kube-apiserver's Priority admission plugin refused the create.
PRIORITY = "Priority"
PRIORITY_CLASSES_PATH = "/apis/scheduling.k8s.io/v1/priorityclasses"
#: The classes kube-apiserver creates itself (the embedded apiserver knows them without objects).
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}
_PRIORITY_WORDS = ("priority admission controller", "no PriorityClass with name")


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    """The pod was created; ``pod`` is what the apiserver stored, ``warnings`` what webhooks said."""

    pod: JsonDict
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """A webhook denied the pod (or failed under ``failurePolicy: Fail``), or an admission policy did
    (``webhook`` is then :data:`POLICY`); nothing was created."""

    namespace: str
    name: str
    webhook: str
    message: str
    code: int = 400
    #: kube-apiserver's Status reason ("" = the one its code implies, :func:`reason_for`)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Denial:
    """A webhook's refusal as kube-apiserver relays it (:func:`_denial`)."""

    message: str
    code: int = 400
    reason: str = ""


def _denial(name: str, status: object) -> Denial:
    """kube-apiserver's ``ToStatusErr``: the webhook's own code (below 400: 400) and reason, and the
    message prefixed with who denied it (its reason where it gives no message)."""
    given = status if isinstance(status, Mapping) else {}
    code, reason, message = given.get("code"), given.get("reason"), given.get("message")
    reason = reason if isinstance(reason, str) else ""
    denied = f'admission webhook "{name}" denied the request'
    if isinstance(message, str) and message:
        denied += f": {message}"
    elif reason:
        denied += f": {reason}"
    else:
        denied += " without explanation"
    return Denial(denied, code if isinstance(code, int) and 400 <= code <= 599 else 400, reason)


#: kube-apiserver's Status reason for a code, where the refusal names none.
REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid"}


def reason_for(refused: Refused) -> str:
    """The Status reason a refusal is answered with: its own, else the one its code implies."""
    if refused.reason:
        return refused.reason
    return REASONS.get(refused.code, "InternalError" if refused.code >= 500 else "BadRequest")


Outcome = Admitted | Refused


class AdmissionStandIn:
    """Submits pods through the cluster's mutating webhooks, as kube-apiserver would."""

    def __init__(self, api: SimApi, session: aiohttp.ClientSession, *, server_admits: bool = False) -> None:
        self._api = api
        self._session = session
        self._server_admits = server_admits
        #: The TLS client context of each webhook CA bundle ("" for the system's), built once: loading
        #: the system's CAs costs milliseconds, and a pod CREATE calls the webhook every time.
        self._tls: dict[str, ssl.SSLContext] = {}

    async def submit(self, pod: Mapping[str, Any]) -> Outcome:
        body = apply_defaults(pod)
        meta = body["metadata"]
        warnings: list[str] = []
        if not self._server_admits:
            mutated = await self.mutate(body, await self._api.list_objects(MWC_PATH))
            if isinstance(mutated, Refused):
                return mutated
            body, warnings = mutated
        try:
            stored = await self._api.create(pods_path(meta["namespace"]), body)
        except ApiError as exc:
            webhook = _webhook_named(exc.message) if self._server_admits else None
            if exc.status == 403 and any(w in exc.message for w in _PRIORITY_WORDS):
                webhook = PRIORITY
            if webhook is not None and exc.status >= 400:
                return Refused(
                    namespace=meta["namespace"],
                    name=meta["name"],
                    webhook=webhook,
                    message=exc.message,
                    code=exc.status,
                    reason=exc.reason,
                )
            if exc.status not in (403, 422):
                raise
            return Refused(
                namespace=meta["namespace"],
                name=meta["name"],
                webhook=POLICY,
                message=exc.message,
                code=exc.status,
            )
        return Admitted(pod=stored, warnings=tuple(warnings))

    async def mutate(
        self, body: JsonDict, configs: list[JsonDict], username: str = "hami-demo"
    ) -> tuple[JsonDict, list[str]] | Refused:
        """kube-apiserver's Priority admission plugin (:func:`resolve_priority`), then every matching
        webhook of ``configs`` on a pod CREATE, in order: the patched pod and the webhooks' warnings,
        or the refusal."""
        meta = body["metadata"]
        resolved = resolve_priority(body, await self._api.list_objects(PRIORITY_CLASSES_PATH))
        if isinstance(resolved, str):
            return Refused(
                namespace=meta["namespace"], name=meta["name"], webhook=PRIORITY, message=resolved, code=403
            )
        body = resolved
        warnings: list[str] = []
        for config in configs:
            for hook in config.get("webhooks") or []:
                if not _matches(hook, body):
                    continue
                request = {"operation": "CREATE", "object": body, "oldObject": None}
                request["userInfo"] = {"username": username, "groups": ["system:authenticated"]}
                try:
                    if not conditions_hold(hook.get("matchConditions") or [], request):
                        continue
                except ConditionError as exc:
                    if hook.get("failurePolicy", "Fail") == "Ignore":
                        continue
                    message = (
                        f'Internal error occurred: failed calling webhook "{hook.get("name", "?")}": {exc}'
                    )
                    return Refused(
                        namespace=meta["namespace"], name=meta["name"], webhook=hook.get("name", "?"),
                        message=message, code=500,
                    )  # fmt: skip
                result = await self._call(hook, body, username)
                if isinstance(result, Denial):
                    return Refused(
                        namespace=meta["namespace"],
                        name=meta["name"],
                        webhook=hook.get("name", "?"),
                        message=result.message,
                        code=result.code,
                        reason=result.reason,
                    )
                if isinstance(result, str):  # the call itself failed: the message
                    return Refused(
                        namespace=meta["namespace"],
                        name=meta["name"],
                        webhook=hook.get("name", "?"),
                        message=result,
                        code=500 if result.startswith("Internal error") else 400,
                    )
                body, more = result
                warnings += more
        return body, warnings

    async def _call(
        self, hook: Mapping[str, Any], pod: JsonDict, username: str
    ) -> tuple[JsonDict, list[str]] | Denial | str:
        """One webhook call: the patched pod and warnings, the webhook's denial, or why the call
        failed."""
        name = str(hook.get("name", "?"))
        fail_closed = hook.get("failurePolicy", "Fail") != "Ignore"
        try:
            review = await self._post(hook, pod, username)
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError, ValueError) as exc:
            if not fail_closed:
                return pod, [f"webhook {name} failed and is ignored: {exc}"]
            return f'Internal error occurred: failed calling webhook "{name}": {exc}'
        response = review.get("response") or {}
        if not response.get("allowed"):
            return _denial(name, response.get("status"))
        warnings = [str(w) for w in response.get("warnings") or []]
        patch_text = response.get("patch")
        if not patch_text:
            return pod, warnings
        if response.get("patchType", "JSONPatch") != "JSONPatch":
            return f'webhook "{name}" answered an unsupported patchType {response.get("patchType")!r}'
        try:
            operations = json.loads(base64.b64decode(patch_text))
            patched: JsonDict = jsonpatch.apply_patch(pod, operations)
        except (binascii.Error, ValueError, jsonpatch.JsonPatchException) as exc:
            return f'webhook "{name}" answered a patch that does not apply: {exc}'
        return patched, warnings

    async def _post(self, hook: Mapping[str, Any], pod: JsonDict, username: str) -> JsonDict:
        client_config = hook.get("clientConfig") or {}
        url = client_config.get("url")
        if not url:
            raise ValueError(
                f"clientConfig has no url (service references need cluster DNS): {client_config}"
            )
        context = self._tls_context(str(client_config.get("caBundle") or ""))
        review = pod_create_review(pod, username=username, namespace=pod["metadata"]["namespace"])
        timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds") or 10))
        async with self._session.post(url, json=review, ssl=context, timeout=timeout) as response:
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {(await response.text())[:300]}")
            answer: JsonDict = await response.json(content_type=None)
            return answer

    def _tls_context(self, ca_bundle: str) -> ssl.SSLContext:
        """The client context trusting ``ca_bundle`` (base64 PEM; "" for the system's CAs), built once."""
        context = self._tls.get(ca_bundle)
        if context is None:
            cadata = base64.b64decode(ca_bundle).decode() if ca_bundle else None
            context = ssl.create_default_context(cadata=cadata)
            self._tls[ca_bundle] = context
        return context


def _webhook_named(message: str) -> str | None:
    """The webhook a kube-apiserver admission error names (``admission webhook "x" denied ...``)."""
    for marker in ('admission webhook "', 'failed calling webhook "'):
        if marker in message:
            return message.split(marker, 1)[1].split('"', 1)[0]
    return None


def apply_defaults(pod: Mapping[str, Any]) -> JsonDict:
    """What kube-apiserver fills in before admission (only the fields our components read)."""
    body: JsonDict = copy.deepcopy(dict(pod))
    body.setdefault("apiVersion", "v1")
    body.setdefault("kind", "Pod")
    meta = body.setdefault("metadata", {})
    if not meta.get("name"):
        raise ValueError("pod has no metadata.name (generateName is not supported by the embedded apiserver)")
    meta.setdefault("namespace", "default")
    meta.setdefault("uid", str(uuid.uuid4()))
    meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    spec = body.setdefault("spec", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        # quantities are stored as strings (YAML `nvidia.com/gpu: 1` arrives as a number)
        limits = {k: str(v) for k, v in (resources.get("limits") or {}).items()}
        requests = {k: str(v) for k, v in (resources.get("requests") or {}).items()}
        if limits:  # requests default to limits (for extended resources they must be equal)
            container["resources"] = {**resources, "limits": limits, "requests": {**limits, **requests}}
        elif requests:
            container["resources"] = {**resources, "requests": requests}
    body["status"] = {"phase": "Pending"}
    return body


def resolve_priority(pod: JsonDict, classes: list[JsonDict]) -> JsonDict | str:
    """What kube-apiserver's Priority admission plugin does on a pod CREATE: ``spec.priority`` (and
    ``spec.preemptionPolicy``) from the PriorityClass named by ``spec.priorityClassName``, from the
    ``globalDefault`` class (the lowest, if several; its name is set too) when none is named, else 0
    and ``PreemptLowerPriority``. Returns the pod, or kube-apiserver's Forbidden text for an unknown
    class or a ``priority`` / ``preemptionPolicy`` the pod set that differs from the class's."""
    spec = pod.setdefault("spec", {})
    prefix = f'pods "{objects.name(pod)}" is forbidden: '
    named = spec.get("priorityClassName") or ""
    value, policy = 0, "PreemptLowerPriority"
    by_name = {objects.name(c): c for c in classes}
    if named:
        found = by_name.get(named)
        if found is not None:
            value, policy = _class_value(found), found.get("preemptionPolicy") or policy
        elif named in SYSTEM_PRIORITY_CLASSES:
            value = SYSTEM_PRIORITY_CLASSES[named]
        else:
            return f"{prefix}no PriorityClass with name {named} was found"
    else:
        defaults = sorted((c for c in classes if c.get("globalDefault") is True), key=_class_value)
        if defaults:
            spec["priorityClassName"] = objects.name(defaults[0])
            value, policy = _class_value(defaults[0]), defaults[0].get("preemptionPolicy") or policy
    given = spec.get("priority")
    if given is not None and given != value:
        return (
            f"{prefix}the integer value of priority ({given}) must not be provided in pod spec; "
            f"priority admission controller computed {value} from the given PriorityClass name"
        )
    given_policy = spec.get("preemptionPolicy")
    if given_policy is not None and given_policy != policy:
        return (
            f"{prefix}the string value of PreemptionPolicy ({given_policy}) must not be provided in pod "
            f"spec; priority admission controller computed {policy} from the given PriorityClass name"
        )
    spec["priority"], spec["preemptionPolicy"] = value, policy
    return pod


def _class_value(priority_class: Mapping[str, Any]) -> int:
    """A PriorityClass's ``value``; 0 when it is no integer (kube-apiserver would not have stored it,
    the embedded apiserver stores what it is given)."""
    value = priority_class.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _matches(hook: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Does the webhook's rules + objectSelector select a v1 pod CREATE?"""
    selected = False
    for rule in hook.get("rules") or []:
        operations = rule.get("operations") or []
        groups, versions, kinds = (
            rule.get("apiGroups") or [],
            rule.get("apiVersions") or [],
            rule.get("resources") or [],
        )
        if (
            ("CREATE" in operations or "*" in operations)
            and ("" in groups or "*" in groups)
            and ("v1" in versions or "*" in versions)
            and ("pods" in kinds or "*" in kinds)
        ):
            selected = True
    return selected and selector_matches(hook.get("objectSelector") or {}, objects.labels(pod))


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (``matchLabels`` + ``matchExpressions``) against ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = (
            expression.get("key"),
            expression.get("operator"),
            expression.get("values") or [],
        )
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True
