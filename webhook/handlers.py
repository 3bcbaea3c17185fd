"""The Kopf wiring: login, the HTTPS admission server, the ``/webhook`` handler, the managed configuration.

Owns :func:`run` (build everything from :class:`WebhookSettings`, then ``kopf.operator``) and the thin
handlers it registers in its own ``OperatorRegistry`` (no decorators on a global registry: settings and
shared state are passed in, never module globals):

* ``on.login``: the kubeconfig (or in-cluster account) through ``hami.kube.client``.
* ``on.mutate('v1', 'pods', id='webhook', operations={'CREATE'})``: applies :func:`webhook.mutation.plan`,
  then for a GPU pod it admits the ResourceQuota pre-check (:class:`webhook.quota.QuotaCheck`, fed by
  a list + watch of ResourceQuotas that :func:`run` starts: admission makes no API call); a refusal
  becomes ``kopf.AdmissionError``. Kopf turns ``patch`` into the JSONPatch it returns.
* with ``--manage-config``, ``on.event`` on our MutatingWebhookConfiguration re-applies the scoping
  Kopf cannot express (``webhook.registration``).

The HTTPS server is ``webhook.server``'s subclass of Kopf's: it checks every body before Kopf sees it
(a malformed one is answered 400 in one log line), times every AdmissionReview for the metrics
(``webhook.metrics``) and fills in a refusal's ``status.reason``; the handler counts refusals by reason
code and logs each in one INFO line (Kopf's own ERROR line for it is filtered out:
``webhook.server.QuietRefusals``).

Certificate rotation: with ``--no-manage-config`` (the chart: the Secret is mounted read-only and
renewed by the certgen CronJob or cert-manager) the server keeps its listener and hands a renewed
pair to new connections (``webhook.tlsreload``); Kopf's own file watch, which restarts the listener
and drops every open connection, is left idle. With ``--manage-config`` Kopf's restart stays: it is
what re-publishes a changed ``caBundle``.

No pod handler is stateful (no ``on.create``/``on.update``), so Kopf writes no annotations or
finalizers on pods; Kopf's k8s-event posting is off. Must not import ``kubernetes`` (the client is
reached only through ``hami.kube``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from datetime import UTC, datetime
from typing import Any

import kopf
from prometheus_client import CollectorRegistry

from hami import objects
from hami.kube.client import load_api_client
from webhook import registration, tlsbundle
from webhook.config import HANDLER_ID, WebhookSettings
from webhook.metrics import WebhookMetrics, serve_metrics
from webhook.mutation import Admit, Refuse, plan
from webhook.quota import QuotaCheck, watch_quotas
from webhook.server import KOPF_OBJECTS, REFUSAL, Published, PublishingWebhookServer, QuietRefusals
from webhook.tlsreload import CertificateSwitch

logger = logging.getLogger("hami.webhook")

#: How often the renewal task looks at the serving certificate (it renews with a third of its life left).
RENEW_CHECK_SECONDS = 3600.0
#: Kopf's file-watch interval when the certificate is switched in place instead (never, in practice).
KOPF_FILE_WATCH_OFF = 10 * 365 * 86400.0


def operator_settings(
    settings: WebhookSettings, published: Published, metrics: WebhookMetrics
) -> kopf.OperatorSettings:
    """Kopf's settings: standalone, no k8s-event posting, our server and (optionally) managed config."""
    kopf_settings = kopf.OperatorSettings()
    kopf_settings.peering.standalone = True
    kopf_settings.posting.enabled = False
    # We serve only built-in kinds: no CustomResourceDefinition watch, so no RBAC on CRDs is needed.
    kopf_settings.scanning.disabled = True
    tls = settings.tls_dir
    ca_file = tls / tlsbundle.CA_CERT
    # chart mode: switch certificates in place; managed: Kopf restarts and re-publishes the caBundle
    in_place = not settings.manage_config
    kopf_settings.admission.server = PublishingWebhookServer(
        published=published,
        metrics=metrics,
        switch=CertificateSwitch(tls / tlsbundle.TLS_CERT, tls / tlsbundle.TLS_KEY) if in_place else None,
        switch_interval=settings.cert_check_interval,
        addr=settings.listen.host,
        port=settings.listen.port or None,  # None: Kopf picks a free port (and re-publishes the URL)
        certfile=str(tls / tlsbundle.TLS_CERT),
        pkeyfile=str(tls / tlsbundle.TLS_KEY),
        cafile=str(ca_file) if ca_file.exists() else None,
        file_check_interval=KOPF_FILE_WATCH_OFF if in_place else settings.cert_check_interval,
    )
    kopf_settings.admission.managed = settings.config_name if settings.manage_config else None
    return kopf_settings


def build_registry(
    settings: WebhookSettings, published: Published, metrics: WebhookMetrics, quotas: QuotaCheck
) -> kopf.OperatorRegistry:
    """Register the handlers of one operator run; everything they need is closed over, not global."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        api = load_api_client(settings.kubeconfig, component="hami-webhook")
        conf = api.configuration
        header = conf.get_api_key_with_prefix("BearerToken") or conf.get_api_key_with_prefix("authorization")
        scheme, _sep, token = (header or "").rpartition(" ")
        return kopf.ConnectionInfo(
            server=conf.host,
            ca_path=conf.ssl_ca_cert,
            insecure=not conf.verify_ssl,
            username=conf.username or None,
            password=conf.password or None,
            scheme=scheme or None,
            token=token or None,
            certificate_path=conf.cert_file,
            private_key_path=conf.key_file,
        )

    @kopf.on.mutate(
        "v1",
        "pods",
        id=HANDLER_ID,
        operations={"CREATE"},
        ignore_failures=settings.failure_policy == "Ignore",
        registry=registry,
    )
    async def mutate(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        pod: dict[str, Any] = dict(body)
        decision = plan(pod, settings.mutation)
        namespace = objects.namespace(pod)
        if isinstance(decision, Admit) and decision.quota_ask is not None:
            decision = quotas.refusal(namespace, decision.quota_ask) or decision
        name = f"{namespace}/{objects.name(pod) or objects.meta(pod).get('generateName', '')}"
        if isinstance(decision, Refuse):
            logger.info("refused pod %s (%s): %s", name, decision.reason, decision.message)
            metrics.refused(decision.reason)
            REFUSAL.set(decision.message)  # logged above: QuietRefusals drops Kopf's ERROR line for it
            raise kopf.AdmissionError(decision.message, code=decision.code)
        for key, value in decision.spec.items():
            patch.spec[key] = value
        logger.debug("admitted pod %s: %s", name, "; ".join(decision.notes))

    @kopf.on.probe(id="certificate", registry=registry)
    def certificate(**_: Any) -> str:
        bundle = tlsbundle.read_bundle(settings.tls_dir)
        return "missing" if bundle is None else tlsbundle.expiry(bundle.cert).isoformat()

    if settings.manage_config:

        @kopf.on.event(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            field="metadata.name",
            value=settings.config_name,
            registry=registry,
        )
        def scope(body: kopf.Body, patch: kopf.Patch, type: str | None, **_: Any) -> None:
            stored = body.get("webhooks") or []
            # Empty: not configured yet, or Kopf removed the webhook on exit; never re-add it then.
            if type == "DELETED" or not stored or published.client_config is None:
                return
            desired = registration.desired_webhook(settings, published.client_config)
            if not registration.up_to_date(stored, desired):
                logger.info("scoping MutatingWebhookConfiguration %s", settings.config_name)
                patch["webhooks"] = [desired]

    return registry


async def renew_forever(settings: WebhookSettings, *, interval: float = RENEW_CHECK_SECONDS) -> None:
    """Re-issue our own serving certificate before it expires; Kopf notices the new files by itself."""
    while True:
        await asyncio.sleep(interval)
        try:
            outcome = await asyncio.to_thread(
                tlsbundle.ensure_certificates, settings.tls_dir, settings.hostnames, now=datetime.now(UTC)
            )
        except (OSError, tlsbundle.CertificateError) as exc:
            logger.error("certificate check failed: %s", exc)
            continue
        if outcome.action != "loaded":
            logger.warning("certificates %s: %s", outcome.action, outcome.reason)


async def run(
    settings: WebhookSettings,
    *,
    registry: CollectorRegistry | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    freeze_gc: bool = False,
) -> None:
    """Prepare the certificates, then run the operator until ``stop_flag`` (or a signal) stops it.

    ``registry`` is the Prometheus registry the entry point built (a fresh one when not given).
    ``freeze_gc`` (the entry point's choice: it owns the process) moves every object that exists once
    start-up is done (modules, the API client, the resolved Kubernetes API classes) out of the cyclic
    garbage collector's reach: a full collection then scans only what requests leave behind, instead of
    ~160,000 objects, which stalled admission for 100-300 ms every few seconds at 200 requests/s.
    """
    outcome = await asyncio.to_thread(
        tlsbundle.ensure_certificates, settings.tls_dir, settings.hostnames, now=datetime.now(UTC)
    )
    logger.info("certificates in %s %s %s", settings.tls_dir, outcome.action, outcome.reason)
    published = Published()
    metrics = WebhookMetrics(registry if registry is not None else CollectorRegistry())
    quotas = QuotaCheck(settings.mutation.device)
    api = load_api_client(settings.kubeconfig, component="hami-webhook")
    watcher = watch_quotas(api, quotas, asyncio.get_running_loop())  # resolves the API (an import) here
    if freeze_gc:
        gc.collect()
        gc.freeze()
    # Created before kopf.operator starts, so Kopf's shutdown leaves them to us.
    renewer = asyncio.create_task(renew_forever(settings), name="hami-webhook-cert-renewal")
    exporter = asyncio.create_task(
        serve_metrics(metrics, settings.metrics_listen), name="hami-webhook-metrics"
    )
    health = settings.health_listen
    quiet = QuietRefusals()
    logging.getLogger(KOPF_OBJECTS).addFilter(quiet)
    try:
        await kopf.operator(
            registry=build_registry(settings, published, metrics, quotas),
            settings=operator_settings(settings, published, metrics),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=f"http://{health.host}:{health.port}/healthz",
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        logging.getLogger(KOPF_OBJECTS).removeFilter(quiet)
        for task in (renewer, exporter):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.to_thread(watcher.stop)
        api.close()
