"""Compiled Cython kernels (built from ``cyx/``). Import through ``modelc.runtime.backend``."""
