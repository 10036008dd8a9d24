"""One operation timed: an edit, the rotate-and-splice kernel, the model's matrix products, prefill, constrained
decoding (``leyline-bench edit | kernel | gemm | prefill | grammar``)."""
