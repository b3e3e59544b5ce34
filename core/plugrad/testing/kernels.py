"""The kernels of the conformance suite: small LINEAR programs built directly as UOps, with numpy inputs and the
numpy answers they must produce. Each builder takes the device's renderer, so a kernel can use what the device
declares (its tensor cores) and say what it needs (`needs`: renderer capabilities such as "locals" or "float16").

Expected values come from numpy with C's integer semantics written out (truncating division, remainder with the
sign of the dividend, wrap-around), never from plugrad's own interpreter or constant folder.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrad.codegen.decompose import decompose_linear
from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import INVERSE_NAMES, AddrSpace, DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.renderer.tensor_cores import TensorCore
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp, Variable
from plugrad.uop.program import ProgramUOp, make_program

I32 = dtypes.int32


def dname(dt: DType) -> str: return INVERSE_NAMES[dt]


@dataclass
class SuiteKernel:
  """One conformance kernel: its program, its inputs by buffer slot, and the expected contents of its outputs."""
  name: str
  uops: list[UOp]
  inputs: dict[int, np.ndarray]
  expected: dict[int, np.ndarray]
  sizes: dict[int, int]
  dtypes: dict[int, DType]
  needs: frozenset[str] = frozenset()
  var_vals: dict[str, int] = field(default_factory=dict)
  rtol: float = 0.0
  atol: float = 0.0
  # a kernel the codegen builds for each renderer itself (the fused attention): (device, renderer) -> its PROGRAM
  build: Callable[[str, Renderer], ProgramUOp] | None = None

  def program(self, device: str, renderer: Renderer) -> ProgramUOp:
    """The kernel for `renderer`, with the shared decompositions its flags ask for applied (as the codegen would)."""
    if self.build is not None: return self.build(device, renderer)
    ast = UOp(Ops.SINK, dtypes.void, (), KernelInfo(self.name))
    return make_program(ast, device).with_linear(decompose_linear(self.uops, renderer))


class LinearBuilder:
  """Appends uops in order; a uop's sources are appended first if they are not there yet. Loop-invariant values
  (globals, constants) should be made before the first RANGE so they are not defined inside a closed loop."""

  def __init__(self) -> None:
    self.uops: dict[UOp, None] = {}

  def emit(self, u: UOp) -> UOp:
    pending = [u]
    while pending:
      x = pending[-1]
      missing = [s for s in x.src if s not in self.uops]
      if missing: pending.extend(reversed(missing))
      else:
        pending.pop()
        self.uops.setdefault(x, None)
    return u

  def glob(self, slot: int, dt: DType, size: int) -> UOp: return self.emit(UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), slot))
  def const(self, dt: DType, v: Any) -> UOp: return self.emit(UOp.const(dt, v))
  def range(self, bound: UOp | int, axis: int) -> UOp:
    return self.emit(UOp.range(bound if isinstance(bound, UOp) else self.const(I32, bound), axis, AxisType.LOOP, I32))
  def end(self, r: UOp) -> UOp: return self.emit(UOp(Ops.ENDRANGE, dtypes.void, (r,)))
  def load(self, buf: UOp, idx: UOp, gate: UOp | None = None, alt: UOp | None = None, after: UOp | None = None) -> UOp:
    """`after` (an ENDRANGE) orders a re-read of memory written in a loop after that loop (the same LOAD uop would be
    the read inside the loop: UOps are hash-consed)."""
    index = UOp(Ops.INDEX, buf.dtype, (buf, idx) if gate is None else (buf, idx, gate))
    return self.emit(UOp(Ops.LOAD, buf.dtype.base, (index,) + ((alt,) if alt is not None else ()) + ((after,) if after is not None else ())))
  def store(self, buf: UOp, idx: UOp, val: UOp, gate: UOp | None = None) -> None:
    self.emit(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype, (buf, idx) if gate is None else (buf, idx, gate)), val)))
  def alu(self, op: Ops, *src: UOp, dtype: DType | None = None) -> UOp:
    out = dtype if dtype is not None else dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else src[-1].dtype
    return self.emit(UOp(op, out, tuple(src)))

  @property
  def linear(self) -> list[UOp]: return list(self.uops)


# ---- reference semantics in numpy

def np_dtype(dt: DType) -> np.dtype: return np.dtype(np.float32) if dt is dtypes.bfloat16 else dtypes.to_numpy(dt)


def bf16_round(x: np.ndarray) -> np.ndarray:
  """float32 → nearest bfloat16 (ties to even), as float32; nan becomes the quiet nan of its sign. The host-side twin of
  the codegen's emulation (`round_bf16_bits` in codegen/decompose.py), for building inputs and expected values."""
  b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
  r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
  return np.where((b & 0x7FFFFFFF) > 0x7F800000, ((b & 0x80000000) | 0x7FC00000).astype(np.uint32), r).view(np.float32)


def as_dtype(x: np.ndarray, dt: DType) -> np.ndarray:
  """Values as the dtype holds them (bfloat16: rounded, kept in float32)."""
  return bf16_round(np.asarray(x, np.float32)) if dt is dtypes.bfloat16 else np.asarray(x).astype(np_dtype(dt))


def c_idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
  return np.where((a < 0) != (b < 0), -q, q)


def _ref_binary(op: Ops, a: np.ndarray, b: np.ndarray, dt: DType) -> np.ndarray:
  with np.errstate(all="ignore"):
    if op is Ops.ADD: r = a + b
    elif op is Ops.SUB: r = a - b
    elif op is Ops.MUL: r = a * b
    elif op is Ops.FDIV: r = a / b
    elif op is Ops.IDIV: r = c_idiv(a, b)
    elif op is Ops.MOD: r = a.astype(np.int64) - b.astype(np.int64) * c_idiv(a, b)
    elif op is Ops.MAX: r = np.maximum(a, b)
    elif op is Ops.CMPLT: return a < b
    elif op is Ops.CMPNE: return a != b
    elif op is Ops.CMPEQ: return a == b
    elif op is Ops.AND: r = a & b
    elif op is Ops.OR: r = a | b
    elif op is Ops.XOR: r = a ^ b
    elif op is Ops.SHL: r = a.astype(np.uint64) << b.astype(np.uint64)
    elif op is Ops.SHR: r = a >> b
    else: raise ValueError(f"no reference for {op!r}")
    if dtypes.is_int(dt): return np.asarray(r).astype(np.uint64 if dtypes.is_unsigned(dt) else np.int64).astype(np_dtype(dt))
    return as_dtype(r, dt)


def _inputs(dt: DType, n: int, seed: int, nonzero: bool = False, small: bool = False) -> np.ndarray:
  rng = np.random.default_rng(seed)
  if dt is dtypes.bool: return rng.integers(0, 2, n).astype(bool)
  if dtypes.is_int(dt):
    lo, hi = (0, 7) if small else (max(dtypes.min(dt) + 1, -1000), min(dtypes.max(dt), 1000))
    x = rng.integers(lo, hi + 1, n).astype(np_dtype(dt))
    if nonzero: x[x == 0] = 3
    return x
  x = rng.uniform(-4, 4, n).astype(np.float32)
  if nonzero: x[np.abs(x) < 0.1] = 0.5
  return as_dtype(x, dt)


# ---- the kernels

N = 37  # not a power of two: tails matter


def elementwise(op: Ops, dt: DType) -> Callable[[Renderer], SuiteKernel]:
  def build(r: Renderer) -> SuiteKernel:
    k = LinearBuilder()
    out_dt = dtypes.bool if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ) else dt
    out, a, b = k.glob(0, out_dt, N), k.glob(1, dt, N), k.glob(2, dt, N)
    i = k.range(N, 0)
    k.store(out, i, k.alu(op, k.load(a, i), k.load(b, i), dtype=out_dt))
    k.end(i)
    shift = op in (Ops.SHL, Ops.SHR)
    x = _inputs(dt, N, 1, small=False)
    if shift or op is Ops.MOD or op is Ops.IDIV: x = np.abs(x) if dtypes.is_unsigned(dt) or shift else x
    y = _inputs(dt, N, 2, nonzero=op in (Ops.IDIV, Ops.MOD, Ops.FDIV), small=shift)
    want = _ref_binary(op, x, y, dt)
    tol = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2}.get(dt, 1e-6 if dtypes.is_float(dt) else 0.0)
    return SuiteKernel(f"ew_{op.name.lower()}_{dname(dt)}", k.linear, {1: x, 2: y}, {0: want}, {0: N, 1: N, 2: N},
                       {0: out_dt, 1: dt, 2: dt}, _dtype_needs(dt), rtol=tol, atol=tol)
  return build


def unary(op: Ops, dt: DType) -> Callable[[Renderer], SuiteKernel]:
  refs = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.RECIPROCAL: np.reciprocal, Ops.NEG: np.negative,
          Ops.TRUNC: np.trunc}

  def build(r: Renderer) -> SuiteKernel:
    k = LinearBuilder()
    out, a = k.glob(0, dt, N), k.glob(1, dt, N)
    i = k.range(N, 0)
    k.store(out, i, k.alu(op, k.load(a, i)))
    k.end(i)
    x = _inputs(dt, N, 3, nonzero=True)
    if op in (Ops.LOG2, Ops.SQRT): x = np.abs(x)
    with np.errstate(all="ignore"): want = as_dtype(refs[op](x.astype(np.float64)), dt)
    tol = {dtypes.float16: 2e-3, dtypes.bfloat16: 1.6e-2, dtypes.float64: 1e-12}.get(dt, 2e-6)
    return SuiteKernel(f"un_{op.name.lower()}_{dname(dt)}", k.linear, {1: x}, {0: want}, {0: N, 1: N}, {0: dt, 1: dt},
                       _dtype_needs(dt), rtol=tol, atol=tol)
  return build


def cast(src: DType, dst: DType) -> Callable[[Renderer], SuiteKernel]:
  def build(r: Renderer) -> SuiteKernel:
    k = LinearBuilder()
    out, a = k.glob(0, dst, N), k.glob(1, src, N)
    i = k.range(N, 0)
    k.store(out, i, k.emit(UOp(Ops.CAST, dst, (k.load(a, i),))))
    k.end(i)
    x = _inputs(src, N, 4)
    if dtypes.is_float(src) and dtypes.is_int(dst): x = np.abs(x) if dtypes.is_unsigned(dst) else x  # negative float → uint is UB in C
    want = (x != 0) if dst is dtypes.bool else as_dtype(np.trunc(x.astype(np.float64)) if dtypes.is_int(dst) else x.astype(np.float64), dst)
    tol = 1e-2 if dtypes.bfloat16 in (src, dst) else 1e-3 if dtypes.float16 in (src, dst) else 0.0
    return SuiteKernel(f"cast_{dname(src)}_to_{dname(dst)}", k.linear, {1: x}, {0: want}, {0: N, 1: N},
                       {0: dst, 1: src}, _dtype_needs(src) | _dtype_needs(dst), rtol=tol, atol=tol)
  return build


def reduce_rows(r: Renderer) -> SuiteKernel:
  """out[row] = sum(a[row, :]) with a register accumulator."""
  rows, cols = 5, 33
  k = LinearBuilder()
  out, a = k.glob(0, dtypes.float32, rows), k.glob(1, dtypes.float32, rows * cols)
  acc = k.emit(UOp(Ops.DEFINE_REG, dtypes.float32.ptr(1, AddrSpace.REG), (), 0))
  zero, c0, ncols = k.const(dtypes.float32, 0.0), k.const(I32, 0), k.const(I32, cols)
  row = k.range(rows, 0)
  k.store(acc, c0, zero)
  col = k.range(cols, 1)
  k.store(acc, c0, k.alu(Ops.ADD, k.load(acc, c0), k.load(a, k.alu(Ops.ADD, k.alu(Ops.MUL, row, ncols), col))))
  k.store(out, row, k.load(acc, c0, after=k.end(col)))
  k.end(row)
  x = _inputs(dtypes.float32, rows * cols, 5)
  return SuiteKernel("reduce_rows", k.linear, {1: x}, {0: x.reshape(rows, cols).sum(1)}, {0: rows, 1: rows * cols},
                     {0: dtypes.float32, 1: dtypes.float32}, rtol=1e-5, atol=1e-5)


def symbolic_size(r: Renderer) -> SuiteKernel:
  """A loop bounded by a variable: out[i] = a[i] * 2 for i < n, the rest untouched."""
  cap = 32
  k = LinearBuilder()
  out, a = k.glob(0, dtypes.float32, cap), k.glob(1, dtypes.float32, cap)
  n = k.emit(Variable("n", 1, cap, I32))
  two = k.const(dtypes.float32, 2.0)
  i = k.range(n, 0)
  k.store(out, i, k.alu(Ops.MUL, k.load(a, i), two))
  k.end(i)
  x = _inputs(dtypes.float32, cap, 6)
  want = np.zeros(cap, np.float32)
  want[:13] = x[:13] * 2
  return SuiteKernel("symbolic_size", k.linear, {0: np.zeros(cap, np.float32), 1: x}, {0: want}, {0: cap, 1: cap},
                     {0: dtypes.float32, 1: dtypes.float32}, var_vals={"n": 13})


def gated(r: Renderer) -> SuiteKernel:
  """IF/ENDIF and gated loads/stores: out[i] = a[i] where a[i] > 0 (else untouched); out2[i] = a[i+3] or -1 past the end."""
  k = LinearBuilder()
  out, out2, a = k.glob(0, dtypes.float32, N), k.glob(1, dtypes.float32, N), k.glob(2, dtypes.float32, N)
  zero, three, n, m1 = k.const(dtypes.float32, 0.0), k.const(I32, 3), k.const(I32, N), k.const(dtypes.float32, -1.0)
  i = k.range(N, 0)
  v = k.load(a, i)
  cond = k.alu(Ops.CMPLT, zero, v)
  iff = k.emit(UOp(Ops.IF, dtypes.void, (cond,)))
  k.store(out, i, v)
  k.emit(UOp(Ops.ENDIF, dtypes.void, (iff,)))
  j = k.alu(Ops.ADD, i, three)
  k.store(out2, i, k.load(a, j, gate=k.alu(Ops.CMPLT, j, n), alt=m1))
  k.end(i)
  x = _inputs(dtypes.float32, N, 7)
  want = np.where(x > 0, x, 0).astype(np.float32)
  want2 = np.concatenate([x[3:], np.full(3, -1, np.float32)])
  return SuiteKernel("gated", k.linear, {0: np.zeros(N, np.float32), 2: x}, {0: want, 1: want2}, {0: N, 1: N, 2: N},
                     {i: dtypes.float32 for i in range(3)})


def global_ids(r: Renderer) -> SuiteKernel:
  """A launch over workgroups (gidx0 × gidx1) with a gated tail: out[y*W + x] = a[...] + y."""
  w, h = 10, 3
  k = LinearBuilder()
  out, a = k.glob(0, dtypes.int32, w * h), k.glob(1, dtypes.int32, w * h)
  gx = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, w),), "gidx0"))
  gy = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, h),), "gidx1"))
  idx = k.alu(Ops.ADD, k.alu(Ops.MUL, gy, k.const(I32, w)), gx)
  k.store(out, idx, k.alu(Ops.ADD, k.load(a, idx), gy))
  x = _inputs(dtypes.int32, w * h, 8)
  return SuiteKernel("global_ids", k.linear, {1: x}, {0: x + np.repeat(np.arange(h, dtype=np.int32), w)}, {0: w * h, 1: w * h},
                     {0: I32, 1: I32})


def workgroup(r: Renderer) -> SuiteKernel:
  """gidx × lidx launch, 4 workgroups of 8 threads, tail gated: out[i] = a[i] * 3 for i < 29."""
  groups, lsz, n = 4, 8, 29
  k = LinearBuilder()
  out, a = k.glob(0, dtypes.float32, groups * lsz), k.glob(1, dtypes.float32, groups * lsz)
  g = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, groups),), "gidx0"))
  li = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, lsz),), "lidx0"))
  idx = k.alu(Ops.ADD, k.alu(Ops.MUL, g, k.const(I32, lsz)), li)
  ok = k.alu(Ops.CMPLT, idx, k.const(I32, n))
  k.store(out, idx, k.alu(Ops.MUL, k.load(a, idx, gate=ok, alt=k.const(dtypes.float32, 0.0)), k.const(dtypes.float32, 3.0)), gate=ok)
  x = _inputs(dtypes.float32, groups * lsz, 9)
  want = np.zeros(groups * lsz, np.float32)
  want[:n] = x[:n] * 3
  return SuiteKernel("workgroup", k.linear, {0: np.zeros(groups * lsz, np.float32), 1: x}, {0: want}, {0: groups * lsz, 1: groups * lsz},
                     {0: dtypes.float32, 1: dtypes.float32}, frozenset({"locals"}), rtol=1e-6)


def shared_reduce(r: Renderer) -> SuiteKernel:
  """A workgroup sum through shared memory and barriers: each of 3 groups of 16 threads sums 16 values."""
  groups, lsz = 3, 16
  k = LinearBuilder()
  out, a = k.glob(0, dtypes.float32, groups), k.glob(1, dtypes.float32, groups * lsz)
  smem = k.emit(UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(lsz, AddrSpace.LOCAL), (), "smem"))
  g = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, groups),), "gidx0"))
  li = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, lsz),), "lidx0"))
  k.store(smem, li, k.load(a, k.alu(Ops.ADD, k.alu(Ops.MUL, g, k.const(I32, lsz)), li)))
  k.emit(UOp(Ops.BARRIER, dtypes.void, ()))
  first = k.alu(Ops.CMPEQ, li, k.const(I32, 0))
  iff = k.emit(UOp(Ops.IF, dtypes.void, (first,)))
  acc = k.emit(UOp(Ops.DEFINE_REG, dtypes.float32.ptr(1, AddrSpace.REG), (), 0))
  c0 = k.const(I32, 0)
  k.store(acc, c0, k.const(dtypes.float32, 0.0))
  j = k.range(lsz, 1)
  k.store(acc, c0, k.alu(Ops.ADD, k.load(acc, c0), k.load(smem, j)))
  k.store(out, g, k.load(acc, c0, after=k.end(j)))
  k.emit(UOp(Ops.ENDIF, dtypes.void, (iff,)))
  x = _inputs(dtypes.float32, groups * lsz, 10)
  return SuiteKernel("shared_reduce", k.linear, {1: x}, {0: x.reshape(groups, lsz).sum(1)}, {0: groups, 1: groups * lsz},
                     {0: dtypes.float32, 1: dtypes.float32}, frozenset({"locals", "shared"}), rtol=1e-5, atol=1e-5)


def vectors(r: Renderer) -> SuiteKernel:
  """VECTORIZE four loads, one float4 multiply-add, GEP the lanes back out (a reversed store)."""
  n = 8
  k = LinearBuilder()
  out, a = k.glob(0, dtypes.float32, n * 4), k.glob(1, dtypes.float32, n * 4)
  four = k.const(I32, 4)
  scale = k.emit(UOp.const(dtypes.float32.vec(4), (1.0, 2.0, 3.0, 4.0)))
  i = k.range(n, 0)
  base = k.alu(Ops.MUL, i, four)
  lanes = [k.load(a, k.alu(Ops.ADD, base, k.const(I32, j))) for j in range(4)]
  v = k.emit(UOp(Ops.VECTORIZE, dtypes.float32.vec(4), tuple(lanes)))
  m = k.alu(Ops.MUL, v, scale)
  for j in range(4): k.store(out, k.alu(Ops.ADD, base, k.const(I32, 3 - j)), k.emit(m.gep(j)))
  k.end(i)
  x = _inputs(dtypes.float32, n * 4, 11)
  want = (x.reshape(n, 4) * np.array([1, 2, 3, 4], np.float32))[:, ::-1].reshape(-1)
  return SuiteKernel("vectors", k.linear, {1: x}, {0: want}, {0: n * 4, 1: n * 4}, {0: dtypes.float32, 1: dtypes.float32}, rtol=1e-6)


def where_select(r: Renderer) -> SuiteKernel:
  k = LinearBuilder()
  out, a, b = k.glob(0, dtypes.float32, N), k.glob(1, dtypes.float32, N), k.glob(2, dtypes.float32, N)
  i = k.range(N, 0)
  va, vb = k.load(a, i), k.load(b, i)
  k.store(out, i, k.emit(UOp(Ops.WHERE, dtypes.float32, (k.alu(Ops.CMPLT, va, vb), va, vb))))
  k.end(i)
  x, y = _inputs(dtypes.float32, N, 12), _inputs(dtypes.float32, N, 13)
  return SuiteKernel("where_select", k.linear, {1: x, 2: y}, {0: np.minimum(x, y)}, {0: N, 1: N, 2: N}, {i: dtypes.float32 for i in range(3)})


def threefry(r: Renderer) -> SuiteKernel:
  """The counter-based RNG: out0[i], out1[i] = the high and low words of Threefry-2x32 of counter (i, 7) under a key, as
  uint32 (THREEFRY, decomposed to 32-bit integer ops by the codegen), against an independent numpy implementation."""
  n, key = 16, 0x1234_5678_9ABC_DEF0
  k = LinearBuilder()
  hi, lo = k.glob(0, dtypes.uint32, n), k.glob(1, dtypes.uint32, n)
  seven = k.const(dtypes.uint32, 7)
  i = k.range(n, 0)
  ctr = k.emit(UOp(Ops.CAST, dtypes.uint32, (i,)))
  for buf, word in ((hi, 1), (lo, 0)): k.store(buf, i, k.emit(UOp(Ops.THREEFRY, dtypes.uint32, (ctr, seven), (key, word))))
  k.end(i)
  want = _np_threefry(np.arange(n, dtype=np.uint64) | np.uint64(7 << 32), key)
  return SuiteKernel("threefry", k.linear, {}, {0: (want >> np.uint64(32)).astype(np.uint32), 1: (want & np.uint64(0xFFFFFFFF)).astype(np.uint32)},
                     {0: n, 1: n}, {0: dtypes.uint32, 1: dtypes.uint32})


def _np_threefry(x: np.ndarray, key: int) -> np.ndarray:
  """Threefry-2x32, 20 rounds (Salmon et al., SC'11), vectorized; counter words = low/high halves of x."""
  m = np.uint64(0xFFFFFFFF)
  x0, x1 = x & m, x >> np.uint64(32)
  k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64(key >> 32)
  ks = [k0, k1, np.uint64(0x1BD11BDA) ^ k0 ^ k1]
  rots = [(13, 15, 26, 6), (17, 29, 16, 24)]
  x0, x1 = (x0 + ks[0]) & m, (x1 + ks[1]) & m
  for blk in range(5):
    for rot in rots[blk % 2]:
      x0 = (x0 + x1) & m
      x1 = ((x1 << np.uint64(rot)) | (x1 >> np.uint64(32 - rot))) & m
      x1 ^= x0
    x0 = (x0 + ks[(blk + 1) % 3]) & m
    x1 = (x1 + ks[(blk + 2) % 3] + np.uint64(blk + 1)) & m
  return (x1 << np.uint64(32)) | x0


def tensor_core(tc: TensorCore) -> Callable[[Renderer], SuiteKernel]:
  """One WMMA of the device's tensor core: every lane loads its A/B/C elements by the layout, D = A @ B + C is stored
  back by the C layout. Checks that the device (or its emulation) and the shared layout description agree. A one-thread
  instruction (a CPU's: threads=1) runs without a workgroup."""
  def build(r: Renderer) -> SuiteKernel:
    n, m, kk = tc.dims  # A is m×kk, B is kk×n, C and D are m×n (row-major here)
    k = LinearBuilder()
    d, a, b, c = (k.glob(0, tc.dtype_out, m * n), k.glob(1, tc.dtype_in, m * kk), k.glob(2, tc.dtype_b, kk * n), k.glob(3, tc.dtype_out, m * n))
    lane = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, tc.threads),), "lidx0")) if tc.threads > 1 else k.const(I32, 0)

    def frag(buf: UOp, layout: Any, cols: int, dt: DType) -> UOp:
      vals = []
      for e in range(len(layout[0])):
        # the (row, col) this lane's element e holds, selected by lane with a WHERE chain over constants
        rows = [layout[ln][e][0] for ln in range(tc.threads)]
        colv = [layout[ln][e][1] for ln in range(tc.threads)]
        flat = k.const(I32, rows[0] * cols + colv[0])
        for ln in range(1, tc.threads):
          flat = k.emit(UOp(Ops.WHERE, I32, (k.alu(Ops.CMPEQ, lane, k.const(I32, ln)), k.const(I32, rows[ln] * cols + colv[ln]), flat)))
        vals.append(k.load(buf, flat))
      return k.emit(UOp(Ops.VECTORIZE, dt.vec(len(vals)), tuple(vals)))

    fa, fb, fc = frag(a, tc.a_layout, kk, tc.dtype_in), frag(b, tc.b_layout, n, tc.dtype_b), frag(c, tc.c_layout, n, tc.dtype_out)
    res = k.emit(tc.wmma(fa, fb, fc))
    for e in range(len(tc.c_layout[0])):
      flat = k.const(I32, tc.c_layout[0][e][0] * n + tc.c_layout[0][e][1])
      for ln in range(1, tc.threads):
        row, col = tc.c_layout[ln][e]
        flat = k.emit(UOp(Ops.WHERE, I32, (k.alu(Ops.CMPEQ, lane, k.const(I32, ln)), k.const(I32, row * n + col), flat)))
      k.store(d, flat, k.emit(res.gep(e)))
    rng = np.random.default_rng(14)
    def values(size: int, dt: DType) -> np.ndarray:  # integers over the dtype's range (an int TC's products are exact)
      if dtypes.is_int(dt): return rng.integers(max(dtypes.min(dt), -100), min(dtypes.max(dt), 100) + 1, size).astype(np_dtype(dt))
      return as_dtype(rng.uniform(-1, 1, size), dt)
    A, B, C = values(m * kk, tc.dtype_in), values(kk * n, tc.dtype_b), values(m * n, tc.dtype_out)
    want = (A.astype(np.float64).reshape(m, kk) @ B.astype(np.float64).reshape(kk, n) + C.astype(np.float64).reshape(m, n)).reshape(-1)
    exact = dtypes.is_int(tc.dtype_out)
    return SuiteKernel(f"wmma_{tc.name}", k.linear, {1: A, 2: B, 3: C}, {0: as_dtype(want, tc.dtype_out)},
                       {0: m * n, 1: m * kk, 2: kk * n, 3: m * n}, {0: tc.dtype_out, 1: tc.dtype_in, 2: tc.dtype_b, 3: tc.dtype_out},
                       frozenset({"tensor_cores"} | ({"locals"} if tc.threads > 1 else set())) | _dtype_needs(tc.dtype_in),
                       rtol=0 if exact else 1e-2, atol=0 if exact else 1e-2)
  return build


def _dtype_needs(dt: DType) -> frozenset[str]:
  return frozenset({"float16"} if dt is dtypes.float16 else {"bfloat16"} if dt is dtypes.bfloat16 else {"float64"} if dt is dtypes.float64
                   else {"int64"} if dt in (dtypes.int64, dtypes.uint64) else ())


def _binary_ops(dt: DType) -> tuple[Ops, ...]:
  common = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)
  if dt is dtypes.bool: return (Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPEQ)
  if dtypes.is_float(dt): return common + (Ops.FDIV,)
  return common + (Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR)


def suite() -> dict[str, Callable[[Renderer], SuiteKernel]]:
  """Every kernel of the suite by test id. Tensor-core kernels are added per device by `device_kernels`."""
  out: dict[str, Callable[[Renderer], SuiteKernel]] = {}
  for dt in dtypes.all:
    for op in _binary_ops(dt):
      if op is Ops.SUB and not dtypes.is_float(dt): continue  # ints subtract as a + b*-1 (docs/ir.md)
      out[f"ew-{op.name.lower()}-{dname(dt)}"] = elementwise(op, dt)
  for dt in dtypes.floats:
    for op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC): out[f"un-{op.name.lower()}-{dname(dt)}"] = unary(op, dt)
  pairs = [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float32, dtypes.uint8), (dtypes.int8, dtypes.int32),
           (dtypes.int32, dtypes.int8), (dtypes.float32, dtypes.bool), (dtypes.bool, dtypes.float32), (dtypes.float32, dtypes.float16),
           (dtypes.float16, dtypes.float32), (dtypes.float32, dtypes.bfloat16), (dtypes.bfloat16, dtypes.float32), (dtypes.float64, dtypes.float32),
           (dtypes.int64, dtypes.float64), (dtypes.uint32, dtypes.float32)]
  for s, d in pairs: out[f"cast-{dname(s)}-{dname(d)}"] = cast(s, d)
  for fn in (reduce_rows, symbolic_size, gated, global_ids, workgroup, shared_reduce, vectors, where_select, threefry, flash_attention,
             flash_attention_backward_q, flash_attention_backward_q_stats, flash_attention_backward_kv):
    out[fn.__name__] = fn
  return out


def flash_attention(r: Renderer) -> SuiteKernel:
  """The fused online-softmax attention kernel (codegen/attention.py) as the codegen builds it for this renderer: 2
  heads, 8 queries, 16 keys, a per-head additive mask with -inf entries; out (slot 0) and the log-sum-exp (slot 1)."""
  from plugrad.codegen.attention import AttentionShape, attention_linear
  H, L, S, E = 2, 8, 16, 8
  sh = AttentionShape(1, H, L, S, E, E, dtypes.float32, (False, True, False), False, 1 / np.sqrt(E))
  rng = np.random.default_rng(7)
  q, k, v = (rng.standard_normal((H, n, E)).astype(np.float32) for n in (L, S, S))
  mask = rng.standard_normal((H, S)).astype(np.float32)
  mask[:, 3::5] = -np.inf
  s = np.einsum("hle,hse->hls", q.astype(np.float64), k.astype(np.float64)) * sh.scale + mask[:, None, :]
  mx = s.max(-1, keepdims=True)
  p = np.exp(s - mx)
  out, lse = (p / p.sum(-1, keepdims=True)) @ v, (mx[..., 0] + np.log(p.sum(-1)))
  f32 = dtypes.float32
  return SuiteKernel(sh.name, [], {2: q.ravel(), 3: np.swapaxes(k, 1, 2).ravel(), 4: v.ravel(), 5: mask.ravel()},
                     {0: out.ravel().astype(np.float32), 1: lse.ravel().astype(np.float32)},
                     {0: H * L * E, 1: H * L, 2: H * L * E, 3: H * S * E, 4: H * S * E, 5: H * S}, dict.fromkeys(range(6), f32),
                     rtol=1e-4, atol=1e-5, build=lambda device, rr: attention_linear(sh, rr, device))


def atomic_add(dt: DType) -> Callable[[Renderer], SuiteKernel]:
  def build(r: Renderer) -> SuiteKernel:
    """Atomic adds that collide: 123 positions add a[i] into out[i % 5] (a STORE with arg Ops.ADD) in parallel: 4
    workgroups of 32 threads with a gated tail where the device has workgroups, else one loop the CPU splits among its
    threads. Small integers, so any order of the adds gives the exact sums."""
    n, slots, groups, lsz = 123, 5, 4, 32
    k = LinearBuilder()
    out, a = k.glob(0, dt, slots), k.glob(1, dt, groups * lsz)
    if r.has_local:
      g = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, groups),), "gidx0"))
      li = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, lsz),), "lidx0"))
      i, loop = k.alu(Ops.ADD, k.alu(Ops.MUL, g, k.const(I32, lsz)), li), None
    else: i = loop = k.range(groups * lsz, 0)
    ok = k.alu(Ops.CMPLT, i, k.const(I32, n))
    at = UOp(Ops.INDEX, out.dtype, (out, k.alu(Ops.MOD, i, k.const(I32, slots)), ok))
    k.emit(UOp(Ops.STORE, dtypes.void, (at, k.load(a, i, gate=ok)), Ops.ADD))
    if loop is not None: k.end(loop)
    x = (np.arange(groups * lsz) % 7 - (0 if dtypes.is_unsigned(dt) else 3)).astype(np_dtype(dt))
    base = np.arange(slots).astype(np_dtype(dt))
    want = base.copy()
    np.add.at(want, np.arange(n) % slots, x[:n])
    return SuiteKernel(f"atomic_add_{dname(dt)}", k.linear, {0: base, 1: x}, {0: want}, {0: slots, 1: groups * lsz}, {0: dt, 1: dt},
                       _dtype_needs(dt) | ({"locals"} if r.has_local else frozenset()))
  return build


def masked_access(r: Renderer) -> SuiteKernel:
  """Vector loads and stores gated per lane (`Renderer.masked_access`): out[p] = 2 * a[p - 1] over M = 3w + 3
  elements, w lanes at a time through one address each; the first load's lane 0 (a[-1]) and the last chunk's lanes
  past M are masked off (the load gives 0 there, the store writes nothing)."""
  w = max(2, r.vector_width)
  m, chunks = 3 * w + 3, 4
  k = LinearBuilder()
  out, a = k.glob(0, dtypes.float32, m), k.glob(1, dtypes.float32, m)
  two = k.emit(UOp.const(dtypes.float32.vec(w), 2.0))
  i = k.range(chunks, 0)
  start = k.alu(Ops.MUL, i, k.const(I32, w))
  src = k.alu(Ops.ADD, start, k.const(I32, -1))
  def lanes(at: UOp, lo: bool) -> UOp:
    gates = []
    for j in range(w):
      p = k.alu(Ops.ADD, at, k.const(I32, j))
      inside = k.alu(Ops.CMPLT, p, k.const(I32, m))
      gates.append(k.alu(Ops.AND, k.alu(Ops.CMPLT, k.const(I32, -1), p), inside) if lo else inside)
    return k.emit(UOp(Ops.VECTORIZE, dtypes.bool.vec(w), tuple(gates)))
  ld = k.emit(UOp(Ops.LOAD, dtypes.float32.vec(w), (UOp(Ops.INDEX, a.dtype, (a, src, lanes(src, True))),)))
  k.emit(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, start, lanes(start, False))), k.alu(Ops.MUL, ld, two))))
  k.end(i)
  x = _inputs(dtypes.float32, m, 17)
  want = 2 * np.concatenate([np.zeros(1, np.float32), x[:-1]])
  return SuiteKernel("masked_access", k.linear, {1: x}, {0: want}, {0: m, 1: m}, {0: dtypes.float32, 1: dtypes.float32}, rtol=1e-6)


def _attention_backward_case() -> tuple[Any, dict[str, np.ndarray]]:
  """The backward kernels' case: 2 heads, 8 queries, 16 keys, a per-head additive mask with -inf entries; the inputs and
  float64 numpy results by name (lse2 is the base-2 log-sum-exp of the scaled scores, D = rowsum(P∘dP))."""
  from plugrad.codegen.attention import AttentionShape
  H, L, S, E = 2, 8, 16, 8
  sh = AttentionShape(1, H, L, S, E, E, dtypes.float32, (False, True, False), False, 1 / np.sqrt(E))
  rng = np.random.default_rng(11)
  q, k, v, do = (rng.standard_normal((H, n, E)).astype(np.float32) for n in (L, S, S, L))
  mask = rng.standard_normal((H, S)).astype(np.float32)
  mask[:, 2::5] = -np.inf
  s = np.einsum("hle,hse->hls", q.astype(np.float64), k.astype(np.float64)) * sh.scale + mask[:, None, :]
  p = np.exp(s - s.max(-1, keepdims=True))
  lse = np.log(p.sum(-1)) + s.max(-1)
  p /= p.sum(-1, keepdims=True)
  dp = do.astype(np.float64) @ np.swapaxes(v, 1, 2)
  D = (p * dp).sum(-1)
  ds = p * (dp - D[..., None])
  return sh, {"q": q, "k": k, "v": v, "do": do, "mask": mask, "lse2": lse / np.log(2), "D": D, "dq": ds @ k * sh.scale,
              "dk": np.swapaxes(ds, 1, 2) @ q * sh.scale, "dv": np.swapaxes(p, 1, 2) @ do}


def flash_attention_backward_q(r: Renderer, stats_given: bool = False) -> SuiteKernel:
  """The fused backward's query kernel (codegen/attention_backward.py): dQ (slot 0) and, computed in its first pass,
  lse2 (1) and D (2) of one case; `stats_given`: lse2 and D are inputs (the one-pass kernel)."""
  from plugrad.codegen.attention import attention_linear
  sh, c = _attention_backward_case()
  t = np.swapaxes
  ins = {3: c["q"], 4: t(c["k"], 1, 2), 5: c["k"], 6: t(c["v"], 1, 2), 7: c["do"], 8: c["mask"]}
  outs = {0: c["dq"], 1: c["lse2"], 2: c["D"]}
  if stats_given: ins, outs = {**ins, 1: outs.pop(1), 2: outs.pop(2)}, outs
  name, kind = ("flash_attn_bwd_q", "backward_q_stats") if stats_given else ("flash_attn_bwd_q2", "backward_q")
  return SuiteKernel(sh.name.replace("flash_attn", name), [], {i: np.ascontiguousarray(x).ravel().astype(np.float32) for i, x in ins.items()},
                     {i: x.ravel().astype(np.float32) for i, x in outs.items()}, {i: x.size for i, x in {**ins, **outs}.items()},
                     dict.fromkeys(range(9), dtypes.float32), rtol=1e-4, atol=1e-5,
                     build=lambda device, rr: attention_linear(sh, rr, device, kind))


def flash_attention_backward_q_stats(r: Renderer) -> SuiteKernel: return flash_attention_backward_q(r, stats_given=True)


def flash_attention_backward_kv(r: Renderer) -> SuiteKernel:
  """The fused backward's key kernel: dK (slot 0) and dV (1) of the same case, from its lse2 and D."""
  from plugrad.codegen.attention import attention_linear
  sh, c = _attention_backward_case()
  t = np.swapaxes
  ins = {2: c["k"], 3: t(c["q"], 1, 2), 4: c["v"], 5: t(c["do"], 1, 2), 6: c["q"], 7: c["do"], 8: c["lse2"], 9: c["D"], 10: c["mask"]}
  outs = {0: c["dk"], 1: c["dv"]}
  return SuiteKernel(sh.name.replace("flash_attn", "flash_attn_bwd_kv"), [],
                     {i: np.ascontiguousarray(x).ravel().astype(np.float32) for i, x in ins.items()},
                     {i: x.ravel().astype(np.float32) for i, x in outs.items()}, {i: x.size for i, x in {**ins, **outs}.items()},
                     dict.fromkeys(range(11), dtypes.float32), rtol=1e-4, atol=1e-5,
                     build=lambda device, rr: attention_linear(sh, rr, device, "backward_kv"))


def device_kernels(renderer: Renderer) -> dict[str, Callable[[Renderer], SuiteKernel]]:
  """The kernels of what a renderer declares: its tensor cores, its atomic adds, its masked vector access."""
  return {**{f"wmma-{tc.name}": tensor_core(tc) for tc in renderer.tensor_cores},
          **{f"atomic-add-{dname(dt)}": atomic_add(dt) for dt in sorted(renderer.atomic_add, key=dname)},
          **({"masked-access": masked_access} if renderer.masked_access else {})}


# ---- helpers for a backend's own tests (hand-built kernels beyond the suite)

def matmul_ast(m: int, n: int, k: int, dtype_in: DType, dtype_out: DType, name: str = "tc_mm", dtype_in_b: DType | None = None) -> UOp:
  """The kernel AST of out (m×n, `dtype_out`) = a (m×k) @ b (k×n), both `dtype_in` (b: `dtype_in_b` when given),
  products formed and accumulated in `dtype_out`: the shape the optimizer's TC action maps onto a tensor core of that
  dtype pair (`get_program(ast, renderer, opts=[Opt(OptOps.TC, 0)])`), so a backend's tests can check what its tensor
  cores render and compile to."""
  db = dtype_in if dtype_in_b is None else dtype_in_b
  out, a, b = (UOp(Ops.DEFINE_GLOBAL, dtype_out.ptr(m * n), (), 0), UOp(Ops.DEFINE_GLOBAL, dtype_in.ptr(m * k), (), 1),
               UOp(Ops.DEFINE_GLOBAL, db.ptr(k * n), (), 2))
  i, j, r = UOp.range(m, 0), UOp.range(n, 1), UOp.range(k, 2, AxisType.REDUCE)
  la, lb = a.index(i * k + r).load(), b.index(r * n + j).load()
  prod = la.cast(dtype_out) * lb.cast(dtype_out) if dtype_in is not dtype_out or db is not dtype_out else la * lb
  red = UOp(Ops.REDUCE, dtype_out, (prod, r), Ops.ADD)
  st = out.index(i * n + j).store(red)
  return UOp(Ops.END, dtypes.void, (st, i, j)).sink(arg=KernelInfo(name))


def op_kernel(op: Ops, src: tuple[DType, ...], out: DType, n: int) -> list[UOp]:
  """The LINEAR uops of out[i] = op(a[i], b[i], ...) for ALU ops; for CAST and BITCAST, out[i] = op(a[i])."""
  k = LinearBuilder()
  o = k.glob(0, out, n)
  ins = [k.glob(j + 1, dt, n) for j, dt in enumerate(src)]
  i = k.range(n, 0)
  vals = [k.load(b, i) for b in ins]
  k.store(o, i, k.emit(UOp(op, out, tuple(vals))))
  k.end(i)
  return k.linear


def linear_program(name: str, uops: list[UOp], device: str) -> ProgramUOp:
  """Hand-built LINEAR `uops` as `device`'s codegen would hand them over: with the shared decompositions its renderer asks for."""
  return make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo(name)), device).with_linear(decompose_linear(uops, Device[device].renderer))


def run_linear(p: ProgramUOp, dtypes_: list[DType], inputs: list[np.ndarray], renderer: Renderer | None = None,
               var_vals: dict[str, int] | None = None, out_size: int | None = None) -> list[bytes]:
  """Run `p` on its device (rendered by `renderer` when given): slot 0 is a zeroed output of `out_size` elements (default:
  the size of the first input), `inputs` fill slots 1, 2, ... (bfloat16 given as float32, its low half dropped).
  Returns the bytes of every buffer afterwards."""
  def host(x: np.ndarray, dt: DType) -> np.ndarray:
    if dt is dtypes.bfloat16: return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.ascontiguousarray(x, dtypes.to_numpy(dt))
  if renderer is not None: p = p.with_source(renderer.render(p))
  n = out_size if out_size is not None else len(inputs[0])
  bufs = [Buffer(p.device, n, dtypes_[0]).copyin(np.zeros(n * dtypes_[0].itemsize, np.uint8).data)]
  bufs += [Buffer(p.device, len(x), dt).copyin(host(x, dt).data.cast("B")) for x, dt in zip(inputs, dtypes_[1:])]
  ProgramRunner(p)(bufs, var_vals or {}, wait=True)
  return [bytes(b.as_buffer()) for b in bufs]
