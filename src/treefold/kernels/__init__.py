"""Triton code only: ``@triton.jit`` kernels and the combine functions they share."""
