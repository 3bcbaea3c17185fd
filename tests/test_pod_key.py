"""The one ``pod_key``: how the scheduler, the node agent and the doctor name a pod."""

from __future__ import annotations

from typing import Any

import pytest

from hami.doctor.findings import pod_key as doctor_key
from hami.objects import pod_key
from hami.scheduler import filter as scheduler_filter
from nodeagent import allocate_call, mig, pairing


@pytest.mark.parametrize(
    ("pod", "key"),
    [
        ({"metadata": {"namespace": "team", "name": "p"}}, ("team", "p")),
        ({"metadata": {"name": "p"}}, ("", "p")),  # no namespace is made up (the agent said "default")
        ({"metadata": {"namespace": 7, "name": ["p"]}}, ("", "")),
        ({"metadata": "not an object"}, ("", "")),
        ({}, ("", "")),
    ],
)
def test_every_component_names_a_pod_the_same_way(pod: dict[str, Any], key: tuple[str, str]) -> None:
    assert pod_key(pod) == key
    assert all(
        vars(module)["pod_key"] is pod_key for module in (scheduler_filter, pairing, allocate_call, mig)
    )
    assert doctor_key(pod) == f"{key[0]}/{key[1]}"
