"""The benchmark (`python -m bench`): the job's training step against the reference approach on
GPUs, with a profiler breakdown. Not part of the job's code bundle: editing it never renames or
re-runs a RayJob."""
