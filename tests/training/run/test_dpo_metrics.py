"""DPO's metrics travel under TRL's names: a metrics row's keys, metrics.csv's columns (only in a
DPO run's file), the plot's third panel and the run summary."""

from __future__ import annotations

import csv
import io

from training.model.rewards import REWARD_METRICS
from training.run.facts import MetricsRow
from training.run.handoff import RunSummary
from training.step.metrics import CSV_FIELDS, merge_csv, plot_csv
from tests.training.run.test_handoff import _facts

REWARDS = dict(zip(REWARD_METRICS, (0.5, -0.25, 0.75, 0.75)))


def test_a_dpo_row_carries_trls_names_into_metrics_csv_and_an_sft_file_keeps_its_columns(
        tmp_path):
    row = MetricsRow(step=5, loss=0.6, preference={**REWARDS, "eval_rewards/accuracies": 1.0})
    assert row.to_dict()["rewards/margins"] == 0.75 and "preference" not in row.to_dict()
    text = merge_csv("", [MetricsRow(step=0, eval_loss=0.69).to_dict(), row.to_dict()])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[1]["rewards/accuracies"] == "0.75" and rows[1]["eval_rewards/accuracies"] == "1.0"
    assert set(REWARD_METRICS) | {"eval_rewards/accuracies"} <= set(rows[0]) and \
        "eval_rewards/chosen" not in rows[0]
    resumed = merge_csv(text, [MetricsRow(step=6, loss=0.5, preference=REWARDS).to_dict()])
    assert next(csv.reader(io.StringIO(resumed))) == next(csv.reader(io.StringIO(text)))
    sft = merge_csv("", [MetricsRow(step=1, loss=2.0).to_dict()])
    assert tuple(next(csv.reader(io.StringIO(sft)))) == CSV_FIELDS
    plot_csv(resumed, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 0


def test_the_summary_holds_the_last_rewards():
    s = RunSummary.from_run(_facts(), MetricsRow(step=9, loss=0.4, preference=REWARDS))
    assert RunSummary.from_json(s.to_json()).preference == REWARDS
    assert RunSummary.from_run(_facts(), MetricsRow(step=9)).preference is None
