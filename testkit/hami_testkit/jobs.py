"""SIMULATION ONLY: kube's Job controller for the chart's own Jobs (Helm's hooks), which the embedded
cluster lacks.

:func:`runs_as_process` is the one place that decides who runs a Job: a Job whose one container runs
``python -m MODULE ...`` with a module of :data:`MODULES` (the chart's certificate Jobs:
``webhook.certs``) is run here; every other Job gets pods from the workload stand-in
(:mod:`hami_testkit.workloads_standin`), which skips the Jobs run here. :class:`JobStandIn` watches Jobs and
runs each new one of its own as a child process of this interpreter, with the Job's arguments and a
kubeconfig for the embedded cluster (``HAMI_KUBECONFIG``), bounded by ``timeout`` seconds; its outcome
is written to the Job's status the way the Job controller writes it (``succeeded``/``failed``, the
``Complete`` or ``Failed`` condition), which is what Helm waits for. Must not import ``webhook``,
``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hami import objects
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi
from hami_testkit.processes import python_argv

logger = logging.getLogger("hami_testkit.jobs")

#: The Python modules whose Jobs the stand-in runs (the chart's own images).
MODULES = frozenset({"webhook.certs"})
JOBS = "/apis/batch/v1/jobs"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_argv(job: Mapping[str, Any]) -> list[str] | None:
    """The command line of a Job the stand-in runs here, or None."""
    containers = (((job.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    if len(containers) != 1:
        return None
    argv = [str(a) for a in (containers[0].get("command") or []) + (containers[0].get("args") or [])]
    if len(argv) < 3 or argv[0] not in ("python", "python3") or argv[1] != "-m" or argv[2] not in MODULES:
        return None
    return python_argv(*argv[1:])


def runs_as_process(job: Mapping[str, Any]) -> bool:
    """True for the Jobs :class:`JobStandIn` runs as processes; the workload stand-in runs the others."""
    return job_argv(job) is not None


class JobStandIn:
    """Runs the chart's Jobs against the embedded cluster (see the module docstring)."""

    def __init__(self, api: SimApi, kubeconfig: Path, *, timeout: float = 120.0) -> None:
        self._api = api
        self._kubeconfig = kubeconfig
        self._timeout = timeout
        self._seen: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Job (namespace/name) -> what its process printed (for tests and diagnostics).
        self.output: dict[str, str] = {}

    async def run(self) -> None:
        """Watch Jobs until cancelled; cancelling also stops the Jobs still running."""
        try:
            async for kind, job in self._api.watch(JOBS):
                uid = objects.uid(job) or f"{objects.namespace(job)}/{objects.name(job)}"
                if kind == "DELETED" or uid in self._seen or objects.status(job).get("conditions"):
                    continue
                if not runs_as_process(job):
                    continue  # the workload stand-in gives it pods
                self._seen.add(uid)
                task = asyncio.create_task(self._run(job), name=f"job {objects.name(job)}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _run(self, job: JsonDict) -> None:
        namespace, name = objects.namespace(job) or "default", objects.name(job)
        argv = job_argv(job)
        assert argv is not None  # run() starts only the Jobs that runs_as_process() chose
        started = _now()
        ok, text = await self._process(argv)
        self.output[f"{namespace}/{name}"] = text
        condition = {
            "type": "Complete" if ok else "Failed",
            "status": "True",
            "lastProbeTime": _now(),
            "lastTransitionTime": _now(),
            "reason": "" if ok else "BackoffLimitExceeded",
            "message": "" if ok else text[-500:],
        }
        conditions = [condition, {**condition, "type": "SuccessCriteriaMet" if ok else "FailureTarget"}]
        status = {
            "startTime": started,
            "active": 0,
            "succeeded" if ok else "failed": 1,
            "conditions": conditions,
            **({"completionTime": _now()} if ok else {}),
        }
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}/status"
        try:
            await self._api.merge_patch(path, {"status": status})
        except ApiError as exc:  # e.g. deleted meanwhile
            logger.info("job %s/%s: status not written: %s", namespace, name, exc)

    async def _process(self, argv: list[str]) -> tuple[bool, str]:
        env = {**os.environ, "HAMI_KUBECONFIG": str(self._kubeconfig), "KUBECONFIG": str(self._kubeconfig)}
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self._timeout)
        except (TimeoutError, asyncio.CancelledError):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
        return process.returncode == 0, output.decode("utf-8", errors="replace")
