import importlib.util

# plugrad-amd is installed by .ci/run; a development install may lack it. test_amd_tensor_cores.py needs only the core
# (the PYTHON device's AMD_MFMA emulation) and always runs; the compiler tests also need clang and lld (they skip without).
collect_ignore = [] if importlib.util.find_spec("plugrad_amd") is not None else ["test_amd.py"]
