"""Pure torch/NumPy references, one module per family. Those the treefold order covers
(sums, norms) follow it exactly and give the same bits as the kernels."""
