"""`CStyleRenderer` with only the dialect basics (portable struct vectors, every vector op lane by lane, C99 math
names): every conformance kernel it can render computes the right numbers when compiled by the CPU's compiler and run
by the CPU runtime. This checks the base that CUDA, Metal and HIP build on, apart from the CPU's GNU-vector dialect."""
import pytest

from plugrad.dtype import dtypes
from plugrad.renderer.base import RendererError
from plugrad.renderer.cstyle import CStyleRenderer
from plugrad.testing.harness import run_and_compare
from plugrad.testing.kernels import suite

from cpu_helpers import C_ONLY

pytestmark = C_ONLY


class PlainC(CStyleRenderer):
  type_map = {**CStyleRenderer.type_map, dtypes.bool: "_Bool", dtypes.float16: "_Float16"}
  capabilities = frozenset({"float16", "float64", "int64"})

  def __init__(self, device: str):
    super().__init__(device)
    self.validate()

  def extra_params(self) -> list[str]: return ["int core_id", "int core_count"]  # the CPU runtime's calling convention

  def render_kernel(self, name, params, body, prelude) -> str: return "#include <math.h>\n" + super().render_kernel(name, params, body, prelude)


KERNELS = sorted(suite())


@pytest.mark.parametrize("name", KERNELS)
def test_base_renderer_kernels_run(cpu, name):
  from plugrad_cpu.toolchain import toolchain
  r = PlainC("CPU")
  kernel = suite()[name](r)
  if kernel.needs - r.capabilities: pytest.skip(f"needs {sorted(kernel.needs - r.capabilities)}")
  if "float16" in kernel.needs and not toolchain().float16: pytest.skip("the compiler has no _Float16")
  p = kernel.program("CPU", r)
  try: src = r.render(p)
  except RendererError as e:
    assert "launch indices" in str(e) and name == "global_ids"  # the base has no SPECIAL rendering of its own
    return
  if name == "vectors": assert "typedef struct { float v[4]; } float4;" in src and ".v[0]" in src
  run_and_compare(cpu, p.with_source(src), kernel)
