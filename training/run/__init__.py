"""What a run does around its steps: the worker's setup and step loop, the driver/worker hand-offs,
checkpoints, evaluation, the export, run files (metrics.csv, summary), tracking and test hooks."""
