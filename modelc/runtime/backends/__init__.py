"""Kernel backends: ``numpy_ref`` (the reference twins), ``cpu`` (Cython kernels in
cyx/), ``cuda`` (NVRTC through CuPy) and ``webgpu`` (WGSL through wgpu), each falling
back to the reference through ``fallback``; ``factory`` picks one by name."""
