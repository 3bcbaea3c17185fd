"""The scoping of the managed MutatingWebhookConfiguration; its CEL condition run by a CEL engine."""

from __future__ import annotations

from typing import Any

import cel
import pytest

from hami.settings import DeviceConfig, ResourceNames
from webhook.config import MutationSettings, WebhookSettings
from webhook.registration import desired_webhook, match_expression, up_to_date

from .webhook_cases import CORES, GPU, MEM, PCT, ctr, make_pod

EXPRESSION = match_expression(ResourceNames(), "hami-scheduler")
IGNORE = {"hami.io/webhook": "ignore"}
VISIBLE = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]

CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("card in limits", make_pod(ctr(limits={GPU: "1"})), True),
    ("memory only", make_pod(ctr(limits={MEM: "10"})), True),
    ("percentage only", make_pod(ctr(limits={PCT: "10"})), True),
    ("cores only", make_pod(ctr(limits={CORES: "10"})), True),
    ("card in requests", make_pod({"name": "a", "resources": {"requests": {GPU: "1"}}}), True),
    ("card in an init container", make_pod(ctr("app"), init=(ctr("i", limits={GPU: "1"}),)), True),
    (
        "card in the second container",
        make_pod(ctr("a", limits={"cpu": "1"}), ctr("b", limits={GPU: "1"})),
        True,
    ),
    ("cpu only", make_pod(ctr(limits={"cpu": "1", "memory": "1Gi"})), False),
    ("no resources at all", make_pod(ctr()), False),
    ("priority alone is not a card", make_pod(ctr(limits={"nvidia.com/priority": "1"})), False),
    ("ignored GPU pod", make_pod(ctr(limits={GPU: "1"}), labels=IGNORE), False),
    # an ignored pod that names our scheduler would reach our cards: its protective checks still run
    (
        "ignored GPU pod naming our scheduler",
        make_pod(ctr(limits={GPU: "1"}), labels=IGNORE, schedulerName="hami-scheduler"),
        True,
    ),
    (
        "ignored cpu pod naming our scheduler",
        make_pod(ctr(limits={"cpu": "1"}), labels=IGNORE, schedulerName="hami-scheduler"),
        False,
    ),
    ("GPU pod naming another scheduler", make_pod(ctr(limits={GPU: "1"}), schedulerName="volcano"), True),
    (
        "ignored GPU pod naming another scheduler",
        make_pod(ctr(limits={GPU: "1"}), labels=IGNORE, schedulerName="volcano"),
        False,
    ),
    # NVIDIA_VISIBLE_DEVICES in any container, whatever the pod asks for
    ("cpu pod setting the device list", make_pod(ctr(env=VISIBLE)), True),
    ("ignored cpu pod setting the device list", make_pod(ctr(env=VISIBLE), labels=IGNORE), True),
    ("device list in an init container", make_pod(ctr(), init=(ctr("i", env=VISIBLE),)), True),
    (
        "device list from elsewhere",
        make_pod(ctr(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {}}])),
        True,
    ),
    ("other env only", make_pod(ctr(env=[{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}])), False),
    ("empty env", make_pod(ctr(env=[])), False),
    ("other label value", make_pod(ctr(limits={GPU: "1"}), labels={"hami.io/webhook": "yes"}), True),
    ("forged annotation, cpu pod", make_pod(ctr(), annotations={"hami.io/bind-phase": "success"}), True),
    (
        "forged annotation, ignored pod",
        make_pod(ctr(), labels=IGNORE, annotations={"hami.io/vgpu-node": "n"}),
        True,
    ),
    ("forged node label", make_pod(ctr(), labels={"hami.io/vgpu-node": "n"}), True),
    ("user annotation only", make_pod(ctr(), annotations={"nvidia.com/use-gputype": "A100"}), False),
    ("no containers key", {"metadata": {"name": "p"}, "spec": {}}, False),
]


@pytest.mark.parametrize(("pod", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_match_condition(pod: dict[str, Any], expected: bool) -> None:
    assert cel.evaluate(EXPRESSION, {"object": pod}) is expected


def test_match_condition_follows_configured_names() -> None:
    names = ResourceNames(
        count="example.com/vgpu", memory="", memory_percentage="", cores="example.com/vcores"
    )
    expression = match_expression(names, "hami-scheduler")
    assert cel.evaluate(expression, {"object": make_pod(ctr(limits={"example.com/vcores": "5"}))}) is True
    assert cel.evaluate(expression, {"object": make_pod(ctr(limits={GPU: "1"}))}) is False


def settings(**overrides: Any) -> WebhookSettings:
    return WebhookSettings(**overrides)


CLIENT = {"url": "https://127.0.0.1:9443", "caBundle": "Q0E="}


def test_desired_webhook_points_at_the_handler_path() -> None:
    hook = desired_webhook(settings(failure_policy="Ignore"), CLIENT)
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/webhook", "caBundle": "Q0E="}
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] == 10 and hook["sideEffects"] == "None"
    custom = settings(mutation=MutationSettings(device=DeviceConfig(resources=ResourceNames(count="x.io/g"))))
    assert "'x.io/g'" in desired_webhook(custom, CLIENT)["matchConditions"][0]["expression"]
    renamed = settings(mutation=MutationSettings(scheduler_name="gpu-share"))
    assert "== 'gpu-share'" in desired_webhook(renamed, CLIENT)["matchConditions"][0]["expression"]


def test_up_to_date_ignores_server_defaults_only() -> None:
    desired = desired_webhook(settings(), CLIENT)
    stored = {**desired, "objectSelector": {}, "matchPolicy": "Equivalent"}
    assert up_to_date([stored], desired)
    assert not up_to_date([{**stored, "timeoutSeconds": 30}], desired)
    assert not up_to_date([{**stored, "clientConfig": {"url": "https://127.0.0.1:1/webhook"}}], desired)
    assert not up_to_date([stored, stored], desired)
    assert not up_to_date([], desired)
