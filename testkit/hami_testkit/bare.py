"""A bare embedded cluster: the embedded apiserver, its Nodes and the Job stand-in, none of our components.

Owns :class:`BareCluster`, what ``hami demo --bare`` runs and the chart's install tests use: an async
context manager that starts the embedded apiserver on OS-chosen ports of 127.0.0.1 (it calls the
stored mutating webhooks on pod CREATE and enforces stored ValidatingAdmissionPolicies, as
kube-apiserver does), writes a kubeconfig for its HTTPS listener (kubectl and Helm send credentials
only over HTTPS) whose token is the cluster's admin user (the demo's ``kubernetes-admin``), creates
the Nodes of a :class:`~hami_testkit.cluster.ClusterSpec` as a kubelet would register them (Ready, no GPU
annotations: no node agent runs), and runs the Job stand-in (:class:`hami_testkit.jobs.JobStandIn`), so
the chart's certificate hooks run when Helm installs or upgrades it. No scheduler, webhook, node
agent, kubelet or workload stand-in runs: Deployments and DaemonSets installed here are stored, not
run (``kubectl scale`` edits a stored Deployment's ``spec.replicas``, as the apiserver does). On exit
the Job stand-in (and any Job it still runs) is stopped before the apiserver goes away.
Must not import ``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from pathlib import Path

import aiohttp

from hami_testkit.apiserver import AdmittingEmulator, embedded_apiserver, write_kubeconfig
from hami_testkit.cluster import ClusterSpec, node_object
from hami_testkit.jobs import JobStandIn
from hami_testkit.kubeapi import SimApi, nodes_path
from hami_testkit.system import ACCOUNTS, USER


class BareCluster:
    """``async with BareCluster(cluster, workdir) as bare:`` — see the module docstring."""

    def __init__(
        self,
        cluster: ClusterSpec | None,
        workdir: Path,
        *,
        job_timeout: float = 120.0,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.progress = progress
        self.job_timeout = job_timeout
        self.kubeconfig = workdir / "kubeconfig"
        #: the admin user's bearer token (in ``kubeconfig``)
        self.token = secrets.token_hex(16)
        self.user = ACCOUNTS[USER]
        self.url = ""
        self.stack = contextlib.AsyncExitStack()
        # set on entry
        self.emulator: AdmittingEmulator
        self.api: SimApi
        self.jobs: JobStandIn
        self._jobs_task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> BareCluster:
        await self.stack.__aenter__()
        try:
            await self._start()
        except BaseException:
            await self.stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stack.aclose()

    async def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.emulator = await self.stack.enter_async_context(
            embedded_apiserver(identities={self.token: self.user}, call_webhooks=True, tls=True)
        )
        self.url = self.emulator.tls_url
        write_kubeconfig(self.kubeconfig, self.url, token=self.token, ca_pem=self.emulator.ca_pem)
        self.progress(f"apiserver   {self.url} (kubeconfig {self.kubeconfig}, user {self.user})")
        session = await self.stack.enter_async_context(aiohttp.ClientSession())
        # in-process calls take the plain listener (the same server)
        self.api = SimApi(session, str(self.emulator.url).rstrip("/"), token=self.token)
        nodes = self.cluster.nodes if self.cluster is not None else ()
        for node in nodes:
            await self.api.create(nodes_path(), node_object(node))
        if nodes:
            self.progress(f"nodes       {', '.join(n.name for n in nodes)} (no node agent, no kubelet)")
        self.jobs = JobStandIn(self.api, self.kubeconfig, timeout=self.job_timeout)
        self._jobs_task = asyncio.create_task(self.jobs.run(), name="job-standin")
        self.stack.push_async_callback(self._stop_jobs)
        self.progress(
            "stand-ins   Jobs: the chart's certificate hooks (python -m webhook.certs) as processes"
        )

    async def _stop_jobs(self) -> None:
        if self._jobs_task is not None:
            self._jobs_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._jobs_task

    def check(self) -> None:
        """Raise if the Job stand-in stopped (its exception, not a silent hang)."""
        task = self._jobs_task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError("the Job stand-in stopped") from task.exception()
