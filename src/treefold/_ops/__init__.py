"""Launchers: turn validated torch tensors into kernel launches (or reference calls)."""
