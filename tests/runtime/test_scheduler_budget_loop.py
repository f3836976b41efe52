"""A prepared poly LambdaLR in an iteration-budget loop (``while step < total_steps``), 2 processes.

Accelerate's rule advances the scheduler once per process per optimizer step (right for schedules
sized in the original script's batches); in a loop that runs a fixed number of optimizer steps the
schedule ends halfway. The prepared scheduler never steps past that end (no complex learning rate,
no crash) and says how to get the one-process rates, which
``Accelerator(step_scheduler_with_optimizer=False)`` gives exactly.
"""

from __future__ import annotations

import pytest

from rt_helpers import run_worker_once


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    result, _ = run_worker_once("budget_scheduler", tmp_path_factory.mktemp("budget"))
    return result


def test_default_rule_never_steps_past_the_end(ranks) -> None:
    for r in ranks:
        rates = r["default"]
        assert len(rates) == 12 and all(isinstance(rate, float) and rate >= 0 for rate in rates)
        assert rates[:5] == r["reference"][1:10:2]  # two advances per optimizer step
        assert rates[5:] == [0.0] * 7  # held at the schedule's last valid rate


def test_the_main_process_says_how_to_get_the_one_process_rates(ranks) -> None:
    main, other = ranks
    assert len(main["warnings"]) == 1 and "step_scheduler_with_optimizer=False" in main["warnings"][0]
    assert "while step < total_steps" in main["warnings"][0]
    assert other["warnings"] == []


def test_one_advance_per_call_gives_the_one_process_rates(ranks) -> None:
    for r in ranks:
        assert r["per_call"] == r["reference"] and len(r["reference"]) == 12
