# Every compiler stage is validated in tests; set before plugrad is imported anywhere.
import importlib.util
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

# Triton's libtriton (its own LLVM) segfaults when it is loaded after Mesa's libLLVM, which a WEBGPU test on lavapipe
# loads; torch imports triton lazily (torch.optim's schedulers reach torch._dynamo), so load it first where installed
if importlib.util.find_spec("triton") is not None:
  importlib.import_module("triton")

# the differential tester's, the composition fuzzer's and the ONNX node tests' summaries (docs/testing.md)
pytest_plugins = ["pytester", "tests.differential.report", "tests.fuzz.report", "tests.onnx.report"]
