"""moebench: CUDA-graph microbenchmark harness for the small kernels of MoE inference."""

__version__ = "0.1.0"
