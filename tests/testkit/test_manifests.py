"""The demo's example pods: packaged, read strictly (unknown fields named), ``*.yml`` too, outcomes declared.

Also the wheel: built from this checkout and unpacked elsewhere, it carries the examples, the demo cluster
and the annotation policy, and the code reading them finds them there (not in the checkout).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import kubernetes.client as k8s
import pytest
import yaml

from hami.cli import main as hami_main
from hami_testkit.cluster import ClusterFileError
from hami_testkit.manifests import (
    CONTAINER_FIELDS,
    METADATA_FIELDS,
    POD_FIELDS,
    RESOURCES_FIELDS,
    SPEC_FIELDS,
    default_examples_dir,
    read_examples,
)

REPO = Path(__file__).resolve().parents[2]

POD = """\
# outcome: {outcome}
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
    - name: cuda
      image: cuda
      resources:
        limits: {{nvidia.com/gpu: 1}}
"""


def test_the_field_lists_are_kubernetes_own() -> None:
    """Our lists equal the pinned Kubernetes client's models (no field refused that Kubernetes has)."""
    for ours, model in [
        (POD_FIELDS, k8s.V1Pod),
        (METADATA_FIELDS, k8s.V1ObjectMeta),
        (SPEC_FIELDS, k8s.V1PodSpec),
        (CONTAINER_FIELDS, k8s.V1Container),
        (RESOURCES_FIELDS, k8s.V1ResourceRequirements),
    ]:
        fields: dict[str, str] = getattr(model, "attribute_map")  # noqa: B009 - generated, untyped
        assert sorted(ours) == sorted(fields.values()), model.__name__


def test_every_packaged_example_declares_its_outcome() -> None:
    examples = read_examples(default_examples_dir())
    assert [e.key for e in examples if e.kind == "PriorityClass"] == [
        "priorityclass/gpu-batch",
        "priorityclass/gpu-urgent",
    ]
    pods = [e for e in examples if e.kind == "Pod"]
    assert len(pods) == 19
    outcomes = {e.key: e.outcome for e in pods}
    assert outcomes["default/privileged-gpu"] == "Refused"
    assert {k for k, v in outcomes.items() if v == "Pending"} == {
        "default/too-much-memory",
        "default/too-many-cards",
        "default/wants-h100",
        "default/a10-enforced-only",
    }
    assert {k for k, v in outcomes.items() if v == "Preempted"} == {"default/batch-1", "default/batch-2"}
    assert all(v in ("Running", "Pending", "Refused", "Preempted") for v in outcomes.values()), outcomes


def test_the_repository_examples_link_is_the_packaged_directory() -> None:
    assert (REPO / "examples").resolve() == Path(str(default_examples_dir())).resolve()


def test_yml_files_are_read_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.yml").write_text(POD.format(outcome="Pending", name="b"), encoding="utf-8")
    (tmp_path / "a.yaml").write_text(POD.format(outcome="Running", name="a"), encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not a manifest", encoding="utf-8")
    examples = read_examples(tmp_path)
    assert [(e.key, e.outcome) for e in examples] == [("default/a", "Running"), ("default/b", "Pending")]


def test_each_document_of_a_file_has_its_own_outcome(tmp_path: Path) -> None:
    text = POD.format(outcome="Running", name="a") + "---\n" + POD.format(outcome="Refused", name="b")
    (tmp_path / "two.yaml").write_text("---\n" + text, encoding="utf-8")
    assert [(e.key, e.outcome) for e in read_examples(tmp_path)] == [
        ("default/a", "Running"),
        ("default/b", "Refused"),
    ]


def _pod(**changes: object) -> dict[str, object]:
    pod = yaml.safe_load(POD.format(outcome="Running", name="p"))
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = pod
        for part in parents:
            node = node[part][0] if part == "containers" else node[part]
        node[last] = value
    assert isinstance(pod, dict)
    return pod


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (
            _pod(spec__containers__resource={}),
            "spec.containers[0].resource: unknown field 'resource'; did you mean 'resources'?",
        ),
        (
            _pod(spec__containers__resources__limit={}),
            "spec.containers[0].resources.limit: unknown field 'limit'; did you mean 'limits'?",
        ),
        (
            _pod(metadata__annotation={}),
            "metadata.annotation: unknown field 'annotation'; did you mean 'annotations'?",
        ),
        (
            _pod(spec__initContainer=[]),
            "spec.initContainer: unknown field 'initContainer'; did you mean 'initContainers'?",
        ),
        (_pod(specs={}), "specs: unknown field 'specs'; did you mean 'spec'?"),
        (_pod(apiVersion="apps/v1"), "apiVersion: a Pod is v1, got 'apps/v1'"),
    ],
)
def test_unknown_fields_are_refused_with_the_path(
    tmp_path: Path, pod: dict[str, object], message: str
) -> None:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pod), encoding="utf-8")
    with pytest.raises(ClusterFileError) as caught:
        read_examples(tmp_path)
    assert f"example '{tmp_path / 'p.yaml'}': {message}" == str(caught.value)


def test_an_unknown_outcome_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(POD.format(outcome="Scheduled", name="p"), encoding="utf-8")
    with pytest.raises(
        ClusterFileError, match=r"outcome: Scheduled'.*Running, Pending, Refused, Failed, Preempted"
    ):
        read_examples(tmp_path)


@pytest.mark.parametrize("which", ["nodes", "examples"])
def test_hami_demo_refuses_a_bad_file_before_starting(
    which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line, before any process starts (was: GPU-less nodes and exit 0)."""
    if which == "nodes":
        bad = tmp_path / "cluster.yaml"
        bad.write_text("nodes: [{name: n1, cards: [{uuid: GPU-1, memory_mb: 4000}]}]\n", encoding="utf-8")
        argv = ["demo", "--nodes", str(bad), "--workdir", str(tmp_path / "work")]
    else:
        (tmp_path / "ex").mkdir()
        (tmp_path / "ex" / "p.yml").write_text(yaml.safe_dump(_pod(spec__containers__resource={})))
        argv = ["demo", "--examples", str(tmp_path / "ex"), "--workdir", str(tmp_path / "work")]
    assert hami_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("hami demo: "), err
    assert ("memory_mb" if which == "nodes" else "'resource'") in err
    assert not (tmp_path / "work").exists()


# ------------------------------------------------------------------------------------------ the wheel
@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout built as its two wheels, the product and the test kit (no dependencies, no network),
    both unpacked into one directory outside the repository.

    Built from a copy of what the image's build context holds (pyproject.toml, README.md, the three
    packages and testkit/ with their links, the chart's annotation-policy file), so the checkout gets no
    build/ directory and two runs never share one."""
    out = tmp_path_factory.mktemp("wheel")
    context = out / "context"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, context / name)
    for package in ("hami", "webhook", "nodeagent", "testkit"):
        shutil.copytree(REPO / package, context / package, symlinks=True, ignore=skip)
    policy = Path("charts") / "hami" / "files" / "annotation-policy.yaml"
    (context / policy).parent.mkdir(parents=True)
    shutil.copy2(REPO / policy, context / policy)
    for project in ("./", "./testkit"):
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
             "-w", str(out), project],
            cwd=context,
            check=True,
            timeout=300,
            env={**os.environ, "PIP_NO_INDEX": "1"},
        )  # fmt: skip
    site = out / "site"
    for pattern in ("hami_py-*.whl", "hami_testkit-*.whl"):
        (wheel,) = out.glob(pattern)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    assert not (site / "hami" / "sim").exists()  # the product wheel carries no emulator
    return site


def test_the_wheel_carries_the_demo_data(unpacked_wheel: Path) -> None:
    sim = unpacked_wheel / "hami_testkit"
    assert sorted(p.name for p in (sim / "examples").iterdir()) == sorted(
        p.name for p in (REPO / "examples").iterdir()
    )
    assert (sim / "cluster.yaml").is_file()
    assert (sim / "annotation-policy.yaml").read_bytes() == (
        REPO / "charts" / "hami" / "files" / "annotation-policy.yaml"
    ).read_bytes()


def test_the_demo_finds_its_data_outside_the_repository(unpacked_wheel: Path, tmp_path: Path) -> None:
    probe = (
        "import hami, json\n"
        "from hami_testkit.manifests import default_examples_dir, read_examples\n"
        "from hami_testkit.cluster import load_cluster\n"
        "from hami_testkit.admission_policy import annotation_policy\n"
        "policy, _ = annotation_policy(['system:serviceaccount:x:y'])\n"
        "print(json.dumps({'hami': hami.__file__, 'examples': str(default_examples_dir()),\n"
        "  'pods': sum(e.kind == 'Pod' for e in read_examples(default_examples_dir())),\n"
        "  'nodes': len(load_cluster().nodes),\n"
        "  'validations': len(policy['spec']['validations'])}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(unpacked_wheel)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = yaml.safe_load(done.stdout)
    assert found["hami"].startswith(str(unpacked_wheel)), found
    assert found["examples"].startswith(str(unpacked_wheel)), found
    assert (found["pods"], found["nodes"]) == (19, 4)
    assert found["validations"] > 0


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_hami_demo_runs_from_the_wheel_outside_the_repository(unpacked_wheel: Path, tmp_path: Path) -> None:
    """The whole demo (every component a process importing the unpacked wheel), from a directory that is
    not a checkout: it finds its cluster, examples and policy, and every pod becomes what it expects."""
    work = Path(tempfile.mkdtemp(prefix="hami-wheel-", dir="/tmp"))  # short: unix socket paths
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hami.cli", "demo", "--timeout", "150", "--workdir", str(work)],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(unpacked_wheel)},
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "19 of 19 pods became what their example expects." in done.stdout, done.stdout
        logs = "".join(p.read_text(errors="replace") for p in (work / "logs").glob("*"))
        assert str(REPO / "hami") not in logs  # nothing ran from the checkout
    finally:
        shutil.rmtree(work, ignore_errors=True)


PRIORITY_CLASS = """\
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: urgent
value: 1000
{extra}
"""


def test_priority_classes_are_read_with_the_pods_in_file_order(tmp_path: Path) -> None:
    text = (
        PRIORITY_CLASS.format(extra="preemptionPolicy: Never")
        + "---\n"
        + POD.format(outcome="Preempted", name="a")
    )
    (tmp_path / "a.yaml").write_text(text, encoding="utf-8")
    assert [(e.kind, e.key, e.outcome) for e in read_examples(tmp_path)] == [
        ("PriorityClass", "priorityclass/urgent", ""),
        ("Pod", "default/a", "Preempted"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (PRIORITY_CLASS.format(extra="valu: 3"), "valu: unknown field 'valu'; did you mean 'value'?"),
        (
            PRIORITY_CLASS.format(extra="").replace("scheduling.k8s.io/v1", "v1"),
            "apiVersion: a PriorityClass is scheduling.k8s.io/v1, got 'v1'",
        ),
        (
            PRIORITY_CLASS.format(extra="").replace("value: 1000", "value: high"),
            "a PriorityClass needs metadata.name and an integer value",
        ),
        (
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
            "only Pod and PriorityClass documents are supported",
        ),
    ],
    ids=["typo", "api-version", "value", "other-kind"],
)
def test_priority_classes_are_read_strictly(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "c.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ClusterFileError) as caught:
        read_examples(tmp_path)
    assert str(caught.value) == f"example '{tmp_path / 'c.yaml'}': {message}"
