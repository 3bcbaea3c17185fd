"""Admission of pods pinned to MPS cards (webhook/mps.py through ``plan``): GPU containers that run at
the same time as different users are refused, naming the container and the field; everything MPS can
run, or that admission cannot know, is admitted."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.mps import pins_mps, running_together
from webhook.mutation import Admit, Refuse, plan

from .webhook_cases import DEFAULT, GPU, MEM, ctr, make_pod

MPS = {"nvidia.com/vgpu-mode": "mps"}


def gpu(name: str, user: int | None = None, **extra: Any) -> dict[str, Any]:
    if user is not None:
        extra["securityContext"] = {"runAsUser": user}
    return ctr(name, limits={GPU: "1", MEM: "1000"}, **extra)


def mixed(later: str, where: str, user: int, first: str, first_user: int) -> str:
    return (
        f'container "{later}": {where} {user} differs from container "{first}"\'s user {first_user}, and '
        "both use an MPS card at the same time (nvidia.com/vgpu-mode: mps); one MPS server serves one user "
        "at a time, so one would wait for the other to finish; run the pod's GPU containers as one user"
    )


@pytest.mark.parametrize(
    ("mode", "pinned"),
    [
        ("mps", True),
        ("MPS", False),  # the scheduler's test is case-sensitive: no MPS card matches it
        ("hami-core,mps", False),
        ("mps,mig", False),
        ("", False),
        (None, False),
        ("hami-core", False),
    ],
)
def test_which_pods_pin_mps(mode: str | None, pinned: bool) -> None:
    assert pins_mps(mode) is pinned


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (
            make_pod(gpu("a", 1000), gpu("b", 1001), annotations=MPS),
            mixed("b", "securityContext.runAsUser", 1001, "a", 1000),
        ),
        (  # one user from the pod, the other from the container
            make_pod(gpu("a"), gpu("b", 0), annotations=MPS, securityContext={"runAsUser": 1000}),
            mixed("b", "securityContext.runAsUser", 0, "a", 1000),
        ),
        (  # the pod's user, named as such
            make_pod(gpu("a", 0), gpu("b"), annotations=MPS, securityContext={"runAsUser": 1000}),
            mixed("b", "the pod's securityContext.runAsUser", 1000, "a", 0),
        ),
        (  # a sidecar (restartable init container) runs beside the app containers
            make_pod(gpu("app", 1000), init=(gpu("side", 2000, restartPolicy="Always"),), annotations=MPS),
            mixed("app", "securityContext.runAsUser", 1000, "side", 2000),
        ),
        (  # and beside the init containers declared after it
            make_pod(
                gpu("app", 2000),
                init=(gpu("side", 2000, restartPolicy="Always"), gpu("setup", 3000)),
                annotations=MPS,
            ),
            mixed("setup", "securityContext.runAsUser", 3000, "side", 2000),
        ),
    ],
    ids=["two users", "pod and container", "inherited", "sidecar", "sidecar and init"],
)
def test_gpu_containers_of_two_users_on_mps_are_refused(pod: dict[str, Any], message: str) -> None:
    assert plan(pod, DEFAULT) == Refuse(message=message, code=422, reason="mps_mixed_users")


def test_every_such_container_is_named() -> None:
    pod = make_pod(gpu("a", 1), gpu("b", 2), gpu("c", 3), gpu("d", 1), annotations=MPS)
    decision = plan(pod, DEFAULT)
    assert isinstance(decision, Refuse)
    assert decision.message == "; ".join(
        mixed(name, "securityContext.runAsUser", user, "a", 1) for name, user in (("b", 2), ("c", 3))
    )


@pytest.mark.parametrize(
    "pod",
    [
        make_pod(gpu("a", 1000), gpu("b", 1000), annotations=MPS),  # one user
        make_pod(gpu("a", 1000), gpu("b"), annotations=MPS),  # b runs as its image's user: unknown here
        make_pod(gpu("a", 1000), ctr("log", securityContext={"runAsUser": 0}), annotations=MPS),  # no GPU
        make_pod(gpu("a", 1000), init=(gpu("setup", 0),), annotations=MPS),  # init finishes first
        make_pod(gpu("a", 1000), gpu("b", 1001), annotations={"nvidia.com/vgpu-mode": "hami-core,mps"}),
        make_pod(gpu("a", 1000), gpu("b", 1001)),  # may land on any card: not ours to refuse for MPS
        make_pod(gpu("a", 1000), gpu("b", True), annotations=MPS),  # not an integer: not a user here
    ],
    ids=["one user", "image user", "no GPU", "init first", "not pinned", "no mode", "bool"],
)
def test_what_mps_can_run_or_admission_cannot_know_is_admitted(pod: dict[str, Any]) -> None:
    assert isinstance(plan(pod, DEFAULT), Admit)


def test_running_together() -> None:
    side, setup, early = {"name": "side", "restartPolicy": "Always"}, {"name": "setup"}, {"name": "early"}
    app = {"name": "app"}
    groups = running_together([early, side, setup], [app])
    assert [[c["name"] for c in group] for group in groups] == [["early"], ["side", "setup"], ["side", "app"]]
