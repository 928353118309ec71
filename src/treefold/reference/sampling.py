"""Pure torch/NumPy references for the sampling family (correct, not fast)."""
__all__: list[str] = []
