"""The kubeconfig ``hami demo --keep`` prints is the admin user's, over HTTPS (kubectl sends a token only
over TLS): ``kubectl auth whoami`` names ``kubernetes-admin``, ``auth can-i`` says yes, and ``kubectl
logs`` of a running example pod fails with kube-apiserver's NotFound instead of printing the pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_testkit.system import ACCOUNTS, USER, EmbeddedSystem
from tests.e2e.test_kubectl import CLUSTER, EXAMPLE, kubectl, watch_until_running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


async def test_demo_kubeconfig_is_the_admin_and_logs_fail_clearly(workdir: Path) -> None:
    async with EmbeddedSystem(CLUSTER, workdir) as system:
        assert system.kubeconfig.read_text().count("server: https://") == 1
        code, out, err = await kubectl(system, "auth", "whoami")
        assert code == 0 and ACCOUNTS[USER] in out, (out, err)
        code, out, err = await kubectl(system, "auth", "can-i", "delete", "nodes")
        assert (code, out.strip()) == (0, "yes"), err
        code, out, err = await kubectl(system, "apply", "-f", str(EXAMPLE))
        assert code == 0, err
        await watch_until_running(system, "a10-shared")
        code, out, err = await kubectl(system, "logs", "a10-shared")
        assert code != 0 and out == "" and "NotFound" in err and "pods/log" in err, (out, err)
