"""The shipped task's data, read from beside this file (lm-eval's `custom_dataset` hook, so the
task loads from any working directory, a Ray worker's included)."""

from pathlib import Path

DATA = Path(__file__).with_name("instructions_mc.jsonl")


def load(**_):
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(DATA)})


def answer_bits(doc: dict, results: list) -> dict:
    """`instructions_answers`' metrics of one question: the true answer's negative
    log-likelihood after the question in bits per byte of the answer (a model that guesses
    each of the 257 byte-tokenizer values uniformly scores about 8), and whether the answer is
    the model's own greedy continuation."""
    import math

    loglikelihood, greedy = results[0]
    answer = doc["choices"][doc["label"]]
    return {"bits_per_byte": -loglikelihood / (len(answer.encode()) * math.log(2)),
            "acc": float(greedy)}
