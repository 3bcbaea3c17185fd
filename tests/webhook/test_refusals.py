"""How a refusal reads: its code is the one docs/webhook.md promises, its status carries the reason
kube-apiserver passes on to the user, and it is logged in one INFO line (issue 26: every refusal was
logged at ERROR by Kopf, ``Handler 'webhook' failed permanently``)."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from webhook.config import MutationSettings
from webhook.mutation import REFUSAL_REASONS, Refuse, plan
from webhook.reviews import STATUS_REASONS

from .webhook_cases import REFUSALS
from .webhook_harness import Webhook

DOC = Path(__file__).resolve().parents[2] / "docs" / "webhook.md"


def documented_codes() -> dict[str, int]:
    """reason code -> HTTP code, from the refusal table of docs/webhook.md (``| cause | message | code |
    reason |``; a reason cell may name a second code in parentheses)."""
    codes: dict[str, int] = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2].isdigit():
            for reason in re.findall(r"`([a-z_]+)`", cells[3]):
                codes.setdefault(reason, int(cells[2]))
    return codes


def test_the_documented_table_names_every_reason() -> None:
    assert set(documented_codes()) >= set(REFUSAL_REASONS) - {"bad_request"}


CASES = [(r[1], r[4], r[3]) for r in REFUSALS]


@pytest.mark.parametrize(("pod", "reason", "code"), CASES, ids=[r[0] for r in REFUSALS])
def test_each_refusal_has_its_documented_code(pod: dict[str, Any], reason: str, code: int) -> None:
    decision = plan(pod, MutationSettings())
    assert isinstance(decision, Refuse) and decision.reason == reason
    assert decision.code == code == documented_codes()[reason]
    assert code in STATUS_REASONS


async def test_a_refusal_is_one_info_line_and_carries_its_reason(
    webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _, pod, message, code, reason = REFUSALS[0]
    response = await webhook.admit(pod)
    assert response["status"] == {
        "message": message,
        "code": code,
        "reason": STATUS_REASONS[code],
        "status": "Failure",
    }
    mentions = [r for r in caplog.records if message in r.getMessage()]
    assert [(r.name, r.levelno) for r in mentions] == [("hami.webhook", logging.INFO)], [
        (r.name, r.levelname, r.getMessage()) for r in mentions
    ]
    assert f"({reason})" in mentions[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
