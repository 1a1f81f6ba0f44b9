"""The driver: `python -m training` parses flags, runs every pre-Ray check (data, model, storage,
memory), starts Ray Train and prints the run summary. Imports every layer below it, lazily."""
