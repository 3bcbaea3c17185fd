"""End to end, enforcement (issue 22 item 3): on an embedded cluster where one node has HAMi-core (the
demo's stand-in library under its hook path) and one has none, the agents report what is installed, the
doctor warns about the bare node only, a pod requiring ``cooperative`` is not placed there, a pod placed
there carries ``hami.io/vgpu-enforcement`` = none and a ``NoEnforcement`` Warning Event, the demo's table
shows the ENFORCEMENT column, and an unreadable requirement is refused at admission."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hami.annotations import (
    NODE_ENFORCEMENT,
    POD_REQUIRE_ENFORCEMENT,
    POD_VGPU_ENFORCEMENT,
    decode_node_enforcement,
    decode_pod_enforcement,
)
from hami.doctor.enforcement import check_enforcement
from hami_testkit.cluster import parse_cluster
from hami_testkit.demo_session import final_state, submit_all, wait_decided
from hami_testkit.kubeapi import nodes_path
from hami_testkit.report import card_index, describe, legend, render
from hami_testkit.system import EmbeddedSystem
from tests.eventually import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SAFE, BARE = "GPU-5afe0000-0000-4000-8000-000000000001", "GPU-ba4e0000-0000-4000-8000-000000000002"
CLUSTER = f"""
nodes:
  - name: safe
    labels: {{node: safe}}
    cards:
      - {{uuid: {SAFE}, model: NVIDIA A10, memory_mib: 23028}}
  - name: bare
    labels: {{node: bare}}
    hami_core: false
    cards:
      - {{uuid: {BARE}, model: NVIDIA A10, memory_mib: 23028}}
"""


def _pod(name: str, node: str, level: str | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {} if level is None else {POD_REQUIRE_ENFORCEMENT: level},
        },
        "spec": {
            "nodeSelector": {"node": node},
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
    }


async def test_a_node_without_enforcement_is_visible_and_avoided_on_request(workdir: Path) -> None:
    async with EmbeddedSystem(parse_cluster(CLUSTER, source="enforcement"), workdir) as system:
        nodes = {n["metadata"]["name"]: n for n in await system.api.list_objects(nodes_path())}
        reported = {
            name: decode_node_enforcement(node["metadata"]["annotations"][NODE_ENFORCEMENT])
            for name, node in nodes.items()
        }
        assert reported == {"safe": {SAFE: "hami-core"}, "bare": {BARE: "none"}}
        (warning,) = check_enforcement(nodes.values())
        assert warning.subject == "node bare"

        pods = [
            _pod("plain-bare", "bare"),
            _pod("plain-safe", "safe"),
            _pod("strict-bare", "bare", "cooperative"),
            _pod("bad-level", "safe", "strong"),
        ]
        names, refused = await submit_all(system, pods)
        assert await wait_decided(system, names, refused, limit=120) == []
        stored = await final_state(system, names, refused)

        assert list(refused) == ["default/bad-level"]
        assert f'annotation {POD_REQUIRE_ENFORCEMENT} "strong": unknown enforcement level' in (
            refused["default/bad-level"].message
        )
        strict = stored["default/strict-bare"]
        assert not strict["spec"].get("nodeName")
        attempt = system.scheduler.attempt(strict)
        assert attempt is not None and "CardEnforcementInsufficient" in attempt.message
        granted = {
            name: decode_pod_enforcement(
                stored[f"default/{name}"]["metadata"]["annotations"][POD_VGPU_ENFORCEMENT]
            )
            for name in ("plain-bare", "plain-safe")
        }
        assert granted == {"plain-bare": {BARE: "none"}, "plain-safe": {SAFE: "hami-core"}}

        async def warned() -> list[dict[str, Any]]:
            events = await system.api.list_objects("/api/v1/namespaces/default/events")
            return [e for e in events if e.get("reason") == "NoEnforcement"]

        (event,) = await eventually(warned, "the NoEnforcement Event", within=60)
        assert event["involvedObject"]["name"] == "plain-bare" and event["type"] == "Warning"
        assert f"placed on card {BARE} of node bare without enforcement" in event["message"]

        reports = [
            describe(n, stored[n], refused.get(n), system.scheduler, card_index(system.cluster))
            for n in names
        ]
        table = render(reports).splitlines()
        assert "ENFORCEMENT" in table[0].split()
        column = table[0].index("ENFORCEMENT")
        rows = {
            line.split()[0]: line[column:].split()[0] for line in table[1:] if line.startswith("default/")
        }
        assert rows["default/plain-bare"] == "none" and rows["default/plain-safe"] == "hami-core"
        assert "none: nothing, its memory/core limits are not held" in " ".join(legend(reports).split())
