"""TrainConfig checked from its annotations: each option's type, choices and range refused with
its flag (and a stack's key), every problem at once; the test hooks grouped apart from the
settings but reachable by flag and by stack key like them."""

from __future__ import annotations

import dataclasses

import pytest

from training.config import ConfigError, TestHooks, TrainConfig
from training.options import options
from training.driver.cli import build_parser, parse
from training.field_types import accepted, choices
from training.settings import from_settings


def _outside(option) -> object:
    """A value of the option's type just outside its range."""
    b = option.bounds
    edge = b.gt if b.gt is not None else b.ge
    value = edge - 1 if b.gt is None else edge
    return float(value) if float in accepted(option.hint) else int(value)


@pytest.mark.parametrize("option", [o for o in options() if o.bounds], ids=lambda o: o.name)
def test_a_value_out_of_an_options_range_is_refused_naming_its_flag(option):
    found = TrainConfig(**{option.name: _outside(option)}).problems()
    assert [p for p in found if p.startswith(f"{option.flag} must be ")], found


@pytest.mark.parametrize("option", [o for o in options() if choices(o.hint)], ids=lambda o: o.name)
def test_a_value_outside_an_options_choices_is_refused_listing_them(option):
    (problem,) = TrainConfig(**{option.name: "fp16-ish"}).problems()
    assert problem == (f"{option.flag} must be one of "
                       f"{', '.join(map(repr, choices(option.hint)))} (got 'fp16-ish')")


def test_wrong_types_are_all_reported_and_the_cross_checks_wait_for_them():
    found = TrainConfig(steps="3", use_gpu=1, lr=True, data="random", epochs=2.0).problems()
    assert found == ["--steps must be int (got '3')", "--lr must be float (got True)",
                     "--use-gpu must be bool or null (got 1)"]
    # A choice outside a Literal is still a str: the checks across options run on.
    found = TrainConfig(reduce_dtype="fp16", data="random", epochs=2.0).problems()
    assert found[0].startswith("--reduce-dtype must be one of 'fp32', 'bf16'")
    assert found[1].startswith("--epochs needs --data files")


def test_every_range_problem_is_reported_at_once_with_its_meaning():
    found = TrainConfig(steps=0, lr=0.0, max_preemptions=-2, lora_dropout=1.0,
                        accum_dtype="bf16").problems()
    assert found[:4] == ["--steps must be at least 1 (got 0)", "--lr must be positive (got 0.0)",
                         "--max-preemptions must be -1 (any number) or more (got -2)",
                         "--lora-dropout must be at least 0 and below 1 (got 1.0)"]
    assert any(p.startswith("--accum-dtype bf16 needs --reduce-dtype bf16") for p in found)


def test_a_choice_outside_the_annotation_is_refused_by_the_flag_and_the_stack():
    with pytest.raises(SystemExit):  # argparse: invalid choice, exit 2
        parse(["--accum-dtype", "fp16"])
    with pytest.raises(ConfigError, match="training.accumDtype: expected 'fp32' or 'bf16' or null"):
        from_settings({"accumDtype": "fp16"}, prefix="training.")


def test_test_hooks_are_their_own_group_set_by_flag_or_stack_key_and_never_tracked():
    by_flag = parse(["--fault-at-step", "3", "--hold-at-step", "5", "--steps", "9"])
    by_key = from_settings({"faultAtStep": 3, "holdAtStep": "5", "steps": 9})
    assert by_flag == by_key == TrainConfig(steps=9, test_hooks=TestHooks(fault_at_step=3,
                                                                          hold_at_step=5))
    assert not {f.name for f in dataclasses.fields(TestHooks)} & {
        f.name for f in dataclasses.fields(TrainConfig)}
    assert "test_hooks" not in by_flag.to_dict() and by_flag.to_dict()["steps"] == 9
    groups = {g.title: [a.dest for a in g._group_actions] for g in build_parser()._action_groups}
    assert groups["test hooks"] == ["test_hooks"] * len(dataclasses.fields(TestHooks))


def test_a_typo_of_a_stack_key_names_the_closest_but_lists_only_the_settings():
    with pytest.raises(ConfigError) as e:
        from_settings({"faultAtStp": 3}, prefix="training.")
    (problem,) = e.value.problems
    assert "did you mean training.faultAtStep?" in problem
    assert "maxFailures" in problem.split("known: ")[1]
    assert "faultAtStep" not in problem.split("known: ")[1]
