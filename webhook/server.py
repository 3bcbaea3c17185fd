"""The webhook's HTTPS server: Kopf's ``WebhookServer`` plus what the webhook needs of it.

Owns :class:`PublishingWebhookServer` and :class:`QuietRefusals`. The server:

* records each client config it yields (start-up and every rotation) in :class:`Published`, for the
  managed configuration's scoping (``webhook.registration``);
* reads every request body itself (``_serve``, which Kopf's ``__call__`` calls per request) through
  :func:`webhook.reviews.read_review`: a malformed body is answered 400 (413 when too large) with a
  ``Status`` saying why, logged in one WARNING line, counted as an ``error`` admission, and never
  reaches Kopf (whose own reading answers such bodies 500 with a traceback);
* times every admission around Kopf's ``WebhookFn`` and classifies the response (``webhook.metrics``);
* fills in ``status.reason`` of a refusal from its code (``webhook.reviews.with_status_reason``);
* with a ``switch``, hands a renewed certificate to new connections in place (``webhook.tlsreload``).

:class:`QuietRefusals` drops Kopf's ``Handler 'webhook' failed permanently: ...`` ERROR line for a
refusal: refusing a pod is the webhook's job, and the handler logs it itself in one INFO line. It
knows a refusal by :data:`REFUSAL`, which the handler sets and the server clears for every request.
Must not import the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import kopf
from kopf._core.engines import admission  # the errors Kopf's own _serve maps to HTTP codes

from webhook.metrics import WebhookMetrics
from webhook.reviews import MAX_BODY, STATUS_REASONS, Malformed, read_review, with_status_reason
from webhook.tlsreload import CertificateSwitch

logger = logging.getLogger("hami.webhook")

#: The message of the refusal the handler is raising in this request (None: not refusing).
REFUSAL: contextvars.ContextVar[str | None] = contextvars.ContextVar("hami_webhook_refusal", default=None)
#: The logger Kopf's per-object messages go to (``kopf._core.actions.loggers``).
KOPF_OBJECTS = "kopf.objects"


@dataclass(slots=True)
class Published:
    """The client config (url + caBundle) the webhook server last published; shared within one run."""

    client_config: dict[str, Any] | None = None


class TooLarge(Malformed):
    """A body over :data:`webhook.reviews.MAX_BODY` (answered 413)."""


class QuietRefusals(logging.Filter):
    """Drops Kopf's ERROR line for the refusal :data:`REFUSAL` names (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        refusal = REFUSAL.get()
        return not (
            refusal is not None
            and record.levelno >= logging.ERROR
            and record.getMessage().endswith(f"failed permanently: {refusal}")
        )


class PublishingWebhookServer(kopf.WebhookServer):
    """Kopf's HTTPS server with the additions of the module docstring (``fn`` is Kopf's documented
    ``WebhookFn``: request in, review out)."""

    def __init__(
        self,
        *,
        published: Published,
        metrics: WebhookMetrics,
        switch: CertificateSwitch | None = None,
        switch_interval: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.published = published
        self.metrics = metrics
        self.switch = switch
        self.switch_interval = switch_interval

    def _build_ssl(self) -> tuple[bytes | None, Any]:
        cadata, context = super()._build_ssl()
        if self.switch is not None and context is not None:
            self.switch.attach(context)
        return cadata, context

    async def _serve(self, fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:  # type: ignore[override]
        """One request: the body read and checked here, then Kopf's handling (``fn``)."""
        started = time.perf_counter()
        try:
            review = read_review(await _body(request))
        except Malformed as exc:
            self.metrics.answered(None, time.perf_counter() - started)
            logger.warning("refused a malformed AdmissionReview from %s: %s", request.remote, exc)
            code = 413 if isinstance(exc, TooLarge) else 400
            return _status(code, f"malformed AdmissionReview: {exc}")
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            response = await fn(
                review, webhook=request.match_info.get("id"), sslpeer=peer, headers=dict(request.headers)
            )
        except admission.WebhookError as exc:  # e.g. a resource nothing here admits (Kopf: 404)
            code = 404 if isinstance(exc, admission.UnknownResourceError) else 400
            logger.warning("refused an AdmissionReview from %s: %s", request.remote, exc)
            return _status(code, str(exc))
        return aiohttp.web.json_response(response)

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        metrics = self.metrics

        async def timed(request: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            response = None
            token = REFUSAL.set(None)  # one connection serves many requests in one task
            try:
                response = with_status_reason(await fn(request, **kwargs))
            finally:
                REFUSAL.reset(token)
                # a raised error (a review Kopf cannot route) is answered 4xx: counted as "error"
                metrics.answered(response, time.perf_counter() - started)
            return response

        watcher: asyncio.Task[None] | None = None
        try:
            async for client_config in super().__call__(timed):
                self.published.client_config = dict(client_config)
                if self.switch is not None and watcher is None:
                    watcher = asyncio.create_task(
                        self.switch.watch(self.switch_interval), name="hami-webhook-cert-switch"
                    )
                yield client_config
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher


async def _body(request: aiohttp.web.Request) -> bytes:
    """The request body, read only up to :data:`MAX_BODY` (:class:`TooLarge` beyond it)."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise TooLarge(f"body of {request.content_length} bytes, more than {MAX_BODY}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > MAX_BODY:
            raise TooLarge(f"body of more than {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _status(code: int, message: str) -> aiohttp.web.Response:
    """A ``metav1.Status`` answer, as kube-apiserver's own errors look."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": (STATUS_REASONS | {404: "NotFound", 413: "RequestEntityTooLarge"}).get(code, "BadRequest"),
        "code": code,
    }
    return aiohttp.web.json_response(body, status=code)
