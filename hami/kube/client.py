"""The Kubernetes API client factory and the one place raw API calls are made and their errors mapped.

Owns: building the official (sync) ``kubernetes`` ``ApiClient`` from a kubeconfig or the in-cluster
service account, the request timeout every call carries, the one request path every ``hami.kube`` call
takes (:func:`send`: the client's own lower layer, ``param_serialize`` then ``call_api``, as
``kubernetes.dynamic`` uses it; never a generated API class, whose module costs most of a second of CPU
to import and whose every method validates its arguments with pydantic), running calls off the event
loop (``asyncio.to_thread``: the sync client must never block the loop, which may also be serving a
local test API server), decoding raw JSON responses (objects travel as plain dicts, never as client
model classes) and the error hierarchy (:class:`KubeError`, :class:`NotFound`, :class:`Conflict`).
The resource paths are ``hami.kube.paths``'. Errors a person sees read as one line saying what to do:
an unusable or absent kubeconfig is ``Config: ...``, a connection never made (refused, unknown host,
TLS) ``Unreachable: ...`` naming the server (:func:`check_reachable` asks once at a service's
start-up). The loaders' credential refresh hook, which the client runs before every request, runs at
most once a second (:class:`RefreshAtMost`). What callers may use of the client object is
:class:`~hami.kube.protocol.KubeApi`. Imports: ``kubernetes`` (``ApiClient``, ``Configuration``, the
config loaders and ``ApiException``; no generated API class), ``urllib3``, ``hami.kube.protocol``;
nothing from ``hami.scheduler`` or above.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from hami.kube.protocol import KubeApi

#: Seconds one API request may take before it fails (a hanging apiserver must not hang a bind).
DEFAULT_TIMEOUT = 30.0


class KubeError(Exception):
    """An API request failed: ``status`` is the HTTP code (0 for transport errors and timeouts)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    """404: the object does not exist."""


class Conflict(KubeError):
    """409: the object already exists or changed underneath us."""


class Gone(KubeError):
    """410: a watch's resourceVersion is too old; the caller must list again."""


class HamiApiClient(client.ApiClient):
    """The official ``ApiClient`` plus the per-request timeout our helpers pass on every call."""

    def __init__(self, configuration: Any, *, request_timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(configuration)
        self.request_timeout = request_timeout


def load_api_client(
    kubeconfig: str | None, *, request_timeout: float = DEFAULT_TIMEOUT, component: str = "hami"
) -> KubeApi:
    """Build an ``ApiClient``: the given kubeconfig file, else in-cluster, else ``~/.kube/config``.

    Requests carry the User-Agent ``<component>/<version>`` so audit logs (and our RBAC tests) can tell
    the scheduler, the webhook and the node agent apart.

    Connection errors are retried twice by urllib3; a read is never retried (a POST or PATCH that
    timed out may have been applied; the caller decides).
    """
    configuration = client.Configuration()
    if kubeconfig:
        if not Path(kubeconfig).is_file():
            raise KubeError(
                0,
                "Config",
                f"kubeconfig file not found: {kubeconfig!r}; pass an existing file to --kubeconfig",
            )
        _load_kubeconfig(configuration, kubeconfig)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            default = config.KUBE_CONFIG_DEFAULT_LOCATION
            if not any(Path(p).expanduser().is_file() for p in default.split(os.pathsep) if p):
                raise KubeError(
                    0,
                    "Config",
                    f"no kubeconfig: not running in a cluster and {default} does not exist; "
                    "pass --kubeconfig FILE (or set KUBECONFIG)",
                ) from None
            _load_kubeconfig(configuration, None)
    RefreshAtMost.install(configuration)
    configuration.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, other=0, redirect=2)
    configuration.connection_pool_maxsize = 64
    api = HamiApiClient(configuration, request_timeout=request_timeout)
    api.user_agent = f"{component}/{_version()}"
    return api


class RefreshAtMost:
    """A configuration's ``refresh_api_key_hook``, run at most once every ``every`` seconds.

    The client calls the hook before every request. Both loaders' hooks re-read an expiring credential
    only when it is due (the kubeconfig's five minutes before its expiry, the in-cluster token file
    every minute) but re-apply the whole configuration on every call, ``host`` included, whose setter
    reads every proxy variable of the environment: CPU on each request, for nothing between refreshes.
    A loader's hook installs a new hook of its own each time it runs; that one becomes the inner hook
    and this wrapper stays installed. A hook that fails is tried again on the next request."""

    def __init__(
        self, hook: Callable[[Any], None], *, every: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._hook = hook
        self._every = every
        self._clock = clock
        self._due = float("-inf")
        self._guard = threading.Lock()  # the client's worker threads call it at once

    @classmethod
    def install(cls, configuration: Any, **kwargs: Any) -> None:
        """Wrap ``configuration``'s hook, when it has one that is not wrapped already."""
        hook = getattr(configuration, "refresh_api_key_hook", None)
        if hook is not None and not isinstance(hook, cls):
            configuration.refresh_api_key_hook = cls(hook, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> RefreshAtMost:
        """A copied configuration gets its own wrapper, due at once: the hook writes the credential into
        the configuration it is called with, so a shared timer would keep the copy's from ever being
        refreshed while the original's calls kept it inside the window (a lock cannot be copied)."""
        return type(self)(self._hook, every=self._every, clock=self._clock)

    def __call__(self, configuration: Any) -> None:
        if self._clock() < self._due:
            return
        with self._guard:
            now = self._clock()
            if now < self._due:
                return
            try:
                self._hook(configuration)
            finally:
                fresh = getattr(configuration, "refresh_api_key_hook", None)
                if fresh is not None and fresh is not self:
                    self._hook = fresh
                configuration.refresh_api_key_hook = self
            self._due = now + self._every


def _load_kubeconfig(configuration: Any, path: str | None) -> None:
    """Load a kubeconfig file into ``configuration``; any failure is one :class:`KubeError` line.

    The file is hostile input parsed by third-party code (YAML, then the client's own checks), which
    fails in many shapes (``yaml.YAMLError``, ``ConfigException``, ``TypeError`` on a list, ``ValueError``
    on bytes that are not UTF-8, ...): every one of them means "this kubeconfig is unusable".
    """
    shown = path or config.KUBE_CONFIG_DEFAULT_LOCATION
    try:
        config.load_kube_config(config_file=path, client_configuration=configuration)  # type: ignore[no-untyped-call]
    except Exception as exc:  # see the docstring: all of them mean a bad file
        detail = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, TypeError | AttributeError | KeyError):  # YAML, but not a kubeconfig's shape
            detail = f"not a kubeconfig document: {detail}"
        raise KubeError(
            0,
            "Config",
            f"kubeconfig {shown!r} is not usable ({detail}); fix it or pass another with --kubeconfig",
        ) from None


def _version() -> str:
    try:
        return importlib.metadata.version("hami-py")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


def timeout_of(api: KubeApi) -> float:
    """The per-request timeout for ``api`` (clients not built by :func:`load_api_client` get the default)."""
    value = getattr(api, "request_timeout", DEFAULT_TIMEOUT)
    return float(value)


def error_from(exc: BaseException) -> KubeError:
    """Map a client exception to our hierarchy, keeping the API's Status reason and message."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        reason = str(exc.reason or "")
        message = str(exc.body or "")
        try:
            body = json.loads(exc.body) if exc.body else None
        except ValueError:
            body = None
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or message)
        kind = {404: NotFound, 409: Conflict, 410: Gone}.get(status, KubeError)
        return kind(status, reason, message)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        unreachable = _unreachable(exc.reason, exc.pool)
        if unreachable is not None:
            return unreachable
        cause = error_from(exc.reason)
        return KubeError(cause.status, cause.reason, str(exc))
    unreachable = _unreachable(exc, None)
    if unreachable is not None:
        return unreachable
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return KubeError(0, "Timeout", str(exc))
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return KubeError(0, "Transport", str(exc))
    raise exc


def _unreachable(exc: BaseException, pool: Any) -> KubeError | None:
    """A connection that was never made (refused, unknown host, TLS failure), said as such in one line.

    Checked before the timeout mapping: urllib3's ``NewConnectionError`` is a ``ConnectTimeoutError``, so a
    refused connection would otherwise read ``Timeout``. ``None`` for anything else.
    """
    if pool is not None:
        server = f"{pool.scheme}://{pool.host}:{pool.port}"
    else:
        conn = getattr(exc, "conn", None)
        server = f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}" if conn is not None else "?"
    detail = " ".join(str(exc).split())
    if isinstance(exc, urllib3.exceptions.NameResolutionError):
        why = "its host name does not resolve"
    elif isinstance(exc, urllib3.exceptions.NewConnectionError):
        cause = exc.__cause__ or exc.__context__
        refused = isinstance(cause, ConnectionRefusedError) or "Connection refused" in detail
        why = "connection refused" if refused else f"cannot connect ({detail})"
    elif isinstance(exc, urllib3.exceptions.SSLError):
        why = f"the TLS handshake failed ({detail})"
    else:
        return None
    return KubeError(
        0,
        "Unreachable",
        f"cannot reach the API server at {server}: {why}; check that the cluster is running and that "
        "--kubeconfig names its server",
    )


def check_reachable(api: KubeApi) -> None:
    """Ask the server for ``/version`` once (start-up of the services): raise :class:`KubeError` when no
    connection can be made or it does not answer in time. Any HTTP answer, even an error, counts as
    reachable (credentials and rights are the callers' business, with their own messages). One attempt,
    no urllib3 retries: their warnings would bury the one line the caller prints."""
    url = f"{str(api.configuration.host).rstrip('/')}/version"
    headers = {**api.default_headers, "User-Agent": str(api.user_agent)}
    for setting in api.configuration.auth_settings().values():  # the caller's identity, as on any call
        if setting.get("in") == "header" and setting.get("value"):
            headers[str(setting["key"])] = str(setting["value"])
    try:
        api.rest_client.pool_manager.request(
            "GET",
            url,
            headers=headers,
            retries=urllib3.Retry(total=0, redirect=False),
            timeout=urllib3.Timeout(total=timeout_of(api)),
            preload_content=True,
        )
    except Exception as exc:  # mapped below; anything unknown re-raises from error_from
        raise error_from(exc) from exc


#: The one media type every request accepts (the generated methods' choice among theirs: the first JSON one).
ACCEPT = "application/json"
#: The credential every request carries (the generated methods' ``auth_settings``): the configuration's
#: ``authorization`` key, read through its refresh hook (:class:`RefreshAtMost`).
AUTH_SETTINGS = ["BearerToken"]

Verb = str
#: A query parameter's value: the client writes ``True`` as ``true``, numbers as text; ``None`` is left out.
QueryValue = str | int | bool | None
#: ``_request_timeout``: total seconds, or (connect, read) seconds.
Timeout = float | tuple[float, float]


def send(
    api: KubeApi,
    verb: Verb,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    query: Mapping[str, QueryValue] | None = None,
    body: Any = None,
    content_type: str | None = None,
    timeout: Timeout,
) -> Any:
    """Make one request and return the raw, unread urllib3 response (a watch reads it as a stream).

    ``path`` is one of ``hami.kube.paths``, its ``{namespace}``/``{name}`` filled from ``params`` (quoted
    by the client). The request is built as the generated methods build it: ``Accept`` JSON, the body as
    JSON, a ``Content-Type`` only where one is named (every PATCH names its kind; the generated create
    methods of this client sent none with a POST, and kube-apiserver reads such a body as JSON; the REST
    layer sends a JSON patch whose body is an object as a strategic merge patch), the bearer credential
    through the configuration's refresh hook, the default headers (User-Agent), the client's connection
    pool (its certificates and CA). A non-2xx answer raises the client's ``ApiException`` (read to its
    end), which :func:`error_from` maps; transport errors are urllib3's, mapped there too."""
    headers = {"Accept": ACCEPT}
    if content_type is not None:
        headers["Content-Type"] = content_type
    elif verb == "PATCH":
        raise ValueError("a PATCH names its content type (hami.kube.paths: JSON_PATCH, MERGE_PATCH, ...)")
    pairs = [(key, value) for key, value in (query or {}).items() if value is not None]
    request = api.param_serialize(
        verb,
        path,
        path_params=dict(params) if params else None,
        query_params=pairs,
        header_params=headers,
        body=body,
        auth_settings=AUTH_SETTINGS,
    )
    response = api.call_api(*request, _request_timeout=timeout)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


def _call_json_sync(
    api: KubeApi,
    verb: Verb,
    path: str,
    *,
    params: Mapping[str, str] | None,
    query: Mapping[str, QueryValue] | None,
    body: Any,
    content_type: str | None,
    timeout: float,
) -> Any:
    try:
        response = send(
            api, verb, path, params=params, query=query, body=body, content_type=content_type, timeout=timeout
        )
        data = response.data
    except Exception as exc:  # mapped below; anything unknown re-raises from error_from
        raise error_from(exc) from exc
    if not data:
        return {}
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # a garbled answer fails as the API call it is
        raise KubeError(
            0, "InvalidResponse", f"the API server's answer is not JSON: {str(exc)[:200]}"
        ) from None


async def call_json(
    api: KubeApi,
    verb: Verb,
    path: str,
    *,
    params: Mapping[str, str] | None = None,
    query: Mapping[str, QueryValue] | None = None,
    body: Any = None,
    content_type: str | None = None,
    limit: float | None = None,
) -> Any:
    """Make one request (:func:`send`) in a worker thread and return the decoded JSON body (``{}`` when
    empty); failures raise :class:`KubeError` (mapped by :func:`error_from`).

    ``limit`` (seconds) shortens this call's timeout below the client's own, never lengthens it."""
    seconds = timeout_of(api) if limit is None else max(0.001, min(limit, timeout_of(api)))
    return await asyncio.to_thread(
        _call_json_sync,
        api,
        verb,
        path,
        params=params,
        query=query,
        body=body,
        content_type=content_type,
        timeout=seconds,
    )
