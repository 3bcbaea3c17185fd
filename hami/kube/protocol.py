"""The Kubernetes API client as this project uses it: a :class:`typing.Protocol` for every signature that
takes one (``api: KubeApi``), instead of ``Any``.

Owns :class:`KubeApi` and :class:`KubeConfiguration`: the members our code touches on the official client's
``ApiClient`` (built by :func:`hami.kube.client.load_api_client`) and its ``Configuration``, and nothing more.
Every request goes through :func:`hami.kube.client.send`, which uses the client's own lower layer
(``param_serialize``, ``call_api``; no generated API class); ``check_reachable`` reads the configuration,
headers and connection pool; the entry points and the commands only pass it on and :meth:`KubeApi.close`
it; the webhook's Kopf login reads the credentials from :attr:`KubeApi.configuration`. Imports nothing
(the ``kubernetes`` package is untyped: its ``ApiClient`` satisfies this protocol through its own
attributes).
"""

from __future__ import annotations

from typing import Any, Protocol


class KubeConfiguration(Protocol):
    """The parts of ``kubernetes.client.Configuration`` we read: the server and the credentials."""

    host: str
    ssl_ca_cert: str | None
    verify_ssl: bool
    username: str
    password: str
    cert_file: str | None
    key_file: str | None

    def get_api_key_with_prefix(self, identifier: str, alias: str | None = None) -> str | None:
        """``"Bearer <token>"`` (the ``authorization`` key) when the kubeconfig gives a token."""
        ...

    def auth_settings(self) -> dict[str, dict[str, Any]]:
        """The identity headers every request carries (``{"in": "header", "key": ..., "value": ...}``)."""
        ...


class KubeApi(Protocol):
    """The API client object every ``hami.kube`` call takes (``hami.kube.client.HamiApiClient``)."""

    #: Seconds one request may take (``hami.kube.client.timeout_of``).
    request_timeout: float
    #: Headers sent with every request (``check_reachable`` sends them too).
    default_headers: dict[str, str]

    @property
    def configuration(self) -> KubeConfiguration:
        """Server URL, TLS and credentials."""
        ...

    @property
    def user_agent(self) -> str:
        """``<component>/<version>``, so audit logs tell our components apart."""
        ...

    @property
    def rest_client(self) -> Any:
        """The client's urllib3 wrapper (``.pool_manager``): ``check_reachable`` asks ``/version`` on it."""
        ...

    def close(self) -> None:
        """Close the connection pool (and the client's worker pool)."""
        ...

    def param_serialize(
        self,
        method: str,
        resource_path: str,
        path_params: dict[str, str] | None = None,
        query_params: list[tuple[str, Any]] | None = None,
        header_params: dict[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        files: Any = None,
        auth_settings: list[str] | None = None,
    ) -> tuple[str, str, dict[str, str], Any, Any]:
        """One request as the client sends it: (method, URL with its query, headers with the credential
        and the default headers, body, form fields); runs the configuration's credential refresh hook."""
        ...

    def call_api(
        self,
        method: str,
        url: str,
        header_params: dict[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        """Send a request :meth:`param_serialize` built; the REST response (``.status``, ``.read()``, the
        unread urllib3 ``.response``), whatever its status."""
        ...
