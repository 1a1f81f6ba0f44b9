"""Training batches: deterministic random tokens, or text tokenized once into an indexed file.

Random tokens (the reference's mode) are a pure function of (seed, rank, step, micro-batch), so a
resumed run sees exactly the batches it would have seen.

Text is tokenized once per run by Ray Data on the cluster and packed, on the driver, into
`seq_len + 1`-token samples in a fixed order (Ray Data's `preserve_order`; directories are listed
sorted, ray/data/datasource/file_meta_provider.py `_list_files`). The samples go into
`tokens-<fingerprint>/` in the run directory: a flat uint32 file and `index.json`, written last.
Sample `i` is row `i mod n` of that file, so the stream of samples is a pure function of how many
the run has consumed (`samples_seen`, saved in every checkpoint): a resume reads from there with
any world size or micro-batch, covers every sample once per epoch, and tokenizes nothing again.
"""


class DataError(ValueError):
    """The --data source cannot feed training."""
