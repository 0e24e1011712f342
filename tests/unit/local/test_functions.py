"""Function specs read from the template: schedule expressions."""

from __future__ import annotations

import pytest

from batchinfer_local.functions import ScheduleEventSpec
from batchinfer_local.template import TemplateError


@pytest.mark.parametrize(
    ("expression", "seconds"),
    [
        ("rate(1 minute)", 60),
        ("rate(5 minutes)", 300),
        ("rate(2 hours)", 7200),
        ("rate(1 day)", 86400),
        ("cron(0 12 * * ? *)", None),
    ],
)
def test_schedule_rates(expression: str, seconds: int | None) -> None:
    assert ScheduleEventSpec(name="S", Schedule=expression).interval_seconds() == seconds


def test_bad_schedule_expression() -> None:
    with pytest.raises(TemplateError, match="unsupported schedule expression"):
        ScheduleEventSpec(name="S", Schedule="every 5 minutes").interval_seconds()
