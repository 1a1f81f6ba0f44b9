"""`python -m training` as a user meets it: help without the heavy libraries, and bad input of
every layer as one `error:` line and exit 2."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO
from tests.training.driver.freeze_cli import SNAPSHOT
from training.config import options
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


def test_bad_data_and_bad_model_exit_2_with_one_error_line_before_ray(tmp_path):
    for flags, message in ((["--data", str(tmp_path / "none.jsonl"), "--tokenizer", "bytes"],
                            "no such file or directory"),
                           (["--model", str(tmp_path / "no-model")], "no such model directory")):
        proc = subprocess.run([sys.executable, "-m", "training", "--local", "--storage-path",
                               str(tmp_path / "runs"), *flags], cwd=REPO, capture_output=True,
                              text=True)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
        assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
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
