"""The expander's work grows with the kernel it writes, not with lanes × expression size: counted in graph_rewrite calls
(deterministic), never timed."""
import pytest

import plugrad.uop.rewrite as rewrite
from plugrad.codegen.expand import expand, linear_coefficient
from plugrad.dtype import dtypes
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import symbolic

F32 = dtypes.float32
N = 256


def glob(slot: int) -> UOp: return UOp(Ops.DEFINE_GLOBAL, F32.ptr(N * N), (), slot)


def wide_ast(up_i: int, up_j: int, divmod_index: bool = False) -> UOp:
  """out[i, j] = a[j, i] * 2 + b[...] with i and j split into a loop and an UPCAST range each: the store is contiguous along
  j (the vector axis), the load of `a` is a gather along it, and `b` is read at a linear index or under a div/mod."""
  out, a, b = glob(0), glob(1), glob(2)
  io, jo = UOp.range(N // up_i, 0), UOp.range(N // up_j, 1)
  iu, ju = UOp.range(up_i, 2, AxisType.UPCAST), UOp.range(up_j, 3, AxisType.UPCAST)
  # the index forms the optimizer builds (`(0+r)*1` and friends), not simplified
  i, j = io * up_i + (UOp.const(dtypes.index, 0) + iu) * 1, jo * up_j + (UOp.const(dtypes.index, 0) + ju) * 1
  bidx = ((j // 3) * N + i) if divmod_index else (i * N + j)
  val = UOp(Ops.LOAD, F32, (a.index(j * N + i),)) * 2.0 + UOp(Ops.LOAD, F32, (b.index(bidx),))
  store = UOp(Ops.STORE, dtypes.void, (out.index(i * N + j), val))
  return UOp(Ops.END, dtypes.void, (store, io, jo, iu, ju)).sink(arg=KernelInfo("wide"))


def rewrites_in_expand(monkeypatch: pytest.MonkeyPatch, ast: UOp, width: int) -> tuple[int, UOp]:
  calls = [0]
  inner = rewrite._bottom_up
  def counted(*args):
    calls[0] += 1
    return inner(*args)
  monkeypatch.setattr(rewrite, "_bottom_up", counted)
  out = expand(ast, width)
  monkeypatch.setattr(rewrite, "_bottom_up", inner)
  return calls[0], out


@pytest.mark.parametrize("up_i,up_j,width", [(4, 16, 8), (8, 64, 16), (16, 128, 16)])
def test_linear_indices_expand_without_rewrites(monkeypatch, up_i, up_j, width):
  # contiguity of linear indices is read off their coefficients: no rewrite at all, however many lanes and copies
  n, out = rewrites_in_expand(monkeypatch, wide_ast(up_i, up_j), width)
  assert n == 0
  loads = [u for u in graph_rewrite(out, symbolic).toposort if u.op is Ops.LOAD]
  assert sum(u.dtype.count == width for u in loads) == up_i * up_j // width  # b: one vector load per copy
  assert sum(u.dtype.count == 1 for u in loads) == up_i * up_j  # a: gathered, one scalar load per lane


def test_rewrites_do_not_grow_with_lanes(monkeypatch):
  # an index under a div/mod needs the simplifier, once per copy of the body (a few calls), never once per lane:
  # doubling the lanes with the copies fixed keeps the count
  narrow, _ = rewrites_in_expand(monkeypatch, wide_ast(4, 16, divmod_index=True), 16)
  wide, _ = rewrites_in_expand(monkeypatch, wide_ast(4, 32, divmod_index=True), 32)
  assert narrow == wide <= 3 * 4 * 2


def test_linear_coefficient():
  r, s = UOp.range(8, 0), UOp.range(4, 1)
  zero = UOp.const(dtypes.index, 0)
  assert linear_coefficient((zero + r) * 1 + s * 8, r) == 1
  assert linear_coefficient(r * 4 + (r + s) * 2, r) == 6
  assert linear_coefficient(s * 8 + 3, r) == 0
  assert linear_coefficient((r + s) // 2, r) is None  # under a div: not linear
