"""The shipped task's data, read from beside this file (lm-eval's `custom_dataset` hook, so the
task loads from any working directory, a Ray worker's included)."""

from pathlib import Path

DATA = Path(__file__).with_name("instructions_mc.jsonl")


def load(**_):
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(DATA)})
