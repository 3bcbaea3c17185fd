"""The whole system on an embedded cluster: apiserver in-process, every component a child process.

Owns :class:`EmbeddedSystem`, an async context manager used by ``hami demo`` and the e2e tests. On
entry it starts the embedded apiserver (OS-chosen port on 127.0.0.1), writes a kubeconfig, creates the
Nodes of a :class:`~hami_testkit.cluster.ClusterSpec`, then starts, each from its command line and waiting
(bounded) until it is ready: the kubelet stand-in (``python -m hami_testkit.kubelet_standin``, one process
for all nodes), one ``hami-node-agent --backend sim`` per node (or, with ``SystemOptions.fleet``, one
``python -m nodeagent.fleet`` for every node: the same agent code, for clusters of a thousand nodes),
``hami scheduler`` and ``hami-webhook
--manage-config``; finally the in-process admission, kube-scheduler and workload stand-ins (the last
turns Deployments, ReplicaSets and Jobs into pods: :mod:`hami_testkit.workloads_standin`). On exit — normal,
error or cancellation — every child process group is stopped (SIGTERM, bounded wait, SIGKILL) before
the apiserver goes away. Must not import ``webhook``, ``nodeagent`` or the Kubernetes client.

Credentials: each component gets its own kubeconfig with its own bearer token, and the apiserver maps
each token to the username the component has in a chart install (:data:`ACCOUNTS`: the scheduler's and
the node agents' service accounts, the webhook's, a kubelet); ``kubeconfig`` (what the demo prints for
kubectl, and what the tests' ``api`` uses) is an ordinary user's. The chart's annotation policy, built
from the chart's own file (:mod:`hami_testkit.admission_policy`), is stored before any component starts,
so the embedded apiserver refuses what a real one with the chart installed would refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import yaml

from hami import objects
from hami.annotations import NODE_REGISTER
from hami.settings import from_device_config
from hami_testkit.admission_policy import BINDINGS_PATH, POLICIES_PATH, annotation_policy, service_account
from hami_testkit.admission_standin import AdmissionStandIn
from hami_testkit.apiserver import REQUEST_LOG, embedded_apiserver, write_kubeconfig
from hami_testkit.cluster import ClusterSpec, NodeFiles, node_object, write_node_files
from hami_testkit.kubeapi import MWC_PATH, SimApi, nodes_path
from hami_testkit.processes import PortReservations, Supervisor, poll_until, python_argv
from hami_testkit.restapi import SERVER_VERSION
from hami_testkit.scheduler_standin import SchedulerStandIn
from hami_testkit.workloads_standin import WorkloadStandIn

#: The request log ``hami demo`` keeps: nothing there reads it, and a long-running demo must not grow.
DEMO_REQUEST_LOG = 50
SCHEDULER = "scheduler"
WEBHOOK = "webhook"
KUBELET = "kubelet-standin"
NODE_AGENT = "node-agent"
#: The child running every node's agent with ``SystemOptions(fleet=True)``.
FLEET = "agent-fleet"
USER = "user"
#: The release namespace of the chart install the embedded cluster plays (release "hami").
NAMESPACE = "hami-system"
#: Who each credential is: the usernames of a chart install (its service accounts), a kubelet, a user.
ACCOUNTS = {
    SCHEDULER: service_account(NAMESPACE, "hami-scheduler"),
    NODE_AGENT: service_account(NAMESPACE, "hami-node-agent"),
    WEBHOOK: service_account(NAMESPACE, "hami-webhook"),
    KUBELET: "system:node:kubelet-standin",
    USER: "kubernetes-admin",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemOptions:
    """Knobs of the embedded system (the defaults suit the demo and the e2e tests)."""

    scheduler_name: str = "hami-scheduler"
    register_interval: float = 1.0
    ready_limit: float = 60.0  # seconds each component may take to become ready
    log_level: str = "INFO"
    #: How many latest requests the embedded apiserver keeps (None: all). The RBAC audit reads them;
    #: the demo keeps :data:`DEMO_REQUEST_LOG`: each logged request holds some 10 KiB.
    request_log: int | None = REQUEST_LOG
    #: Run every node's agent in one process (``python -m nodeagent.fleet``) instead of one
    #: ``hami-node-agent`` per node: the agents' own code, one API client and one pod watch for all.
    fleet: bool = False
    #: With ``fleet``, how many fleet processes share the nodes (contiguous slices, as even as can be):
    #: 1 is ``agent-fleet``; more are ``agent-fleet-0`` ... , so a share of the agents can be restarted
    #: at once (:meth:`EmbeddedSystem.restart_fleet`).
    fleets: int = 1
    #: The kube-scheduler stand-in's queue (docs/scheduler.md, "Waking pending pods"): how long a parked
    #: pod waits for the flush (kube-scheduler's podMaxInUnschedulablePodsDuration) and whether queueing
    #: hints are on (SchedulerQueueingHints).
    flush_after: float = 60.0
    queueing_hints: bool = True
    #: The kube-scheduler stand-in binds in the background as kube-scheduler does (its binding cycle
    #: runs on its own while the next pod is scheduled); False waits for each bind before the next pod.
    background_binds: bool = True
    #: The nodes the kube-scheduler stand-in sends the extender: kube-scheduler's percentageOfNodesToScore
    #: (100, what the chart renders: every node its in-tree filters keep; 0: its adaptive percentage).
    percentage_of_nodes_to_score: int = 100
    #: Extra flags for ``hami scheduler`` (e.g. ``--wake-pending=false``).
    scheduler_args: tuple[str, ...] = ()


class EmbeddedSystem:
    """``async with EmbeddedSystem(cluster, workdir) as system:`` — see the module docstring."""

    def __init__(
        self,
        cluster: ClusterSpec,
        workdir: Path,
        options: SystemOptions | None = None,
        *,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.options = options or SystemOptions()
        self.progress = progress
        self.resource = from_device_config(cluster.device_config).resources.count
        self.kubeconfig = workdir / "kubeconfig"
        #: component (ACCOUNTS key) -> its bearer token and kubeconfig; USER's is ``kubeconfig``
        self.tokens = {who: secrets.token_hex(16) for who in ACCOUNTS}
        self.kubeconfigs = {who: workdir / f"kubeconfig-{who}" for who in ACCOUNTS} | {USER: self.kubeconfig}
        self.device_config = workdir / "device-config.yaml"
        self.supervisor = Supervisor(workdir / "logs")
        self.node_files: dict[str, NodeFiles] = {}
        #: every port a child listens on, held from its choice until the system stops
        self.ports = PortReservations()
        self.scheduler_port = self.ports.take()  # the verbs (the kube-scheduler stand-in calls them)
        self.scheduler_metrics_port = self.ports.take()  # /healthz, /readyz, /metrics
        #: component -> its /metrics URL (scheduler, webhook, one per node agent), filled as they start
        self.metrics_urls: dict[str, str] = {}
        self.stack = contextlib.AsyncExitStack()
        # set on entry
        self.emulator: kmock.KubernetesEmulator | None = None
        self.url = ""
        self.api: SimApi
        self.session: aiohttp.ClientSession
        self.admission: AdmissionStandIn
        self.scheduler: SchedulerStandIn
        self._scheduler_task: asyncio.Task[None] | None = None
        self.workloads: WorkloadStandIn
        self._workloads_task: asyncio.Task[None] | None = None

    @property
    def scheduler_url(self) -> str:
        """The extender verbs (``/filter``, ``/prioritize``, ``/bind``)."""
        return f"http://127.0.0.1:{self.scheduler_port}"

    @property
    def scheduler_metrics_url(self) -> str:
        """The scheduler's ``/healthz``, ``/readyz`` and ``/metrics``."""
        return f"http://127.0.0.1:{self.scheduler_metrics_port}"

    async def __aenter__(self) -> EmbeddedSystem:
        await self.stack.__aenter__()
        self.stack.callback(self.ports.close)  # last out: after every child has stopped
        try:
            await self._start()
        except BaseException:
            await self.stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stack.aclose()

    # ----------------------------------------------------------------------------------- start

    async def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        identities = {self.tokens[who]: user for who, user in ACCOUNTS.items()}
        self.emulator = await self.stack.enter_async_context(
            embedded_apiserver(
                identities=identities, call_webhooks=True, tls=True, request_log=self.options.request_log
            )
        )
        self.url = str(self.emulator.url).rstrip("/")
        for who, path in self.kubeconfigs.items():
            write_kubeconfig(path, self.url, token=self.tokens[who])
        # kubectl and Helm send a token only over HTTPS: the user's kubeconfig names that listener
        tls_url, ca_pem = self.emulator.tls_url, self.emulator.ca_pem
        write_kubeconfig(self.kubeconfig, tls_url, token=self.tokens[USER], ca_pem=ca_pem)
        self.progress(f"apiserver   {self.url} (kubeconfig {self.kubeconfig})")
        self.session = await self.stack.enter_async_context(aiohttp.ClientSession())
        self.api = SimApi(self.session, self.url, token=self.tokens[USER])
        await self.api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        policy, binding = annotation_policy([ACCOUNTS[SCHEDULER], ACCOUNTS[NODE_AGENT]])
        await self.api.create(POLICIES_PATH, policy)
        await self.api.create(BINDINGS_PATH, binding)
        self.device_config.write_text(
            yaml.safe_dump({"nvidia": {}, **dict(self.cluster.device_config)}, sort_keys=False),
            encoding="utf-8",
        )
        for node in self.cluster.nodes:
            self.node_files[node.name] = write_node_files(node, self.workdir / "nodes")
            await self.api.create(nodes_path(), _with_node_info(node_object(node)))
        names = [n.name for n in self.cluster.nodes]
        shown = ", ".join(names) if len(names) <= 10 else f"{len(names)}: {names[0]} ... {names[-1]}"
        self.progress(f"nodes       {shown}")
        await self.stack.enter_async_context(self.supervisor)
        await self._start_node_side()
        await self.start_scheduler()
        await self._start_webhook()
        self.admission = AdmissionStandIn(self.api, self.session, server_admits=True)
        self.scheduler = SchedulerStandIn(
            self.api,
            self.session,
            self.scheduler_url,
            scheduler_name=self.options.scheduler_name,
            warn_other_schedulers=True,  # the only scheduler here: other schedulers' pods are told so
            flush_after=self.options.flush_after,
            queueing_hints=self.options.queueing_hints,
            background_binds=self.options.background_binds,
            percentage_of_nodes_to_score=self.options.percentage_of_nodes_to_score,
        )
        self._scheduler_task = asyncio.create_task(self.scheduler.run(), name="kube-scheduler-standin")
        self.stack.push_async_callback(self._stop_scheduler_standin)
        self.workloads = WorkloadStandIn(self.api)
        self.emulator.collects_garbage = True  # type: ignore[attr-defined]  # Orphan/Foreground deletes
        self._workloads_task = asyncio.create_task(self.workloads.run(), name="workload-standin")
        self.stack.push_async_callback(self._stop_workloads_standin)
        self.progress(
            "stand-ins   admission, kube-scheduler, workloads (Deployments, ReplicaSets, Jobs; in-process),"
            " kubelet (process)"
        )

    async def _start_node_side(self) -> None:
        nodes = [f"{name}={files.kubelet_dir}" for name, files in self.node_files.items()]
        argv = python_argv(
            "-m", "hami_testkit.kubelet_standin", "--kubeconfig", str(self.kubeconfigs[KUBELET])
        )
        for value in nodes:
            argv += ["--node", value]
        await self.supervisor.start(KUBELET, [*argv, "--log-level", self.options.log_level])

        async def sockets() -> bool | None:
            ready = all((f.kubelet_dir / "kubelet.sock").exists() for f in self.node_files.values())
            return True if ready else None

        await self._wait(sockets, "the kubelet stand-in's kubelet.sock on every node", KUBELET)
        if self.options.fleet:
            names = list(self.fleet_nodes())
            for name, nodes in self.fleet_nodes().items():
                await self.supervisor.start(name, self.fleet_argv(nodes, name))
        else:
            for node in self.cluster.nodes:
                files = self.node_files[node.name]
                await self.supervisor.start(f"agent-{node.name}", self.monitor_argv(node.name, files))
            names = [f"agent-{n.name}" for n in self.cluster.nodes]
        await self._wait(self._all_registered, "every node agent to register its cards", KUBELET, *names)
        how = f"in one process ({FLEET})" if self.options.fleet else "one process each"
        self.progress(
            f"monitors    {len(self.cluster.nodes)} node agents {how} registered, device plugins serving"
        )

    def fleet_nodes(self) -> dict[str, list[str]]:
        """Each fleet process's name and its nodes (``SystemOptions.fleets`` contiguous slices)."""
        names = [node.name for node in self.cluster.nodes]
        count = max(1, min(self.options.fleets, len(names) or 1))
        if count == 1:
            return {FLEET: names}
        size, extra = divmod(len(names), count)
        out, start = {}, 0
        for index in range(count):
            end = start + size + (1 if index < extra else 0)
            out[f"{FLEET}-{index}"] = names[start:end]
            start = end
        return out

    async def restart_fleet(self, name: str, *, kill: bool = True) -> None:
        """Stop one fleet process (SIGKILL when ``kill``, as a crash: every agent in it at once) and
        start it again with the same nodes; returns once it is started (its nodes re-register on their
        own, as restarted agents do)."""
        nodes = self.fleet_nodes()[name]
        await self.supervisor.stop(name, sig=signal.SIGKILL if kill else signal.SIGTERM)
        await self.supervisor.start(name, self.fleet_argv(nodes, name))

    def fleet_argv(self, nodes: list[str] | None = None, name: str = FLEET) -> list[str]:
        """``python -m nodeagent.fleet`` for ``nodes`` (every node by default), its fleet file written
        beside the node files."""
        entries = []
        wanted = set(nodes) if nodes is not None else None
        for node in self.cluster.nodes:
            if wanted is not None and node.name not in wanted:
                continue
            files = self.node_files[node.name]
            entry: dict[str, str] = {
                "name": node.name,
                "sim_devices": str(files.devices),
                "kubelet_dir": str(files.kubelet_dir),
                "config": str(files.config),
            }
            if files.hook is not None:
                entry |= {"hook_path": str(files.hook), "lock_dir": str(files.hook / "vgpulock")}
            entries.append(entry)
        fleet_file = self.workdir / ("fleet.yaml" if name == FLEET else f"{name}.yaml")
        fleet_file.write_text(yaml.safe_dump({"nodes": entries}, sort_keys=False), encoding="utf-8")
        metrics = self.ports.take()
        self.metrics_urls[name] = f"http://127.0.0.1:{metrics}/metrics"
        return python_argv(
            "-m", "nodeagent.fleet",
            "--fleet", str(fleet_file),
            "--kubeconfig", str(self.kubeconfigs[NODE_AGENT]),
            "--device-config", str(self.device_config),
            "--register-interval", str(self.options.register_interval),
            "--metrics-listen", f"127.0.0.1:{metrics}",
            "--log-level", self.options.log_level,
        )  # fmt: skip

    def monitor_argv(self, node: str, files: NodeFiles) -> list[str]:
        metrics = self.ports.take()
        self.metrics_urls[f"agent-{node}"] = f"http://127.0.0.1:{metrics}/metrics"
        return python_argv(
            "-m", "nodeagent",
            "--kubeconfig", str(self.kubeconfigs[NODE_AGENT]),
            "--node-name", node,
            "--backend", "sim",
            "--sim-devices", str(files.devices),
            "--config", str(files.config),
            "--device-config", str(self.device_config),
            "--register-interval", str(self.options.register_interval),
            "--kubelet-dir", str(files.kubelet_dir),
            "--metrics-listen", f"127.0.0.1:{metrics}",
            "--log-level", self.options.log_level,
            *(["--hook-path", str(files.hook)] if files.hook is not None else []),
            *(["--lock-dir", str(files.hook / "vgpulock")] if files.hook is not None else []),
        )  # fmt: skip

    async def _all_registered(self) -> bool | None:
        for node in await self.api.list_objects(nodes_path()):
            if objects.name(node) not in self.node_files:
                continue
            if not objects.annotations(node).get(NODE_REGISTER):
                return None
            if int(objects.allocatable(node).get(self.resource) or 0) <= 0:
                return None  # the device plugin has not registered with the kubelet stand-in yet
        return True

    async def start_scheduler(self) -> None:
        argv = python_argv(
            "-m", "hami.cli", "scheduler",
            "--kubeconfig", str(self.kubeconfigs[SCHEDULER]),
            "--listen", f"127.0.0.1:{self.scheduler_port}",
            "--metrics-listen", f"127.0.0.1:{self.scheduler_metrics_port}",
            "--scheduler-name", self.options.scheduler_name,
            "--device-config", str(self.device_config),
            "--log-level", self.options.log_level,
            *self.options.scheduler_args,
        )  # fmt: skip
        await self.supervisor.start(SCHEDULER, argv)
        self.metrics_urls[SCHEDULER] = f"{self.scheduler_metrics_url}/metrics"
        await self._wait(
            lambda: self._http_ok(f"{self.scheduler_metrics_url}/readyz"),
            "the scheduler's /readyz",
            SCHEDULER,
        )
        self.progress(
            f"scheduler   {self.scheduler_url} (extender: /filter /prioritize /bind), "
            f"{self.scheduler_metrics_url} (/healthz /readyz /metrics)"
        )

    async def restart_scheduler(self, *, kill: bool = True) -> None:
        """Stop the scheduler process (SIGKILL when ``kill``, as a crash) and start it again."""
        await self.supervisor.stop(SCHEDULER, sig=signal.SIGKILL if kill else signal.SIGTERM)
        await self.start_scheduler()

    async def _start_webhook(self) -> None:
        port, health, metrics = self.ports.take(), self.ports.take(), self.ports.take()
        argv = python_argv(
            "-m", "webhook",
            "--kubeconfig", str(self.kubeconfigs[WEBHOOK]),
            "--listen", f"127.0.0.1:{port}",
            "--tls-dir", str(self.workdir / "tls"),
            "--manage-config",
            "--scheduler-name", self.options.scheduler_name,
            "--device-config", str(self.device_config),
            "--failure-policy", "Fail",
            "--health-listen", f"127.0.0.1:{health}",
            "--metrics-listen", f"127.0.0.1:{metrics}",
            "--log-level", self.options.log_level,
        )  # fmt: skip
        await self.supervisor.start(WEBHOOK, argv)
        self.metrics_urls[WEBHOOK] = f"http://127.0.0.1:{metrics}/metrics"
        await self._wait(
            lambda: self._http_ok(f"http://127.0.0.1:{health}/healthz"), "the webhook's /healthz", WEBHOOK
        )

        async def configured() -> str | None:
            for config in await self.api.list_objects(MWC_PATH):
                for hook in config.get("webhooks") or []:
                    url = (hook.get("clientConfig") or {}).get("url") or ""
                    if f":{port}/" in url and (hook.get("clientConfig") or {}).get("caBundle"):
                        return str(url)
            return None

        url = await self._wait(
            configured, "the webhook's MutatingWebhookConfiguration (url + caBundle)", WEBHOOK
        )
        self.progress(f"webhook     {url} (MutatingWebhookConfiguration with its CA bundle)")

    async def _http_ok(self, url: str) -> bool | None:
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                return True if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def _wait(self, probe: Callable[[], Awaitable[Any]], what: str, *children: str) -> Any:
        return await poll_until(
            probe, what=what, limit=self.options.ready_limit, alive=lambda: self.supervisor.check(*children)
        )

    async def _stop_scheduler_standin(self) -> None:
        if self._scheduler_task is not None:
            self._scheduler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._scheduler_task

    async def _stop_workloads_standin(self) -> None:
        if self._workloads_task is not None:
            self._workloads_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._workloads_task

    def check_standin(self) -> None:
        """Raise if an in-process stand-in (kube-scheduler, workloads) died (its exception, not a hang)."""
        for task, what in ((self._scheduler_task, "kube-scheduler"), (self._workloads_task, "workload")):
            if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"the {what} stand-in stopped") from task.exception()


def _with_node_info(node: dict[str, Any]) -> dict[str, Any]:
    """What a kubelet reports about itself (``kubectl get nodes`` shows VERSION and, wide, the rest)."""
    status = node.setdefault("status", {})
    status.setdefault("addresses", [{"type": "InternalIP", "address": "127.0.0.1"}])
    status.setdefault(
        "nodeInfo",
        {
            "kubeletVersion": SERVER_VERSION["gitVersion"],
            "osImage": "hami embedded cluster",
            "kernelVersion": "-",
            "containerRuntimeVersion": "kubelet-standin",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    )
    return node
