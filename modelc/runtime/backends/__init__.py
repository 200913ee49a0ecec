"""Kernel backends: ``numpy_ref`` (the twins) and ``cpu`` (Cython kernels in cyx/)."""
