"""The chart's image reference: nothing is published, so ``image.registry`` is required.

Left unset, ``helm template`` / ``install`` (here: rendering and a client-side dry-run install with Helm's
library) stop with one message that says to build and push the image and set ``image.registry``;
``helm lint`` (Helm's lint mode never fails on a ``required`` value) logs that message. Set, every one of
our containers runs ``REGISTRY/hami-py:<appVersion>`` (or the tag given), and NOTES.txt names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from .rendering import BASE_VALUES, CHART, NAMESPACE, RELEASE, VALUE_SETS, pod_spec, render, with_base

UNSET: dict[str, dict[str, Any]] = {
    "absent": {},
    "empty": {"image": {"registry": ""}},
    "null": {"image": {"registry": None}},
}
MESSAGE = "image.registry is not set, and no hami-py image is published"


def _complaint(text: str) -> None:
    assert MESSAGE in text
    assert "docker build -t REGISTRY/hami-py:0.1.0 . && docker push REGISTRY/hami-py:0.1.0" in text
    assert "--set image.registry=REGISTRY" in text


@pytest.mark.parametrize("values", UNSET.values(), ids=UNSET.keys())
def test_rendering_without_a_registry_says_to_build_push_and_set_it(values: dict[str, Any]) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError) as error:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    _complaint(str(error.value))


def _kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig for a client-side dry run: Helm reads it, nothing is contacted."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]\n'
        "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    return path


def test_install_without_a_registry_fails_and_with_one_succeeds(tmp_path: Path) -> None:
    with helm.Config(kubeconfig_path=_kubeconfig(tmp_path), namespace=NAMESPACE) as config:
        with pytest.raises(helm.HelmError) as error:
            config.install(CHART, RELEASE, {}, namespace=NAMESPACE, dry_run="client")
        _complaint(str(error.value))
        release = config.install(CHART, RELEASE, dict(BASE_VALUES), namespace=NAMESPACE, dry_run="client")
    assert "push the image you built to registry.test/hami-py:0.1.0" in release["notes"]


def test_lint_without_a_registry_logs_the_message(capfd: pytest.CaptureFixture[str]) -> None:
    helm.lint(str(CHART), {}, namespace=NAMESPACE)
    logged = capfd.readouterr()
    assert MESSAGE in logged.out + logged.err


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ({"registry": "registry.example.com"}, "registry.example.com/hami-py:0.1.0"),
        ({"registry": "registry.example.com/gpu", "tag": "dev-1"}, "registry.example.com/gpu/hami-py:dev-1"),
        ({"registry": "mirror:5000", "repository": "hami", "tag": 2}, "mirror:5000/hami:2"),
    ],
)
def test_every_container_of_ours_runs_the_pushed_image(image: dict[str, Any], expected: str) -> None:
    rendered = render({**VALUE_SETS["everything-on"], "image": image})
    workloads = [w for kind in ("Deployment", "DaemonSet", "Job", "CronJob") for w in rendered.of_kind(kind)]
    assert {w["kind"] for w in workloads} == {"Deployment", "DaemonSet", "Job", "CronJob"}
    images: set[str] = set()
    for workload in workloads:
        job = workload["spec"]["jobTemplate"] if workload["kind"] == "CronJob" else workload
        spec = pod_spec(job)
        images.update(c["image"] for c in [*spec["containers"], *spec.get("initContainers", [])])
    # HAMi's own images: the stock kube-scheduler and HAMi's release image carrying HAMi-core (which
    # this project may not redistribute: tests/chart/test_hami_core.py)
    ours = {i for i in images if "kube-scheduler" not in i and not i.startswith("docker.io/projecthami/")}
    assert ours == {expected}
    assert "docker.io/projecthami/hami:v2.10.0" in images


def test_the_shared_values_merge_under_a_test_s_own() -> None:
    assert with_base({"image": {"tag": "x"}, "logLevel": "debug"}) == {
        "image": {"registry": "registry.test", "tag": "x"},
        "logLevel": "debug",
    }
    assert with_base({"image": {"registry": "r"}})["image"] == {"registry": "r"}
    assert BASE_VALUES == {"image": {"registry": "registry.test"}}  # not changed by a merge


def test_the_notes_say_when_limits_are_not_enforced(tmp_path: Path) -> None:
    """The chart installs HAMi-core by default; an empty nodeAgent.hookPath schedules slices but enforces
    none, and with the copy turned off the library is the installer's own: NOTES.txt says so."""
    with helm.Config(kubeconfig_path=_kubeconfig(tmp_path), namespace=NAMESPACE) as config:

        def notes(values: dict[str, Any]) -> str:
            done = config.install(CHART, RELEASE, with_base(values), namespace=NAMESPACE, dry_run="client")
            return str(done["notes"])

        enforced = notes({})
        off = notes({"nodeAgent": {"hookPath": ""}})
        own = notes({"nodeAgent": {"hamiCore": {"enabled": False}, "hookPath": "/opt/hami/"}})
    assert "In-container limits" not in enforced
    assert "In-container limits are OFF" in off
    assert "need your own library" in own and "/opt/hami/vgpu;" in own
