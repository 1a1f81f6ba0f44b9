"""The data path, in one place: what a run trains on and how it reaches the workers.

- `random_tokens.py`: deterministic random tokens (`--data random|repeat`), for transport and
  throughput checks.
- `source.py`: the files of `--data` (local or s3://), their identity and their rows.
- `formats.py`: one record per data format (its columns, how a row is encoded, what the loss
  trains on, what an untrainable row lacks); `tokenize.py`: the tokenizers that encode them.
- `cache.py`: the tokenized, packed form in the run directory, built once on the driver before
  Ray starts; `prepare.py` builds it and checks it against the model.
- `packing.py`: which samples each rank reads (a pure function of how many the run has consumed,
  saved in every checkpoint, so resumes are exact), their labels and per-document positions.
- `synthetic.py`: the generator of the shipped instruction set.
"""

from training.errors import InputError


class DataError(InputError):
    """The --data source cannot feed training."""
