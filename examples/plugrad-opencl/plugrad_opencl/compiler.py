"""OpenCL C → the device's program binary, built by the platform's own compiler (clBuildProgram)."""
from __future__ import annotations

from typing import Any

from plugrad.backend import CompileError, Compiler
from plugrad_opencl.platform import DeviceInfo, handles


def build_log(e: Exception) -> str:
  """The compiler's messages out of pyopencl's build error (which prefixes them with its own lines)."""
  text = str(e)
  _, sep, log = text.partition(">:\n\n")  # "Build on <pyopencl.Device ...>:\n\n<log>"
  return (log if sep else text).strip()


class OpenCLCompiler(Compiler):
  def __init__(self, device: str, info: DeviceInfo):
    self.device, self.info = device, info
    # float32 division and sqrt are 2.5 and 3 ulp in OpenCL C unless asked for: the interpreter rounds them correctly
    self.options = ("-cl-fp32-correctly-rounded-divide-sqrt",) if info.exact_div_sqrt else ()
    # the binary is the driver's own format for this one device: the key names the platform, device and driver
    self.cache_key = f"opencl | {info.identity} | {' '.join(self.options)}"

  def build(self, src: str) -> Any:
    """A built pyopencl Program for this device (CompileError with the build log when the source does not compile)."""
    import pyopencl as cl
    h = handles(self.device)
    # cache_dir=False: no pyopencl cache behind plugrad's (its annotation says str | None; the code takes False)
    try: return cl.Program(h.context, src).build(options=list(self.options), devices=[h.device], cache_dir=False)  # type: ignore[arg-type]
    except cl.Error as e: raise CompileError(build_log(e)) from None

  def compile(self, src: str) -> bytes:
    binaries = self.build(src).binaries
    if len(binaries) != 1 or not binaries[0]: raise CompileError(f"{self.info.name} returned no program binary (clGetProgramInfo)")
    return bytes(binaries[0])
