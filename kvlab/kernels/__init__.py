"""Decode kernels: CUDA C loaders and wrappers, and a Numba kernel."""
