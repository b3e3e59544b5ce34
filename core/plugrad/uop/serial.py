"""A UOp graph as bytes and back: a flat, topologically ordered list (no recursion: deep graphs pickle fine). Used by
process replay (kernel ASTs) and the persistent program cache (PROGRAM UOps); load only bytes you trust (pickle)."""
from __future__ import annotations

import pickle

from plugrad.uop.ops import UOp


def dumps_uop(root: UOp) -> bytes:
  topo = list(root.toposort)
  idx = {u: i for i, u in enumerate(topo)}
  return pickle.dumps([(u.op, u.dtype, tuple(idx[s] for s in u.src), u.arg) for u in topo], protocol=4)


def loads_uop(blob: bytes) -> UOp:
  built: list[UOp] = []
  for op, dtype, src, arg in pickle.loads(blob): built.append(UOp(op, dtype, tuple(built[i] for i in src), arg))
  return built[-1]
