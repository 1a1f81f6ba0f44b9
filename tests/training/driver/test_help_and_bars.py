"""--help says what --local and --demo change; other libraries' progress bars stay out of the
log."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO
from training.driver import cli


def test_help_names_what_demo_changes():
    text = " ".join(cli.build_parser().format_help().split())
    assert "--local changes these defaults: --model tiny, --num-workers 2, --no-use-gpu, " \
        "no --address" in text
    assert "--demo also: --data " in text and "--tokenizer bytes," in text
    assert "and names the run demo (demo-<key> with another model" in text
    assert "--export" in text.split("--demo also:")[1]


def test_hub_and_transformers_progress_bars_are_off_in_the_job():
    code = ("import os; os.environ.pop('HF_HUB_DISABLE_PROGRESS_BARS', None)\n"
            "from training.driver import cli; cli._quiet_local_logs()\n"
            "from huggingface_hub.utils import are_progress_bars_disabled\n"
            "from transformers.utils import logging\n"
            "print(are_progress_bars_disabled(), logging.is_progress_bar_enabled())")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]
