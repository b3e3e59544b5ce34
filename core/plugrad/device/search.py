"""The device side of BEAM search (codegen/opt/search.py): compile candidates in worker processes, time them with real
buffers, and compare a candidate's outputs with the unoptimized kernel's. The engine passes `DeviceTimer` to
`get_program(..., timer=)`, so the codegen never imports upward and nothing is registered by import."""
from __future__ import annotations

import multiprocessing
import os
from typing import Any

import numpy as np

from plugrad.device.buffer import Buffer
from plugrad.dtype import dtypes
from plugrad.helpers import getenv
from plugrad.renderer.base import Renderer
from plugrad.uop.program import ProgramUOp

_compiler: list[Any] = []  # the compiler the forked workers inherit


def _compile(src: str) -> bytes | None:
  try: return _compiler[0].compile(src)
  except Exception: return None


class DeviceTimer:
  """Times candidates on `renderer.device` (workers: BEAM_WORKERS, default the cores this process may use)."""
  def __init__(self, renderer: Renderer):
    from plugrad.device.registry import Device
    self.dev = Device[renderer.device]
    self.bufs: dict[tuple, list[Buffer]] = {}
    self.data: list[np.ndarray] = []  # what `bufs` held when made: a kernel's outputs start from it for every check
    self.ref: tuple[ProgramUOp, list[np.ndarray]] | None = None  # the reference's outputs on those inputs

  def compile_all(self, programs: list[ProgramUOp], timeout: float) -> list[bytes | None]:
    if not programs: return []
    comp = self.dev.compiler
    if len(programs) == 1 or "fork" not in multiprocessing.get_all_start_methods():
      return [self._one(comp, p.source) for p in programs]
    _compiler[:] = [comp]
    n = getenv("BEAM_WORKERS", 0, minimum=0) or len(os.sched_getaffinity(0))
    pool = multiprocessing.get_context("fork").Pool(max(1, min(n, len(programs))))
    try:
      futs = [pool.apply_async(_compile, (p.source,)) for p in programs]
      out: list[bytes | None] = []
      for f in futs:
        try: out.append(f.get(timeout))
        except multiprocessing.TimeoutError: out.append(None)
      return out
    finally: pool.terminate()

  @staticmethod
  def _one(comp: Any, src: str) -> bytes | None:
    try: return comp.compile(src)
    except Exception: return None

  def _inputs(self, p: ProgramUOp, seed: int = 0) -> list[Buffer]:
    key = tuple((g.dtype.base, getattr(g.dtype, "size", 1)) for g in p.buffers)
    if (bufs := self.bufs.get(key)) is None:
      rng = np.random.default_rng(seed)
      arrays = [(rng.standard_normal(max(size, 1)) if dtypes.is_float(dt) else rng.integers(0, 7, max(size, 1))).astype(dtypes.to_numpy(dt))
                for dt, size in key]
      bufs = [Buffer.from_numpy(self.dev.name, a) for a in arrays]
      self.bufs, self.data, self.ref = {key: bufs}, arrays, None  # one kernel at a time: keep only its buffers
    return bufs

  @staticmethod
  def _vals(p: ProgramUOp) -> dict[str, int]: return {v.arg[0]: v.arg[2] for v in p.vars}

  def time(self, program: ProgramUOp, limit: float) -> float:
    from plugrad.device.runner import ProgramRunner
    run, bufs, vals = ProgramRunner(program), self._inputs(program), self._vals(program)
    best = float("inf")
    for _ in range(3):
      t = run(bufs, vals, wait=True)
      best = min(best, t if t is not None else float("inf"))
      if best > limit: break
    return best

  def same_results(self, program: ProgramUOp, reference: ProgramUOp) -> bool:
    """Whether `program` gives `reference`'s outputs on the search's own inputs (the buffers `time` ran both on). Each
    run starts from the outputs' initial contents, so a kernel that skips writing some elements, or reads its output
    (an in-place update), is compared fairly; the reference runs once per set of inputs."""
    from plugrad.device.runner import ProgramRunner

    def outputs(p: ProgramUOp) -> list[np.ndarray]:
      bufs = self._inputs(p)
      for s in p.outs: bufs[s].copyin(memoryview(self.data[s].tobytes()))
      ProgramRunner(p)(bufs, self._vals(p))
      return [bufs[s].numpy() for s in p.outs]
    self._inputs(reference)
    if self.ref is None or self.ref[0] is not reference: self.ref = (reference, outputs(reference))
    want = self.ref[1]
    for a, b in zip(want, outputs(program)):
      if a.dtype.kind == "f":
        if not np.allclose(b, a, rtol=1e-3, atol=1e-3, equal_nan=True): return False
      elif not np.array_equal(a, b): return False
    return True
