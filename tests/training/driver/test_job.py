"""The real job on a local Ray with real torch (gloo on CPU): learning, resume (on S3), faults,
data, the export to S3."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.training import kube_fake
from tests.ports import free_port
from training.driver import cli
from training.head import kube_api
from training.run import checkpoint
from training.run.handoff import RunSummary
from training.config import ConfigError, TrainConfig
from training.options import options
from training.pod_contract import CODE_DIGEST_ENV
from training.data.synthetic import SHIPPED
from training.step.engine import lr_at
from training.step.schedule import Schedule
from workloads.rbac import head_rbac

pytestmark = pytest.mark.usefixtures("ray_session")


def run(tmp_path, *flags: str) -> RunSummary:
    return cli.run(cli.parse(["--local", "--storage-path", str(tmp_path / "runs"), *flags]))


def name_of(*flags: str) -> str:
    """The name `run(tmp_path, *flags)` gives its run (from what defines it)."""
    return cli.parse(["--local", *flags]).name


def read_metrics(tmp_path, name: str) -> list[dict]:
    with open(tmp_path / "runs" / name / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_loss_halves_on_a_repeated_batch_with_the_tracking_server_down(tmp_path, monkeypatch,
                                                                     capsys):
    import ray

    actors_before = set(ray.state.actors())
    started = tmp_path / "run-started-at"  # as the run's Ray head records it, 100 s ago
    started.write_text(str(int(time.time()) - 100))
    monkeypatch.setenv(cli.RUN_STARTED_ENV, str(started))
    monkeypatch.setenv(cli.MLFLOW_ENV, f"http://127.0.0.1:{free_port()}")  # nothing listens
    # As in a Ray head on EKS: a Kubernetes API (on loopback) holding the run's start, 10 min ago.
    world = kube_fake.cold_start_world(time.time() - 600, "demo-cluster", "demo-job")
    rbac = head_rbac("ray", "demo-job", True)
    with kube_fake.FakeKube(world, rbac, tls_dir=tmp_path) as kube:
        env, sa = kube_fake.in_cluster_env(kube, tmp_path, "demo-cluster", "demo-job")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(kube_api, "SA_DIR", sa)
        s = run(tmp_path, "--data", "repeat", "--steps", "30", "--lr", "1e-2", "--seq-len", "64",
                "--log-every", "10")
    # The phases run from the RayJob's creation through the loop's own milestones.
    phases = [p["phase"] for p in s.cold_start["phases"]]
    assert phases[0] == "RayJob to Ray cluster pods created"
    assert phases[-4:] == ["Ray Train starts its workers", "NCCL initialised",
                           "model and data ready", "first optimizer step"]
    assert s.cold_start["total_s"] >= 600 and s.cold_start["gpu_node_usd"] > 0
    assert s.steps == 30 and s.world_size == 2
    assert "Connection" in s.mlflow_error and s.mlflow_run_id is None  # said, not fatal
    assert s.last_loss < 0.5 * s.first_loss, s
    # Time to first step counts from the run's start, and the workers' wait is part of it.
    assert 100 <= s.waited_for_workers_s < s.time_to_first_step_s, s
    assert (tmp_path / "runs" / s.run_dir.rsplit("/", 1)[1] / "metrics.png").stat().st_size > 0
    assert s.data_format == "repeat"
    assert "for transport and throughput checks only" in capsys.readouterr().out
    # No Ray Data for a run given no datasets: Ray Train's DatasetManager (and the coordinator
    # it starts) would be two idle worker processes per attempt.
    actors = {a["ActorClassName"] for k, a in ray.state.actors().items() if k not in actors_before}
    assert "RayTrainWorker" in actors and "DatasetManager" not in actors, actors


def test_rerun_on_s3_resumes_continues_steps_schedule_first_loss_and_mlflow_run_skipping_torn_saves(
        s3_server, mlflow_server, capfd, monkeypatch):
    flags = ["--local", "--storage-path", "s3://ckpt/runs", "--checkpoint-every", "2",
             "--log-every", "1", "--warmup-steps", "2", "--mlflow-tracking-uri", mlflow_server]
    first = cli.run(cli.parse([*flags, "--steps", "4"]))
    assert first.resumed_from_step is None
    run = first.run_dir.removeprefix("s3://ckpt/")  # runs/<name>
    assert first.checkpoint == f"s3://ckpt/{run}/checkpoint-step0000004"
    assert f"{run}/checkpoint-step0000004/.metadata" in s3_keys(s3_server)
    assert 0 < first.checkpoint_gib < 0.01
    assert 0 < first.tokens_per_s_with_checkpoints < first.tokens_per_s
    # A later save killed mid-upload: objects on S3, never marked complete nor registered.
    s3_server.put_object(Bucket="ckpt", Key=f"{run}/checkpoint-step0000005/__0_0.distcp",
                         Body=b"partial")
    capfd.readouterr()
    second = cli.run(cli.parse([*flags, "--steps", "8"]))
    assert second.resumed_from_step == 4 and second.steps == 8
    said = "".join(capfd.readouterr())  # the driver's lines and the workers' (Ray forwards them)
    assert said.count(f"resuming run {run.split('/')[1]!r} from s3://ckpt/{run}/"
                      "checkpoint-step0000004 (step 4)") == 1
    assert said.count("--steps 8 differs from the schedule's 4 steps") == 1  # not per process
    assert second.first_loss == first.first_loss  # the run's, not the second attempt's
    kept = sorted({k.split("/")[2] for k in s3_keys(s3_server) if "/checkpoint-step" in k})
    # Ray Train keeps the newest 2 it registered; the torn directory is left as it is.
    assert kept == [f"checkpoint-step000000{i}" for i in (5, 6, 8)]
    metrics_csv = s3_server.get_object(Bucket="ckpt", Key=f"{run}/metrics.csv")["Body"].read()
    rows = list(csv.DictReader(io.StringIO(metrics_csv.decode())))
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    # Past warmup, the first run ended its decay at step 4: the rerun continues from that rate
    # instead of jumping back up the 8-step schedule.
    lrs = [float(r["lr"]) for r in rows]
    assert lrs[4:] == pytest.approx([lrs[3]] * 4) and lrs[4] < lr_at(5, TrainConfig(steps=8))
    # One MLflow run across both: every step's metrics, the first settings, the changed one.
    assert first.mlflow_error is None and second.mlflow_run_id == first.mlflow_run_id
    tracked = mlflow_run(mlflow_server, first.mlflow_run_id)
    assert tracked["loss"] == [(i, pytest.approx(float(r["loss"]))) for i, r in enumerate(rows, 1)]
    assert [step for step, _ in tracked["grad_norm"]] == list(range(1, 9))
    assert tracked["params"]["steps"] == "4" and tracked["tags"]["resumed.steps"] == "8"
    assert tracked["params"]["micro_batch_size"] == "4" and tracked["status"] == "FINISHED"
    assert {"summary.json", "metrics.png"} <= tracked["artifacts"]
    assert not {"test_hooks", *(o.name for o in options() if o.group)} & set(tracked["params"])
    # Once more with the same steps: finished, said so, its results left as they are.
    summary = s3_server.get_object(Bucket="ckpt", Key=f"{run}/summary.json")["Body"].read()
    again = cli.run(cli.parse([*flags, "--steps", "8"]))
    assert again.steps == 8 and again.last_loss == second.last_loss
    assert "finished at step 8 of 8 already" in capfd.readouterr().out
    assert s3_server.get_object(Bucket="ckpt", Key=f"{run}/summary.json")["Body"].read() \
        == summary
    # With --export, as the next RayJob starts it (workloads/rayjob.py: the digest of the code
    # it runs in its env): the last checkpoint exported without a step, the results kept, and
    # one summary, the file holding what the job prints.
    assert first.code_digest is None  # a local run: no RayJob, no code bundle
    monkeypatch.setenv(CODE_DIGEST_ENV, "0f" * 32)  # a sha256 hex digest (workloads/code_bundle.py)
    exported = cli.run(cli.parse([*flags, "--steps", "8", "--export"]))
    said = capfd.readouterr().out
    assert "finished at step 8 already" in said and "exporting its last checkpoint" in said
    assert "step 1/" not in said  # no step ran
    assert exported.code_digest == "0f" * 32
    assert exported.export_path == f"s3://ckpt/{run}/hf_model"
    assert f"{run}/hf_model/COMPLETE" in s3_keys(s3_server)
    assert (exported.steps, exported.first_loss, exported.last_loss) == \
        (8, first.first_loss, second.last_loss)
    assert s3_server.get_object(Bucket="ckpt", Key=f"{run}/metrics.csv")["Body"].read() == \
        metrics_csv
    assert json.loads(s3_server.get_object(Bucket="ckpt", Key=f"{run}/summary.json")["Body"]
                      .read()) == exported.to_dict()


def s3_keys(client) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="ckpt")
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_worker_killed_right_after_a_save_resumes_from_that_save_with_the_same_eval_losses(
        tmp_path):
    chat = ["--data", str(SHIPPED), "--tokenizer", "bytes", "--seq-len", "64",
            "--micro-batch-size", "2", "--eval-fraction", "0.05", "--eval-every", "2",
            "--steps", "6", "--checkpoint-every", "4", "--log-every", "1"]
    straight = run(tmp_path, *chat, "--name", "straight")
    # No grace period: the dying rank exits as soon as the save returns, before Ray Train's
    # controller polls and registers the checkpoint; the COMPLETE marker still finds it.
    s = run(tmp_path, *chat, "--max-failures", "1", "--fault-at-step", "4")
    assert s.steps == 6 and s.resumed_from_step == 4
    # Evaluated before step 1, at 2 and 4 (first attempt) and 6 (after the resume): the same
    # losses as the uninterrupted run, to the bit.
    evals = [{r["step"]: r["eval_loss"] for r in read_metrics(tmp_path, name) if r["eval_loss"]}
             for name in ("straight", s.run_dir.rsplit("/", 1)[1])]
    assert list(evals[0]) == ["0", "2", "4", "6"] and evals[0] == evals[1]
    # Each epoch in its own seeded document order, and the resume reads on in that order.
    losses = [[r["loss"] for r in read_metrics(tmp_path, name) if r["loss"]]
              for name in ("straight", s.run_dir.rsplit("/", 1)[1])]
    assert len(losses[0]) == 6 and losses[0] == losses[1]
    assert (s.first_eval_loss, s.eval_loss) == (straight.first_eval_loss,
                                                      straight.eval_loss)


def test_lora_learns_resumes_after_a_worker_killed_in_an_upload_and_exports_adapter_and_merged(
        tmp_path):
    """`--lora-rank` end to end on Ray: adapter-only checkpoints, a worker killed while one is
    uploading, the resume from the one before, and both exports; the adapter on the rebuilt
    base merges (PEFT's own merge_and_unload) to the merged export. Exactness of the resume:
    tests/training/model/."""
    import torch
    import torch.distributed.checkpoint as dcp
    from peft import PeftModel
    from safetensors.torch import load_file

    from training.model.model import build_model, model_config
    from training.run import export

    s = run(tmp_path, "--lora-rank", "8", "--lora-alpha", "16", "--data", "repeat", "--lr",
            "2e-2", "--warmup-steps", "0", "--seq-len", "32", "--steps", "8",
            "--checkpoint-every", "2", "--log-every", "1", "--export", "--max-failures", "1",
            "--fault-in-save-at-step", "4")
    # The step-4 save is in flight when a rank dies: its directory is never marked COMPLETE nor
    # registered, so the retry resumes from step 2 (completed before step 4's save began).
    assert s.steps == 8 and s.resumed_from_step == 2 and s.checkpoint.endswith("step0000008")
    assert s.last_loss < s.first_loss - 0.3, (s.first_loss, s.last_loss)
    saved = dcp.FileSystemReader(s.checkpoint).read_metadata().state_dict_metadata
    weights = [k for k in saved if k.startswith("model.")]
    assert len(weights) == 28 and all(".lora_" in k for k in weights)  # 2 layers x 7 x (A, B)
    run_dir = tmp_path / "runs" / s.run_dir.rsplit("/", 1)[1]
    for name in (export.EXPORT_DIR, export.ADAPTER_DIR):
        assert (run_dir / name / export.MARKER).exists()
    base = build_model("tiny", model_config("tiny"), seed=0)  # the run's random-init base
    # ... which the run leaves too, named by the adapter: PEFT loads it from what the run left
    named = json.loads((run_dir / export.ADAPTER_DIR / "adapter_config.json").read_text())
    assert named["base_model_name_or_path"] == str(run_dir / export.BASE_DIR)
    left = load_file(run_dir / export.BASE_DIR / "model.safetensors")
    assert all(torch.equal(v, base.state_dict()[k].to(v.dtype)) for k, v in left.items())
    from transformers import AutoModelForCausalLM

    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(
        named["base_model_name_or_path"]), run_dir / export.ADAPTER_DIR)
    merged = PeftModel.from_pretrained(base, run_dir / export.ADAPTER_DIR).merge_and_unload()
    ours = load_file(run_dir / export.EXPORT_DIR / "model.safetensors")
    theirs = {k: v.to(torch.bfloat16) for k, v in merged.state_dict().items()}
    assert ours.keys() == theirs.keys() - {"lm_head.weight"}  # tied: stored once
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_non_finite_loss_stops_before_saving_and_keeps_the_good_checkpoints(tmp_path):
    # Not retried as a worker failure: a retry would replay the same divergence (the hook fires
    # only in a fresh attempt, so a retried run would "succeed" here and fail this test).
    flags = ["--steps", "12", "--checkpoint-every", "2", "--log-every", "100", "--nan-at-step",
             "5", "--max-failures", "1"]
    with pytest.raises(cli.JobError, match="not finite at step 5.*checkpoint step 4"):
        run(tmp_path, *flags)
    kept = sorted(p.name for p in (tmp_path / "runs" / name_of(*flags)).glob("checkpoint-step*"))
    assert kept == ["checkpoint-step0000002", "checkpoint-step0000004"]


def test_trains_exports_to_s3_and_the_next_run_continues_from_that_export(
        tmp_path, tokenizer_dir, s3_server, mlflow_server, monkeypatch):
    text = ["--data", str(REPO / "training/data/sample_data/tiny_corpus.jsonl"), "--seq-len", "64",
            "--micro-batch-size", "2", "--checkpoint-every", "0", "--local",
            "--storage-path", "s3://ckpt/runs"]
    # A relative --tokenizer: the workers (another working directory) and the export find it.
    monkeypatch.chdir(tokenizer_dir.parent)
    s = cli.run(cli.parse([*text, "--tokenizer", tokenizer_dir.name, "--steps", "12",
                           "--lr", "5e-3", "--log-every", "4", "--export",
                           "--mlflow-tracking-uri", mlflow_server]))
    assert s.steps == 12 and s.last_loss < s.first_loss
    run = s.run_dir.removeprefix("s3://ckpt/")  # runs/<name>
    assert s.export_path == f"s3://ckpt/{run}/hf_model"
    keys = {o["Key"] for o in s3_server.list_objects_v2(Bucket="ckpt", Prefix=f"{run}/"
                                                         "hf_model/")["Contents"]}
    assert {f"{run}/hf_model/{f}" for f in ("COMPLETE", "model.safetensors",
            "config.json", "generation_config.json", "tokenizer.json")} <= keys
    assert mlflow_run(mlflow_server, s.mlflow_run_id)["tags"]["export_path"] == s.export_path
    # The export as --model: rank 0 reads it from S3, the others get their shards from rank 0.
    again = cli.run(cli.parse([*text, "--model", s.export_path + "/", "--steps", "2",
                               "--tokenizer", str(tokenizer_dir), "--name", "continued"]))
    assert again.first_loss < s.first_loss - 0.5, (s, again)
    assert len(again.load_host_rss_gib) == 2 and again.load_s > 0


@pytest.mark.parametrize("flags, message", [
    (["--model", "/no/such/model"], "no such model directory"),
    (["--seq-len", "4096"], "beyond the model's 1024 positions"),
    (["--storage-path", "/proc/forbidden/runs"], "not writable"),
    (["--data", "/no/such/file.jsonl", "--tokenizer", "x"], "no such file"),
    (["--model", "qwen2.5-1.5b", "--seq-len", "2048", "--micro-batch-size", "64",
      "--memory-budget-gib", "22"], "GiB per GPU even with activation checkpointing"),
    (["--lora-rank", "4", "--lora-target-modules", "q_proj,qkv"], "qkv.*linear layers: down_proj"),
    (["--lora-rank", "4", "--lora-target-modules", "lm_head"], "only inside the decoder layers"),
    (["--load-in-4bit"], "QLoRA .* not supported.*--lora-rank"),
    # Full fine-tuning of 7B on 8 L4s cannot fit; its LoRA plan is checked and runs (planning).
    (["--model", "qwen2.5-7b", "--seq-len", "2048", "--num-workers", "8",
      "--memory-budget-gib", "22"], "GiB per GPU even with activation checkpointing"),
])
def test_bad_input_fails_before_ray_starts(tmp_path, no_ray, flags, message):
    with pytest.raises(ValueError, match=message):
        run(tmp_path, *flags)
    assert not [p for p in (tmp_path / "runs").glob("*") if p.is_dir()]  # no run directory


def test_resuming_a_run_on_other_data_fails_before_ray_starts(tmp_path, no_ray):
    saved = tmp_path / "runs" / name_of("--data", "repeat") / "checkpoint-step0000004"
    saved.mkdir(parents=True)
    (saved / "COMPLETE").write_text("")
    state = checkpoint.RunState(step=4, samples_seen=32, data="random",
                                schedule=Schedule(1e-3, 5, 30).to_dict())
    (saved / checkpoint.STATE_FILE).write_text(json.dumps(dataclasses.asdict(state)))
    with pytest.raises(ValueError, match="trained on other data.*another --name"):
        run(tmp_path, "--data", "repeat")


def mlflow_run(uri: str, run_id: str) -> dict:
    """What the tracking server holds for a run: metric histories as (step, value), params,
    tags, status and artifact names."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    history = {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k),
                                                      key=lambda m: m.step)]
               for k in run.data.metrics}
    return {**history, "params": run.data.params, "tags": run.data.tags,
            "status": run.info.status,
            "artifacts": {a.path for a in client.list_artifacts(run_id)}}


def test_more_workers_than_the_cluster_has_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="needs 64 CPUs"):
        run(tmp_path, "--num-workers", "64")
    assert not (tmp_path / "runs").exists()  # refused once Ray was there: nothing left behind


def test_empty_dataset_is_rejected_before_training(tmp_path, tokenizer_dir):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"text": ""}) + "\n")
    with pytest.raises(ValueError, match="empty.jsonl row 1: no token to train on"):
        run(tmp_path, "--data", str(empty), "--tokenizer", str(tokenizer_dir))


def test_demo_learns_the_sample_text_and_logs_and_plots_every_step(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "training", "--demo", "--storage-path",
                           str(tmp_path / "runs"), "--steps", "12"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 12 and summary["resumed_from_step"] is None
    assert summary["data_format"] == "messages" and "loss on the assistant turns" in proc.stdout
    # From a uniform guess over 257 byte values (ln 257 = 5.55) to the bytes of the answers,
    # on the held-out split as well.
    assert summary["last_loss"] < summary["first_loss"] - 1.0, summary
    assert summary["eval_loss"] < summary["first_eval_loss"] - 1.0, summary
    rows = read_metrics(tmp_path, "demo")
    assert [int(r["step"]) for r in rows] == list(range(0, 13))  # step 0: the first evaluation
    assert [int(r["step"]) for r in rows if r["eval_loss"]] == [0, 5, 10, 12]
    assert (tmp_path / "runs/demo/metrics.png").stat().st_size > 0
    assert summary["nccl_transport"] == "not-used"  # gloo: says so rather than guessing
    # What the defaults resolved to on CPU: eager, ZeRO-3, no activation checkpointing.
    assert (summary["compile"], summary["reshard_after_forward"],
            summary["activation_checkpointing"]) == (False, True, False)
    assert "PlacementGroupCleaner" not in proc.stdout + proc.stderr
    assert "logging_progress" not in proc.stdout + proc.stderr  # Ray Data's progress lines
