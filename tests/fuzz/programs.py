"""Random programs for the composition fuzzer: a seed gives a list of steps (elementwise, broadcast, reduction, pad,
shrink, flip, permute, reshape, expand, matmul, where, cast), each reading earlier values, so that one value feeding
several steps is a shared subexpression. The same program is evaluated by plugrad (lazy Tensors on one device,
realized together) and by numpy in float64 (int64 for integer values), the reference.

Comparisons and float -> int casts are discontinuous: where the float64 operands are within rounding distance of the
decision, float32 may decide the other way, so the reference carries a mask of such elements through every later step
and they are not compared (`Value.unsure`)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrad import Tensor, dtypes

MAX_NUMEL = 384  # small: every kernel also runs on the PYTHON interpreter
UNSURE = 1e-4  # relative distance to a comparison's or a cast's threshold under which float32 may decide otherwise

FLOAT_UNARY: dict[str, tuple[Callable[[Any], Any], Callable[[Tensor], Tensor]]] = {
  "relu": (lambda x: np.maximum(x, 0), lambda t: t.relu()),
  "abs": (np.abs, lambda t: t.abs()),
  "neg": (np.negative, lambda t: -t),
  "tanh": (np.tanh, lambda t: t.tanh()),
  "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), lambda t: t.sigmoid()),
  "square": (np.square, lambda t: t * t),
  "sqrt1": (lambda x: np.sqrt(np.abs(x) + 1), lambda t: (t.abs() + 1).sqrt()),  # a pad's fill of 0 becomes 1
  "log1": (lambda x: np.log(np.abs(x) + 1), lambda t: (t.abs() + 1).log()),
  "expneg": (lambda x: np.exp(-np.abs(x)), lambda t: (-t.abs()).exp()),
  "recip1": (lambda x: 1 / (1 + x * x), lambda t: (t * t + 1).reciprocal()),
}
BINARY: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Tensor, Any], Tensor]]] = {
  "add": (np.add, lambda a, b: a + b),
  "sub": (np.subtract, lambda a, b: a - b),
  "mul": (np.multiply, lambda a, b: a * b),
  "maximum": (np.maximum, lambda a, b: a.maximum(b)),
}
NP_REDUCE: dict[str, Callable[..., Any]] = {"sum": np.sum, "max": np.max, "mean": np.mean}
INT_BINARY = ("add", "sub", "maximum")  # no products of integers: int32 would wrap where the int64 reference does not
KINDS = ("input", "unary", "binary", "const", "sum", "max", "mean", "pad", "shrink", "flip", "permute", "reshape", "expand",
         "matmul", "where", "cast")


KIND_CHOICES = ["unary", "unary", "binary", "binary", "const", "sum", "sum", "max", "mean", "pad", "pad", "shrink", "flip", "permute",
                "reshape", "expand", "matmul", "where", "cast"]


class FuzzError(ValueError):
  """A fuzzer setting or program is malformed (the message names what)."""


@dataclass(frozen=True)
class Step:
  kind: str
  args: tuple[int, ...] = ()
  param: Any = None


@dataclass
class Program:
  seed: int
  inputs: list[np.ndarray] = field(default_factory=list)
  steps: list[Step] = field(default_factory=list)
  outputs: tuple[int, ...] = ()

  def describe(self) -> str:
    lines = [f"program seed={self.seed}: inputs {[a.shape for a in self.inputs]}"]
    lines += [f"  v{i} = {s.kind}{list(s.args)} {s.param!r}" for i, s in enumerate(self.steps)]
    return "\n".join(lines + [f"  outputs {list(self.outputs)}"])


@dataclass
class Value:
  """A reference value: float64 (or int64) data and where it cannot be compared."""
  data: np.ndarray
  unsure: np.ndarray

  @property
  def is_int(self) -> bool: return self.data.dtype.kind == "i"


# ---- generation

def _shape(rng: np.random.Generator) -> tuple[int, ...]:
  while True:
    shape = tuple(int(d) for d in rng.integers(1, 7, int(rng.integers(1, 5))))
    if math.prod(shape) <= MAX_NUMEL // 2: return shape


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
  return all(x == y or x == 1 or y == 1 for x, y in zip(a[::-1], b[::-1]))


def _factor(n: int, rng: np.random.Generator) -> tuple[int, ...]:
  """A random shape of n elements (rank 1-4)."""
  dims: list[int] = []
  while n > 1 and len(dims) < 3:
    divs = [d for d in range(2, n + 1) if n % d == 0]
    d = int(rng.choice(divs))
    dims.append(d)
    n //= d
  if n > 1: dims.append(n)
  if rng.random() < 0.3: dims.insert(int(rng.integers(0, len(dims) + 1)), 1)
  return tuple(int(x) for x in rng.permutation(np.array(dims, dtype=np.int64))) if dims else (1,)


def generate(seed: int, steps: int | None = None) -> Program:
  """The program of `seed`: 4-10 steps over 1-3 float32 inputs, with 1-3 outputs realized together."""
  rng = np.random.default_rng([32, seed])
  prog = Program(seed)
  shapes: list[tuple[int, ...]] = []
  ints: list[bool] = []

  def add(step: Step, shape: tuple[int, ...], is_int: bool) -> int:
    prog.steps.append(step)
    shapes.append(shape)
    ints.append(is_int)
    return len(shapes) - 1

  def new_input(shape: tuple[int, ...]) -> int:
    prog.inputs.append(rng.standard_normal(shape).astype(np.float32))
    return add(Step("input", (), len(prog.inputs) - 1), shape, False)

  for _ in range(int(rng.integers(1, 3))): new_input(_shape(rng))
  n_steps = int(rng.integers(4, 11)) if steps is None else steps
  while len(prog.steps) - len(prog.inputs) < n_steps:
    # recent values more often: deeper compositions; any earlier value may be read again (a shared subexpression)
    i = int(len(shapes) - 1 - min(int(rng.geometric(0.45)) - 1, len(shapes) - 1))
    kind = str(rng.choice(KIND_CHOICES))
    # a pad is often followed by a function of it, and that by a reduction: a fill made non-zero, then reduced, is
    # where the optimizer has gone wrong before (issue 32)
    last = prog.steps[-1].kind
    if last == "pad" and rng.random() < 0.6: i, kind = len(shapes) - 1, str(rng.choice(["unary", "unary", "const"]))
    elif last in ("unary", "const") and len(prog.steps) > 1 and prog.steps[-2].kind == "pad" and rng.random() < 0.6:
      i, kind = len(shapes) - 1, str(rng.choice(["sum", "sum", "max", "mean"]))
    sh, is_int = shapes[i], ints[i]
    if kind == "unary" and not is_int:
      add(Step("unary", (i,), str(rng.choice(list(FLOAT_UNARY)))), sh, False)
    elif kind == "binary":
      ok = [j for j in range(len(shapes)) if ints[j] == is_int and _broadcasts(sh, shapes[j])
            and math.prod(np.broadcast_shapes(sh, shapes[j])) <= MAX_NUMEL]
      j = int(rng.choice(ok))  # i itself is always there
      out = tuple(int(d) for d in np.broadcast_shapes(sh, shapes[j]))
      op = str(rng.choice(INT_BINARY if is_int else list(BINARY)))
      add(Step("binary", (i, j) if rng.random() < 0.5 else (j, i), op), out, is_int)
    elif kind == "const":
      c = int(rng.integers(-3, 4)) if is_int else float(np.float32(rng.choice([0.5, -1.5, 2.0, 3.25])))
      add(Step("const", (i,), (str(rng.choice(["add", "mul"] if not is_int else ["add", "sub"])), c)), sh, is_int)
    elif kind in ("sum", "max", "mean") and sh and not (kind == "mean" and is_int):
      axes = tuple(int(a) for a in np.flatnonzero(rng.random(len(sh)) < 0.5)) or (int(rng.integers(0, len(sh))),)
      keep = bool(rng.random() < 0.5)
      out = tuple(1 if a in axes else d for a, d in enumerate(sh) if keep or a not in axes) or ()
      add(Step(kind, (i,), (axes, keep)), out if out else (), is_int)
    elif kind == "pad" and sh:
      pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in sh)
      out = tuple(d + a + b for d, (a, b) in zip(sh, pads))
      if math.prod(out) > MAX_NUMEL: continue
      fill = 0 if is_int or rng.random() < 0.7 else float(rng.choice([1.0, -2.5]))
      add(Step("pad", (i,), (pads, fill)), out, is_int)
    elif kind == "shrink" and sh:
      bounds = []
      for d in sh:
        a = int(rng.integers(0, d))
        bounds.append((a, int(rng.integers(a + 1, d + 1))))
      add(Step("shrink", (i,), tuple(bounds)), tuple(b - a for a, b in bounds), is_int)
    elif kind == "flip" and sh:
      axes = tuple(int(a) for a in np.flatnonzero(rng.random(len(sh)) < 0.5)) or (0,)
      add(Step("flip", (i,), axes), sh, is_int)
    elif kind == "permute" and len(sh) >= 2:
      order = tuple(int(a) for a in rng.permutation(len(sh)))
      add(Step("permute", (i,), order), tuple(sh[a] for a in order), is_int)
    elif kind == "reshape":
      out = _factor(max(math.prod(sh), 1), rng)
      add(Step("reshape", (i,), out), out, is_int)
    elif kind == "expand" and sh:
      # a size-1 axis inserted (or one already there) grows to 2-4
      base = list(sh)
      if 1 not in base: base.insert(int(rng.integers(0, len(base) + 1)), 1)
      out = tuple(int(rng.integers(2, 5)) if d == 1 else d for d in base)
      if math.prod(out) > MAX_NUMEL: continue
      add(Step("expand", (i,), (tuple(base), out)), out, is_int)
    elif kind == "matmul" and sh and not is_int:
      k, n = sh[-1], int(rng.integers(1, 6))
      w = new_input((k, n))
      out = (*sh[:-1], n)
      if math.prod(out) > MAX_NUMEL: continue
      add(Step("matmul", (i, w)), out, False)
    elif kind == "where":
      ok = [j for j in range(len(shapes)) if ints[j] == is_int and _broadcasts(sh, shapes[j])
            and math.prod(np.broadcast_shapes(sh, shapes[j])) <= MAX_NUMEL]
      j = int(rng.choice(ok))
      both = np.broadcast_shapes(sh, shapes[j])
      m = int(rng.choice([m for m in ok if _broadcasts(both, shapes[m]) and math.prod(np.broadcast_shapes(both, shapes[m])) <= MAX_NUMEL]))
      out = tuple(int(d) for d in np.broadcast_shapes(both, shapes[m]))
      add(Step("where", (i, j, m), float(rng.choice([0.0, 0.5, -0.25])) if not is_int else 0), out, is_int)
    elif kind == "cast":
      add(Step("cast", (i,), "float32" if is_int else "int32"), sh, not is_int)
  # the last value, and up to two others that are not inputs: computed in the same schedule as the last one
  pool = [j for j in range(len(prog.inputs), len(shapes) - 1) if prog.steps[j].kind != "input"]
  extra = [int(j) for j in rng.choice(pool, size=min(len(pool), int(rng.integers(0, 3))), replace=False)] if pool else []
  prog.outputs = tuple(sorted(set(extra))) + (len(shapes) - 1,)
  return prog


# ---- evaluation

def _unsure_near(x: np.ndarray, threshold: np.ndarray | float) -> np.ndarray:
  return np.abs(x - threshold) <= UNSURE * (np.abs(x) + np.abs(threshold) + 1e-3)


def reference(prog: Program) -> list[Value]:
  """Every step's value in float64/int64, with the elements float32 may compute differently masked (see module doc)."""
  vals: list[Value] = []
  for s in prog.steps:
    if s.kind == "input":
      d = prog.inputs[s.param].astype(np.float64)
      vals.append(Value(d, np.zeros(d.shape, bool)))
      continue
    a = vals[s.args[0]]
    if s.kind == "unary": v = Value(FLOAT_UNARY[s.param][0](a.data), a.unsure)
    elif s.kind == "binary":
      b = vals[s.args[1]]
      v = Value(BINARY[s.param][0](a.data, b.data), a.unsure | b.unsure)
    elif s.kind == "const":
      op, c = s.param
      d = a.data + c if op == "add" else a.data - c if op == "sub" else a.data * c
      v = Value(d, a.unsure)
    elif s.kind in ("sum", "max", "mean"):
      axes, keep = s.param
      v = Value(np.asarray(NP_REDUCE[s.kind](a.data, axis=axes, keepdims=keep)), np.asarray(np.any(a.unsure, axis=axes, keepdims=keep)))
    elif s.kind == "pad":
      pads, fill = s.param
      v = Value(np.pad(a.data, pads, constant_values=fill), np.pad(a.unsure, pads, constant_values=False))
    elif s.kind == "shrink":
      sl = tuple(slice(x, y) for x, y in s.param)
      v = Value(a.data[sl], a.unsure[sl])
    elif s.kind == "flip": v = Value(np.flip(a.data, s.param), np.flip(a.unsure, s.param))
    elif s.kind == "permute": v = Value(np.transpose(a.data, s.param), np.transpose(a.unsure, s.param))
    elif s.kind == "reshape": v = Value(a.data.reshape(s.param), a.unsure.reshape(s.param))
    elif s.kind == "expand":
      base, out = s.param
      v = Value(np.broadcast_to(a.data.reshape(base), out), np.broadcast_to(a.unsure.reshape(base), out))
    elif s.kind == "matmul":
      b = vals[s.args[1]]
      unsure = np.broadcast_to(a.unsure.any(-1, keepdims=True), a.data.shape[:-1] + (b.data.shape[1],)) | b.unsure.any(0)
      v = Value(a.data @ b.data, unsure)
    elif s.kind == "where":
      b, c = vals[s.args[1]], vals[s.args[2]]
      thr = 0 if a.is_int else s.param
      cond = a.data > thr
      near = np.zeros(a.data.shape, bool) if a.is_int else _unsure_near(a.data, thr)
      v = Value(np.where(cond, b.data, c.data), a.unsure | near | np.where(cond, b.unsure, c.unsure))
    elif s.kind == "cast":
      if s.param == "float32": v = Value(a.data.astype(np.float64), a.unsure)
      else:  # truncation toward zero: unsure next to an integer (float32 may land on either side)
        near = _unsure_near(a.data, np.round(a.data))
        v = Value(np.trunc(a.data).astype(np.int64), a.unsure | near)
    else: raise FuzzError(f"unknown step kind {s.kind!r} in program seed={prog.seed}")
    vals.append(Value(np.array(v.data), np.array(v.unsure)))  # contiguous copies (ascontiguousarray makes 0-d 1-d)
  return vals


def build(prog: Program, device: str) -> list[Tensor]:
  """The program's values as lazy plugrad Tensors on `device` (nothing is realized)."""
  vals: list[Tensor] = []
  for s in prog.steps:
    if s.kind == "input":
      vals.append(Tensor(prog.inputs[s.param], device=device))
      continue
    a = vals[s.args[0]]
    if s.kind == "unary": t = FLOAT_UNARY[s.param][1](a)
    elif s.kind == "binary": t = BINARY[s.param][1](a, vals[s.args[1]])
    elif s.kind == "const":
      op, c = s.param
      t = a + c if op == "add" else a - c if op == "sub" else a * c
    elif s.kind in ("sum", "max", "mean"):
      axes, keep = s.param
      t = getattr(a, s.kind)(axes, keepdim=keep)
    elif s.kind == "pad":
      pads, fill = s.param
      t = a.pad(pads, value=fill)
    elif s.kind == "shrink": t = a.shrink(tuple(s.param))
    elif s.kind == "flip": t = a.flip(s.param)
    elif s.kind == "permute": t = a.permute(s.param)
    elif s.kind == "reshape": t = a.reshape(s.param)
    elif s.kind == "expand": t = a.reshape(s.param[0]).expand(s.param[1])
    elif s.kind == "matmul": t = a @ vals[s.args[1]]
    elif s.kind == "where":
      thr = 0 if s.param == 0 else s.param
      t = (a > thr).where(vals[s.args[1]], vals[s.args[2]])
    elif s.kind == "cast": t = a.cast(dtypes.float32 if s.param == "float32" else dtypes.int32)
    else: raise FuzzError(f"unknown step kind {s.kind!r} in program seed={prog.seed}")
    vals.append(t)
  return vals


RTOL = 2e-4  # float32 against float64 through a few sums and products of values around 1


def mismatch(got: np.ndarray, want: Value, what: str) -> str | None:
  """None when `got` matches the reference (masked elements skipped), else a one-line description of the worst element."""
  if got.shape != want.data.shape: return f"{what}: shape {got.shape}, expected {want.data.shape}"
  if want.is_int != (got.dtype.kind in "iu"): return f"{what}: dtype {got.dtype}, expected {'an integer' if want.is_int else 'a float'}"
  ok = want.unsure.copy()
  g, w = got.astype(np.float64), want.data.astype(np.float64)
  if want.is_int: ok |= g == w
  else:
    scale = max(1.0, float(np.mean(np.abs(w)))) if w.size else 1.0
    ok |= np.abs(g - w) <= RTOL * (np.abs(w) + scale)
  if ok.all(): return None
  bad = np.argwhere(~ok)
  idx = tuple(int(x) for x in bad[0])
  return f"{what}: {len(bad)} of {got.size} elements differ, first at {idx}: got {g[idx]!r}, expected {w[idx]!r}"
