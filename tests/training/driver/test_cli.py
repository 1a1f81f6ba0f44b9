"""`python -m training` as a user meets it: help without the heavy libraries, and bad input of
every layer as one `error:` line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.ports import free_port
from tests.training.driver.freeze_cli import SNAPSHOT
from training.options import options
from training.driver.cli import build_parser, parse

HELP = """
import runpy, sys
sys.argv = ["python -m training", "--help"]
try:
    runpy.run_module("training", run_name="__main__")
except SystemExit as e:
    code = e.code
print("heavy:", sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules), code)
"""


def test_help_answers_without_importing_torch_transformers_or_ray():
    proc = subprocess.run([sys.executable, "-c", HELP], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--tokens-per-step" in proc.stdout and "--demo" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "heavy: [] 0"


REFUSE = """
import contextlib, io, json, sys
from training.driver import cli
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    out.append([code, err.getvalue()])
heavy = sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules)
print(json.dumps({"refusals": out, "heavy": heavy}))
"""


def test_bad_input_exits_2_in_one_line_before_torch_transformers_or_ray(tmp_path):
    """Flags, settings, local data, model directories and Hub ids with the Hub unreachable: each
    refused in one line (the settings: one per problem), in a process that never imported the
    heavy libraries, and nothing left under the storage path."""
    (tmp_path / "bad.jsonl").write_text("not json\n")
    (tmp_path / "good.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "empty-model").mkdir()
    bad = {  # flags: what stderr says
        ("--steps", "abc"): "argument --steps: invalid int value: 'abc'",
        ("--steps", "0", "--lr", "-1"): "--lr must be positive (got -1.0)",
        ("--data", str(tmp_path / "none.jsonl")): "none.jsonl': no such file or directory",
        ("--preview", "2", "--data", str(tmp_path / "none.jsonl")): "no such file or directory",
        ("--data", str(tmp_path / "bad.jsonl")): "bad.jsonl row 1: not JSON",
        ("--model", str(tmp_path / "no-model")): "no such model directory",
        ("--model", str(tmp_path / "empty-model")): "is not a Hugging Face model directory",
        ("--model", "Qwen/Qwen2.5-0.5B"): "--model 'Qwen/Qwen2.5-0.5B': the Hugging Face Hub "
                                          "at http://127.0.0.1:",
        ("--data", "hf://trl-lib/Capybara"): "cannot fetch it from the Hugging Face Hub",
        ("--data", str(tmp_path / "good.jsonl"), "--tokenizer", "Qwen/Qwen2.5-0.5B"):
            "--tokenizer 'Qwen/Qwen2.5-0.5B': the Hugging Face Hub at http://127.0.0.1:",
    }
    argv = [["--local", "--storage-path", str(tmp_path / "runs"), "--tokenizer", "bytes", *f]
            for f in bad]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = subprocess.run([sys.executable, "-c", REFUSE, json.dumps(argv)], cwd=REPO,
                          capture_output=True, text=True, env={
                              **env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",
                              "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    for (code, err), (flags, message) in zip(result["refusals"], bad.items()):
        assert code == 2 and message in err and err.startswith("error: "), (flags, err)
        assert len(err.splitlines()) == (3 if "--lr" in flags else 1), (flags, err)
    assert "network access to http://127.0.0.1:" in result["refusals"][7][1]
    assert result["heavy"] == []
    assert not (tmp_path / "runs").exists()


def test_a_bad_flag_is_one_line_pointing_at_help_and_the_test_hooks_stay_out_of_help():
    proc = subprocess.run([sys.executable, "-m", "training", "--steps", "abc"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("error: argument --steps: invalid int value: 'abc' "
                           "(`python -m training --help` lists every flag)\n")
    parser = build_parser()
    shown = parser.format_help() + parser.format_usage()
    hooks = [o.flag for o in options() if o.group]
    assert hooks and not [h for h in hooks if h in shown], hooks
    assert "test hooks" not in shown
    assert all(h in SNAPSHOT.read_text() for h in hooks)  # still accepted, still frozen
    assert parse(["--fault-at-step", "3"]).test_hooks.fault_at_step == 3


def test_an_s3_model_is_left_to_the_run_not_refused_as_a_missing_directory():
    """`--model s3://bucket/run/hf_model/` (a finished run's export) is read once, later, with the
    run's credentials: the early check must not take it for a local path that does not exist."""
    from training.driver import early
    from training.model.loading import ModelError

    early.check_model("s3://ckpt/runs/tiny-58d3f219/hf_model/")  # no error
    with pytest.raises(ModelError, match="no such model directory"):
        early.check_model("./no/such/model/dir")
