"""BEAM never picks a wrong kernel (issue 32, item 3): a candidate whose outputs differ from the unoptimized kernel's on
the search's own inputs is dropped before it can win, and counted (stats["wrong"], listed at DEBUG>=2).

The wrong candidate is planted: one action list of the search is made to lower to another kernel over the same buffers
(its sum doubled), and the timer reports it as by far the fastest, so only the correctness check can keep it out."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.codegen import get_program
from plugrad.codegen.opt import Opt, Scheduler, search
from plugrad.codegen.opt.kernel import KernelOptError
from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.device.search import DeviceTimer
from plugrad.engine.schedule import create_schedule
from plugrad.helpers import Context
from plugrad.uop.ops import UOp

RNG = np.random.default_rng(32)


def _ast(t: Tensor) -> UOp:
  items, _ = create_schedule(t.uop)
  (it,) = [it for it in items if it.kind == "kernel"]
  return it.ast


def _plant(monkeypatch: pytest.MonkeyPatch, right: UOp, wrong: UOp) -> list[Opt]:
  """Make the first action list BEAM tries on `right` lower to `wrong` with those actions; returns that list."""
  renderer = Device["CPU"].renderer
  from plugrad.codegen.opt.heuristic import hand_coded_optimizations
  seed = hand_coded_optimizations(Scheduler(right, renderer))
  def applies(opts: list[Opt]) -> bool:
    try: Scheduler(wrong, renderer).apply_opts(list(opts))
    except KernelOptError: return False
    return True
  planted = next(c for c in search.candidates(seed) if applies(c.applied))
  real_program = search._program

  def program(k: Scheduler) -> object:
    if k.applied == planted.applied: return real_program(Scheduler(wrong, renderer).apply_opts(list(k.applied)))
    return real_program(k)
  monkeypatch.setattr(search, "_program", program)
  return list(planted.applied)


class _FastWrong(DeviceTimer):
  """DeviceTimer, except that the planted candidate's source times as instantaneous (it would win on speed alone)."""
  planted_sources: set[str] = set()

  def time(self, program, limit):  # type: ignore[no-untyped-def]
    t = super().time(program, limit)
    return 0.0 if program.source in self.planted_sources else t


def test_beam_drops_a_planted_wrong_candidate(monkeypatch, tmp_path, capfd):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("BEAM_STEPS", "1")
  monkeypatch.setenv("BEAM_CACHE", "0")
  x = Tensor(RNG.standard_normal((16, 32)).astype(np.float32), device="CPU")
  right, wrong = _ast(x.sum(1)), _ast((x * 2).sum(1))
  planted = _plant(monkeypatch, right, wrong)
  renderer = Device["CPU"].renderer
  wrong_prog = search._program(Scheduler(right, renderer).apply_opts(planted))
  assert wrong_prog is not None
  _FastWrong.planted_sources = {wrong_prog.source}
  before = search.stats["wrong"]
  with Context(BEAM=2, DEBUG=2): k = search.beam_search(Scheduler(right, renderer), 2, timer=_FastWrong)
  assert k.applied != planted, "the planted candidate times fastest: only the correctness check keeps it out"
  assert search.stats["wrong"] == before + 1
  err = capfd.readouterr().err
  assert "dropped 1 candidate(s) whose results differ from the unoptimized kernel's" in err and str(planted) in err
  # what it chose computes the sum
  monkeypatch.undo()
  prg = get_program(right, renderer, opts=k.applied)
  data = RNG.standard_normal(16 * 32).astype(np.float32)
  bufs = [Buffer("CPU", 16, prg.buffers[0].dtype.base).allocate(), Buffer.from_numpy("CPU", data)]
  ProgramRunner(prg)(bufs, {})
  np.testing.assert_allclose(bufs[0].numpy(), data.reshape(16, 32).sum(1), rtol=1e-5, atol=1e-5)


def test_same_results_uses_the_search_inputs_and_catches_unwritten_outputs():
  """DeviceTimer.same_results compares on the buffers `time` ran on, each run starting from the outputs' initial data:
  a kernel that computes something else is told apart, the same kernel under other actions is not."""
  renderer = Device["CPU"].renderer
  x = Tensor(RNG.standard_normal((8, 24)).astype(np.float32), device="CPU")
  right, wrong = _ast(x.sum(1)), _ast(x.max(1))
  timer = DeviceTimer(renderer)

  def compiled(ast: UOp, opts: list[Opt]) -> object:
    p = get_program(ast, renderer, opts=opts)
    return p.with_binary(Device["CPU"].compiler.compile(p.source))
  base = compiled(right, [])
  timer.time(base, float("inf"))
  assert timer.same_results(compiled(right, search.candidates(Scheduler(right, renderer))[0].applied), base)
  assert not timer.same_results(compiled(wrong, []), base)
