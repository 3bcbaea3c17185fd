"""Rejections kept from one ``allocate`` to the next (``hami.core.allocate.RejectionMemo``): every answer
equals the one made without the memo, for any pod, node and policy; a kept one is used only for the very
node state it was made on, a pod of the same shape (another name or namespace) and no quota."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.allocate import RejectionMemo, allocate
from hami.core.model import ContainerRequest, NamespaceQuota, NodeState, Rejection

from .builders import make_card, make_container, make_request, node_state
from .test_precheck import CLUSTER, ITEMS, POLICIES, STEERING, nodes


def _rejections(decisions: object, names: list[str]) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for name in names:
        got = decisions[name]  # type: ignore[index]
        if isinstance(got, Rejection):
            out[name] = (got.node, got.reasons, got.total, got.message, got.resolvable)
    return out


@settings(max_examples=200, deadline=None)
@given(
    states=st.lists(nodes(), min_size=1, max_size=4),
    pods=st.lists(st.tuples(ITEMS, POLICIES, STEERING), min_size=1, max_size=4),
    order=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3), st.booleans()), min_size=1, max_size=12),
)
def test_every_answer_with_the_memo_equals_the_one_without(
    states: list[NodeState],
    pods: list[tuple[list[ContainerRequest | None], str, dict[str, object]]],
    order: list[tuple[int, int, bool]],
) -> None:
    """A stream of pods (repeated shapes under other names) over nodes whose states change (a node name
    taking another drawn state) is answered the same with one memo throughout as with none."""
    memo = RejectionMemo(per_node=3)  # small: overflowing a node's entries is part of the draw
    live = {f"n{i}": replace(state, name=f"n{i}") for i, state in enumerate(states)}
    for step, (pod_at, node_at, change) in enumerate(order):
        if change:  # a node's usage changed: a new state object under the same name
            name = f"n{node_at % len(states)}"
            live[name] = replace(states[(node_at + step) % len(states)], name=name)
        items, policy, steering = pods[pod_at % len(pods)]
        extra: dict[str, Any] = dict(steering)
        request = make_request(
            *items, name=f"pod-{step}", namespace=f"ns-{step % 2}", gpu_policy=policy, **extra
        )
        nodes_now = list(live.values())
        names = [n.name for n in nodes_now]
        with_memo = allocate(request, nodes_now, CLUSTER, memo=memo)
        without = allocate(request, nodes_now, CLUSTER)
        assert with_memo.fitting == without.fitting
        assert _rejections(with_memo, names) == _rejections(without, names)


def _full() -> NodeState:
    return node_state("n1", [make_card(f"GPU-{i}", used=10, count=10) for i in range(2)])


def test_a_kept_rejection_serves_the_same_shape_on_the_same_state_only() -> None:
    memo = RejectionMemo()
    node = _full()
    first = allocate(make_request(make_container(1), name="a", namespace="x"), [node], CLUSTER, memo=memo)
    kept = first["n1"]
    assert isinstance(kept, Rejection)
    assert len(memo) == 1
    again = allocate(make_request(make_container(1), name="b", namespace="y"), [node], CLUSTER, memo=memo)
    assert again["n1"] is kept  # another pod of the same shape: the kept answer
    other = allocate(make_request(make_container(2), name="c"), [node], CLUSTER, memo=memo)
    assert other["n1"] is not kept and len(memo) == 2  # another shape: its own
    changed = replace(node)  # equal, but a new state object: never trusted
    fresh = allocate(make_request(make_container(1), name="d"), [changed], CLUSTER, memo=memo)
    assert fresh["n1"] is not kept and fresh["n1"] == kept
    assert len(memo) == 1  # the node's entries for its old state went


def test_rejections_under_a_quota_are_never_kept() -> None:
    memo = RejectionMemo()
    quota = {"x": NamespaceQuota(memory_limit=100_000)}
    request = make_request(make_container(1), name="a", namespace="x")
    decisions = allocate(request, [_full()], CLUSTER, quotas=quota, memo=memo)
    assert isinstance(decisions["n1"], Rejection)
    assert len(memo) == 0
