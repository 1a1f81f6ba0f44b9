"""The model and its loss: built-in shapes and Hugging Face models (`model.py`), the fused chunked
cross-entropy (`loss.py`), and pretrained weights read once by rank 0 (`loading.py`)."""
