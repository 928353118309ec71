"""Pure torch/NumPy references for the reductions family (correct, not fast)."""
__all__: list[str] = []
