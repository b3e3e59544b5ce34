"""plugrad-amd: the AMD device of plugrad (HIP-dialect kernels compiled by clang + lld to AMDGPU code objects, HIP
through ctypes, hipGraphs for TinyJit). Registration is in `plugrad_amd.plugin`; nothing is imported here."""
__version__ = "0.1.0"
