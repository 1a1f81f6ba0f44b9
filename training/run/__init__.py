"""What a run does around its steps: the worker loop, checkpoints, evaluation, the export, run
files (metrics.csv, summary) and experiment tracking."""
