"""The raw-object accessors (``hami.objects``): well-formed objects read as the API writes them, and any
JSON value in any position reads as absent instead of raising."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami import objects
from hami.objects import RawNode, RawPod

POD: RawPod = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "42",
        "labels": {"app": "x"},
        "annotations": {"hami.io/vgpu-node": "n1"},
    },
    "spec": {
        "nodeName": "n1",
        "schedulerName": "hami-scheduler",
        "initContainers": [{"name": "i"}],
        "containers": [{"name": "a"}, {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    },
    "status": {"phase": "Running"},
}
NODE: RawNode = {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}


def test_a_well_formed_pod_reads_as_written() -> None:
    assert (objects.name(POD), objects.namespace(POD), objects.uid(POD)) == ("p", "ns", "u-1")
    assert objects.resource_version(POD) == "42"
    assert objects.labels(POD) == {"app": "x"}
    assert objects.annotations(POD) == {"hami.io/vgpu-node": "n1"}
    assert (objects.node_name(POD), objects.scheduler_name(POD), objects.pod_phase(POD)) == (
        "n1",
        "hami-scheduler",
        "Running",
    )
    assert [c.get("name") for c in objects.containers(POD)] == ["a", "b"]
    assert [c.get("name") for c in objects.init_containers(POD)] == ["i"]
    assert objects.meta(POD) is POD["metadata"]  # as stored, for writers that echo it
    assert objects.spec(POD)["nodeName"] == "n1"
    assert objects.status(POD) == {"phase": "Running"}


def test_a_well_formed_node_and_list_read_as_written() -> None:
    assert objects.name(NODE) == "n1"
    assert objects.namespace(NODE) == ""  # cluster-scoped
    assert objects.allocatable(NODE) == {"cpu": "4", "memory": "8Gi"}
    body = {"metadata": {"resourceVersion": "7"}, "items": [NODE, {"metadata": {"name": "n2"}}]}
    assert [objects.name(item) for item in objects.items(body)] == ["n1", "n2"]
    assert objects.resource_version(body) == "7"


def test_a_string_map_of_strings_is_handed_back_without_a_copy() -> None:
    # annotations are read many times per pod by the scheduler: the common case costs no copy
    assert objects.annotations(POD) is POD["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": "1", "b": 2, "c": None, "d": ["x"]}, {"a": "1"}),
        ({1: "x", "k": "v"}, {"k": "v"}),
        (["a", "b"], {}),
        ("a=b", {}),
        (None, {}),
    ],
)
def test_maps_that_are_not_string_maps_keep_only_their_string_entries(value: Any, expected: Any) -> None:
    assert objects.annotations({"metadata": {"annotations": value}}) == expected
    assert objects.labels({"metadata": {"labels": value}}) == expected


@pytest.mark.parametrize("metadata", ["annotations", ["annotations"], 3, None])
def test_metadata_that_is_not_an_object_reads_as_empty(metadata: Any) -> None:
    pod = {"metadata": metadata}
    assert objects.meta(pod) == {}
    assert objects.annotations(pod) == {}
    assert objects.labels(pod) == {}


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": {"name": 5, "namespace": ["x"], "uid": {"a": 1}, "resourceVersion": 7}},
        {"metadata": 17},
        {"metadata": None},
        {"spec": "n1", "status": ["Running"]},
        {"spec": {"nodeName": 1, "schedulerName": True}, "status": {"phase": 3}},
    ],
)
def test_fields_of_the_wrong_type_read_as_absent(pod: Any) -> None:
    assert (objects.name(pod), objects.namespace(pod), objects.uid(pod)) == ("", "", "")
    assert objects.resource_version(pod) == ""
    assert (objects.node_name(pod), objects.scheduler_name(pod), objects.pod_phase(pod)) == ("", "", "")


@pytest.mark.parametrize(
    "containers",
    ["abc", {"name": "a"}, 3, None, ["abc", 3, None, ["x"]]],
)
def test_containers_that_are_not_objects_are_skipped(containers: Any) -> None:
    pod = {"spec": {"containers": containers, "initContainers": containers}}
    assert objects.containers(pod) == []
    assert objects.init_containers(pod) == []


def test_only_the_object_entries_of_a_mixed_container_list_are_kept() -> None:
    pod = {"spec": {"containers": ["x", {"name": "a"}, 7, {"name": "b"}]}}
    assert [c.get("name") for c in objects.containers(pod)] == ["a", "b"]


@pytest.mark.parametrize("body", [{"items": "abc"}, {"items": {"a": {}}}, {"items": [1, "x", None]}, [], "x"])
def test_list_items_that_are_not_objects_are_skipped(body: Any) -> None:
    assert objects.items(body) == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
# a well-formed skeleton with any JSON value put at one of the places readers dig into
PLACES = (
    "",
    "metadata",
    "annotations",
    "labels",
    "name",
    "spec",
    "containers",
    "container",
    "status",
    "items",
)


def _hostile(place: str, value: Any) -> Any:
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "annotations": {"k": "v"}, "labels": {"k": "v"}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
        "items": [],
    }
    if place == "":
        return value
    if place in ("metadata", "spec", "status", "items"):
        pod[place] = value
    elif place == "containers":
        pod["spec"]["containers"] = value
    elif place == "container":
        pod["spec"]["containers"] = [value]
    else:
        pod["metadata"][place] = value
    return pod


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(PLACES), JSON)
def test_no_accessor_raises_whatever_json_it_is_handed(place: str, value: Any) -> None:
    obj = _hostile(place, value)
    texts: list[Callable[[object], str]] = [
        objects.name,
        objects.namespace,
        objects.uid,
        objects.resource_version,
        objects.node_name,
        objects.scheduler_name,
        objects.pod_phase,
    ]
    assert all(isinstance(read(obj), str) for read in texts)
    for strings in (objects.annotations(obj), objects.labels(obj)):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in strings.items())
    for entries in (objects.containers(obj), objects.init_containers(obj), objects.items(obj)):
        assert all(isinstance(entry, dict) for entry in entries)
    assert all(isinstance(entry, dict) for entry in objects.containers_init_first(obj))
    assert isinstance(objects.priority(obj), int) and isinstance(objects.finished(obj), bool)
    assert isinstance(objects.start_time(obj, 7.0), float)
    for mapping in (objects.meta(obj), objects.spec(obj), objects.status(obj), objects.allocatable(obj)):
        assert isinstance(mapping, dict)
