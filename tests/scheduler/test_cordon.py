"""``hami cordon``/``uncordon``: compare-and-set edits of ``hami.io/device-cordon`` on the embedded API
server, and the extender honouring them (``CardCordoned``)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami import cli
from hami.annotations import NODE_DEVICE_CORDON, NODE_REGISTER
from hami.commands.cordon import CordonError, cordon_command
from hami.kube.client import load_api_client
from hami.kube.cordon import CORDON_POINTER as POINTER
from hami.kube.cordon import update_device_cordon
from hami.kube.nodes import JSON_PATCH
from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)
from tests.builders import make_node, make_pod
from tests.eventually import eventually

from .kit import StartExtender

Emulator = kmock.KubernetesEmulator
NODES = kmock.resource("v1/nodes")
A0, A1, A2 = "GPU-n1-0", "GPU-n1-1", "GPU-n1-2"


@pytest.fixture
def api(kubeconfig: Path) -> Iterator[Any]:
    client = load_api_client(str(kubeconfig), request_timeout=5.0)
    yield client
    client.close()


async def _annotations(k: Emulator, name: str = "n1") -> dict[str, str]:
    node = await (await k.get(f"/api/v1/nodes/{name}")).json()
    annotations: dict[str, str] = node["metadata"].get("annotations") or {}
    return annotations


async def _run(api: Any, cards: list[str], *, cordon: bool = True, show: bool = False) -> str:
    out = io.StringIO()
    assert await cordon_command(api, "n1", cards, cordon=cordon, show=show, out=out) == 0
    return out.getvalue()


async def test_cordon_adds_and_a_second_cordon_writes_nothing(apiserver: Emulator, api: Any) -> None:
    await apiserver.post("/api/v1/nodes", json=make_node("n1", cards=3, annotations={"other": "kept"}))
    text = await _run(api, [A1, "#2"])
    assert f"cordoned {A1} (#1 NVIDIA-Tesla V100-PCIE-32GB) on node n1" in text
    assert f"cordoned {A2} (#2 " in text
    annotations = await _annotations(apiserver)
    assert annotations[NODE_DEVICE_CORDON] == f"{A1},{A2}"
    assert annotations["other"] == "kept"
    patches = list(apiserver["patch", NODES])
    assert len(patches) == 1 and patches[0].data[0]["op"] == "test"  # a compare-and-set

    text = await _run(api, [A1])
    assert f"{A1} (#1 NVIDIA-Tesla V100-PCIE-32GB) on node n1 is already cordoned" in text
    assert "nothing written" in text
    assert len(apiserver["patch", NODES]) == 1
    assert (await _annotations(apiserver))[NODE_DEVICE_CORDON] == f"{A1},{A2}"


async def test_uncordon_removes_and_the_last_removal_deletes_the_annotation(
    apiserver: Emulator, api: Any
) -> None:
    await apiserver.post(
        "/api/v1/nodes", json=make_node("n1", cards=3, annotations={NODE_DEVICE_CORDON: f" {A2}, {A0} ,"})
    )
    text = await _run(api, [A0], cordon=False)
    assert f"uncordoned {A0} (#0 " in text
    assert (await _annotations(apiserver))[NODE_DEVICE_CORDON] == A2
    text = await _run(api, [A1], cordon=False)
    assert "already uncordoned" in text and f"node n1 cordoned cards: {A2}" in text
    text = await _run(api, ["#2"], cordon=False)
    assert "node n1 cordoned cards: none (annotation removed)" in text
    annotations = await _annotations(apiserver)
    assert NODE_DEVICE_CORDON not in annotations
    assert NODE_REGISTER in annotations  # only the cordon key went
    text = await _run(api, [A0], cordon=False)
    assert "nothing written" in text and text.endswith("node n1 cordoned cards: none\n")


async def test_uncordon_drops_a_listed_card_the_node_no_longer_registers(
    apiserver: Emulator, api: Any
) -> None:
    await apiserver.post(
        "/api/v1/nodes", json=make_node("n1", annotations={NODE_DEVICE_CORDON: f"GPU-gone,{A0}"})
    )
    listing = await _run(api, [], show=True)
    assert "node n1: 2 cards, 2 cordoned" in listing
    assert "GPU-gone  (not registered on this node)  cordoned" in listing
    await _run(api, ["GPU-gone"], cordon=False)
    assert (await _annotations(apiserver))[NODE_DEVICE_CORDON] == A0
    with pytest.raises(CordonError, match="has no card 'GPU-gone'"):
        await _run(api, ["GPU-gone"])  # but it cannot be cordoned again


async def test_unknown_cards_are_refused_with_the_node_s_card_list(apiserver: Emulator, api: Any) -> None:
    await apiserver.post("/api/v1/nodes", json=make_node("n1", cards=2))
    with pytest.raises(CordonError) as caught:
        await _run(api, [A0, "GPU-typo", "#7"])
    message = str(caught.value)
    assert "node n1 has no card 'GPU-typo', '#7'" in message
    assert f"#0 {A0} NVIDIA-Tesla V100-PCIE-32GB; #1 {A1} NVIDIA-Tesla V100-PCIE-32GB" in message
    assert len(apiserver["patch", NODES]) == 0  # nothing written, not even the valid card
    with pytest.raises(CordonError, match="node ghost not found"):
        await cordon_command(api, "ghost", [A0], cordon=True, show=False, out=io.StringIO())


async def test_a_node_without_registration_says_why(apiserver: Emulator, api: Any) -> None:
    await apiserver.post(
        "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    )
    with pytest.raises(CordonError, match=f"has no card '{A0}': it has no {NODE_REGISTER} annotation"):
        await _run(api, [A0])


async def test_a_concurrent_writer_s_entry_is_kept(apiserver: Emulator, api: Any) -> None:
    await apiserver.post("/api/v1/nodes", json=make_node("n1", cards=3, annotations={NODE_DEVICE_CORDON: A0}))

    async def someone_else_cordons_first(request: kmock.Request) -> Response:
        # between our read and our patch another admin cordons card 2; then our own patch reaches the
        # emulator (this reaction serves only the first PATCH), whose ``test`` op now fails
        body = {"metadata": {"annotations": {NODE_DEVICE_CORDON: f"{A0},{A2}"}}}
        await apiserver.patch("/api/v1/nodes/n1", json=body)
        ours = await apiserver.patch(
            "/api/v1/nodes/n1", json=request.data, headers={"Content-Type": JSON_PATCH}
        )
        return Response(status=ours.status, payload=await ours.read())

    (apiserver**10)["patch", NODES][:1] << someone_else_cordons_first
    update = await update_device_cordon(api, "n1", add=[A1])
    patches = [r.data for r in apiserver["patch", NODES]]
    assert patches[1] == {"metadata": {"annotations": {NODE_DEVICE_CORDON: f"{A0},{A2}"}}}  # the rival
    assert patches[2][0] == {"op": "test", "path": POINTER, "value": A0}  # our first try: refused
    assert patches[3][0] == {"op": "test", "path": POINTER, "value": f"{A0},{A2}"}  # the retry
    assert (await _annotations(apiserver))[NODE_DEVICE_CORDON] == f"{A0},{A1},{A2}"
    assert update.before == {A0, A2} and update.after == {A0, A1, A2}


async def test_concurrent_cordons_all_land(apiserver: Emulator, api: Any) -> None:
    await apiserver.post("/api/v1/nodes", json=make_node("n1", cards=4, annotations={"x": "y"}))
    uuids = [f"GPU-n1-{i}" for i in range(4)]
    await asyncio.gather(*(update_device_cordon(api, "n1", add=[uuid]) for uuid in uuids))
    assert (await _annotations(apiserver))[NODE_DEVICE_CORDON] == ",".join(uuids)


async def test_the_console_script(
    apiserver: Emulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await apiserver.post("/api/v1/nodes", json=make_node("n1", cards=2))
    config = ["--kubeconfig", str(kubeconfig)]
    # the console script runs its own event loop: keep it off the loop serving the apiserver
    assert await asyncio.to_thread(cli.main, ["cordon", "n1", A1, *config]) == 0
    assert f"cordoned {A1}" in capsys.readouterr().out
    assert await asyncio.to_thread(cli.main, ["cordon", "n1", "--list", *config]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0] == "node n1: 2 cards, 1 cordoned"
    assert listing[1].split() == ["#0", A0, "NVIDIA-Tesla", "V100-PCIE-32GB"]
    assert listing[2].split() == ["#1", A1, "NVIDIA-Tesla", "V100-PCIE-32GB", "cordoned"]
    assert await asyncio.to_thread(cli.main, ["uncordon", "n1", "GPU-nope", *config]) == 2
    assert "hami uncordon: node n1 has no card 'GPU-nope'" in capsys.readouterr().err
    assert await asyncio.to_thread(cli.main, ["uncordon", "n1", *config]) == 2
    assert "name at least one card" in capsys.readouterr().err
    assert await asyncio.to_thread(cli.main, ["uncordon", "n1", "#1", *config]) == 0
    assert NODE_DEVICE_CORDON not in await _annotations(apiserver)


async def test_the_extender_skips_a_cordoned_card(start_extender: StartExtender, api: Any) -> None:
    ext = await start_extender(nodes=[make_node("n1", cards=1)])
    assert (await ext.filter(make_pod("p"), ["n1"]))["NodeNames"] == ["n1"]
    await update_device_cordon(api, "n1", add=[A0])

    def seen() -> bool:
        entry = next(e for e in ext.ctx.snapshot.entries() if e.name == "n1")
        return entry.state is not None and A0 in entry.state.cordoned

    await eventually(seen, "the extender to see the cordon")
    result = await ext.filter(make_pod("p"), ["n1"])
    assert result["NodeNames"] == []
    failed = {**result["FailedNodes"], **result["FailedAndUnresolvableNodes"]}
    assert "CardCordoned" in failed["n1"]
