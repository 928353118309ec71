"""Public norms functions: validation, docstrings, dispatch (kernel / interpreter / reference)."""
__all__: list[str] = []
