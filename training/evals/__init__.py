"""After the export: the base and the fine-tuned model side by side, scored by EleutherAI's
lm-evaluation-harness (harness.py) and answering prompts of the evaluation set (samples.py)."""
