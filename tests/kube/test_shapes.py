"""Objects of hostile shapes through hami.kube: metadata, annotations or a spec that are not JSON objects
read as absent (the kube helpers build their writes and Events from what is readable, never raise)."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from hami.annotations import NODE_DEVICE_CORDON
from hami.kube.cordon import cordon_of
from hami.kube.events import EventRecorder, build_event
from hami.kube.pods import list_pods, unchanged_tests, value_tests, write_operations

Emulator = kmock.KubernetesEmulator
NOT_OBJECTS = ["metadata", ["metadata"], 7, None]


@pytest.mark.parametrize("metadata", NOT_OBJECTS)
def test_conditional_patches_of_a_pod_whose_metadata_is_not_an_object(metadata: Any) -> None:
    pod = {"metadata": metadata}
    # the whole metadata is tested against what could be read ({}): the server refuses the write
    assert unchanged_tests(pod) == [{"op": "test", "path": "/metadata", "value": {}}]
    assert value_tests(pod, {"k": "v"}) == [{"op": "test", "path": "/metadata/annotations/k", "value": "v"}]
    assert write_operations(pod, annotations={"k": "v", "gone": None}) == [
        {"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}
    ]


@pytest.mark.parametrize("metadata", NOT_OBJECTS)
def test_an_event_about_an_object_whose_metadata_is_not_an_object(metadata: Any) -> None:
    event = build_event(involved={"metadata": metadata}, reason="R", message="m", component="c")
    assert event["metadata"]["namespace"] == "default"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": ""}


@pytest.mark.parametrize(
    "node",
    [
        {"metadata": "n1"},
        {"metadata": {"annotations": [NODE_DEVICE_CORDON]}},
        {"metadata": {"annotations": {NODE_DEVICE_CORDON: ["GPU-0"]}}},
    ],
)
def test_a_cordon_list_that_is_not_text_reads_as_none(node: Any) -> None:
    assert cordon_of(node) == frozenset()


@pytest.mark.parametrize("metadata", NOT_OBJECTS)
async def test_the_recorder_does_not_follow_a_pod_whose_metadata_is_not_an_object(
    api: Any, metadata: Any
) -> None:
    recorder = EventRecorder(api, component="test")
    assert recorder.record({"metadata": metadata}, reason="R", message="m") is False
    assert len(recorder) == 0


async def test_listing_the_pods_of_a_node_skips_pods_whose_spec_is_not_an_object(
    apiserver: Emulator, api: Any
) -> None:
    for name, spec in (("good", {"nodeName": "n1", "containers": []}), ("bad", "n1"), ("worse", ["n1"])):
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}}
        await apiserver.post("/api/v1/namespaces/default/pods", json={**body, "spec": spec})
    assert [pod["metadata"]["name"] for pod in await list_pods(api, node_name="n1")] == ["good"]
