"""What a job installs at submission (Ray runtime_env pip), only when its settings need it: PEFT
for LoRA runs, lm-eval for harness runs; each pinned as in requirements-dev.txt."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import REPO
from tests.stack.stacks import STACK_FILES, raw_config
from tests.workloads.test_manifests import S3, stack
from workloads.code_bundle import bundle
from workloads.rayjob import build_rayjob


@pytest.fixture(scope="module")
def code():
    return bundle(REPO)


def test_a_lora_job_installs_the_pinned_peft_and_is_a_run_of_its_own(code):
    from stack.catalog import PEFT_CLIENT
    from workloads.rayjob import run_name

    raw, _ = raw_config(STACK_FILES[0])
    training = json.loads(raw.get("training") or "{}")
    full, lora = stack(), stack(training=json.dumps({**training, "loraRank": 8}))
    assert lora.training.lora_rank == 8 and lora.training.model == full.training.model
    env = yaml.safe_load(build_rayjob(lora, code, S3)["spec"]["runtimeEnvYAML"])
    assert PEFT_CLIENT in env["pip"]
    assert "pip" not in yaml.safe_load(build_rayjob(full, code, S3)["spec"]["runtimeEnvYAML"])
    # Its checkpoints hold adapters: never resumed by (or from) a full fine-tune's run.
    assert run_name(lora) != run_name(full)
    assert PEFT_CLIENT in (REPO / "requirements-dev.txt").read_text().splitlines()


def test_a_harness_job_installs_the_pinned_lm_eval(code):
    from stack.catalog import LM_EVAL_CLIENT

    raw, _ = raw_config(STACK_FILES[0])
    training = json.loads(raw.get("training") or "{}")
    scored = stack(training=json.dumps({**training, "export": True, "data": "s3://my-bucket/d/",
                                        "harnessTasks": "gsm8k"}),
                   dataBuckets=json.dumps(["s3://my-bucket/d/"]))
    env = yaml.safe_load(build_rayjob(scored, code, S3)["spec"]["runtimeEnvYAML"])
    assert LM_EVAL_CLIENT in env["pip"]
    assert "pip" not in yaml.safe_load(build_rayjob(stack(), code, S3)["spec"]["runtimeEnvYAML"])
    assert LM_EVAL_CLIENT in (REPO / "requirements-dev.txt").read_text().splitlines()
