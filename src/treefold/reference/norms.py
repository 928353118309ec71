"""Pure torch/NumPy references for the norms family (correct, not fast)."""
__all__: list[str] = []
