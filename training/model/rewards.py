"""The names of `--objective dpo`'s metrics, standard library only (the run's facts, metrics.csv
and the plot read them without torch): TRL's (trl/trainer/dpo_trainer.py `_compute_loss`:
`self._metrics[mode]["rewards/chosen"]`, ...), the evaluation's with transformers' Trainer's
`eval_` prefix. Computed in model/dpo.py."""

REWARD_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins")
EVAL_REWARD_METRICS = tuple(f"eval_{m}" for m in REWARD_METRICS)
