"""plugrad-cuda: the CUDA device of plugrad (CUDA C through NVRTC and nvJitLink from pip wheels, the driver API
through ctypes, CUDA graphs for TinyJit). Registration is in `plugrad_cuda.plugin`; nothing is imported here."""
__version__ = "0.2.0"
