"""Faithful replay (slow): on Alibaba's default openb trace (shipped in tests/data/openb) our replay of the
paper's BestFit, Packing, DotProd and FGD lands where the paper's simulator did, and ``fragmentation``
leaves less unallocated than FGD on the same seed where CPU is contended.

The full claim (seeds 42..51, every trace, within ±1.0 point of the paper's mean) is measured by the
table in docs/policies.md, "Measured" (``hami published``, held to the page by test_published.py); CI
runs one seed per policy to stay within its time. One run's value scatters around our mean with about
the paper's per-seed sd (same process, other random numbers), so a single seed is held to
``|ours - paper mean| <= 1.0 + 3 sd``: the ±1.0 claim plus three standard deviations of one draw.
"""

from __future__ import annotations

import pytest

from hami.simulate.replay import replay
from hami.simulate.trace import TraceNode, TracePod, read_nodes, read_pods
from hami.simulate.workload import RequestClass, target_workload
from tests.simulate import shipped

PAPER_DEFAULT = {  # unallocated GPU % at x = 100, mean, sd over seeds 42..51 (docs/policies.md, "Measured")
    "dotprod": (9.38, 0.19),
    "packing": (8.22, 0.53),
    "bestfit": (7.14, 0.14),
    "fgd": (4.77, 0.11),
}

Trace = tuple[tuple[TraceNode, ...], tuple[TracePod, ...], tuple[RequestClass, ...]]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def default_trace() -> Trace:
    pods = read_pods(shipped.pods("default"))
    return read_nodes(shipped.NODES), pods, target_workload(pods)


@pytest.mark.parametrize("policy", sorted(PAPER_DEFAULT))
def test_replay_matches_the_paper_on_one_seed(policy: str, default_trace: Trace) -> None:
    nodes, pods, classes = default_trace
    mean, sd = PAPER_DEFAULT[policy]
    ours = replay(nodes, pods, policy, 42, classes=classes).unallocated[100]
    assert abs(ours - mean) <= 1.0 + 3 * sd, f"{policy}: {ours:.2f} vs the paper's {mean} ± {sd}"


def test_fragmentation_beats_fgd_where_cpu_is_contended() -> None:
    """gpuspec20 (a fifth of the GPU demand model-constrained): over seeds 42..44 FGD leaves 5.48 %,
    ``fragmentation`` 4.91 % (docs/policies.md); on one seed the gap is still several of its sds."""
    pods = read_pods(shipped.pods("gpuspec20"))
    nodes, classes = read_nodes(shipped.NODES), target_workload(pods)
    fgd = replay(nodes, pods, "fgd", 42, classes=classes).unallocated[100]
    ours = replay(nodes, pods, "fragmentation", 42, classes=classes).unallocated[100]
    assert ours < fgd - 0.1, f"fragmentation {ours:.2f} vs fgd {fgd:.2f}"
