"""Pure torch/NumPy references for the softmax family (correct, not fast)."""
__all__: list[str] = []
