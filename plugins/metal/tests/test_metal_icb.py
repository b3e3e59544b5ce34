"""The METAL graph runner's indirect-command-buffer plan (plugrad_metal/icb.py), pure Python, built from real TinyJit
captures on the PYTHON device (whose graph runner gets the same GraphRunner tables a MetalGraph gets): which command
binds which buffer at which index, the variables buffer, barriers, what a replay rebinds, and the resources the
encoder must declare. The Metal calls that encode it (graph.py) run only on a Mac, which this project does not have."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from plugrad import Tensor, TinyJit, Variable
from plugrad.builtin.interpreter_graph import PythonGraph
from plugrad.errors import LaunchError
from plugrad.helpers import Context
from plugrad_metal.abi import MAX_BINDINGS, Signature
from plugrad_metal.icb import VAR_STRIDE, Command, IcbPlan, Update


def capture(monkeypatch, step, calls):
  """Run `step` under TinyJit for each argument tuple of `calls`; (the plan, [(commands, var_vals)] per replay, outputs)."""
  seen = []
  orig = PythonGraph.__call__
  def spy(self, slots, var_vals, wait=False):
    self._plan = getattr(self, "_plan", None) or IcbPlan(self)
    seen.append((self._plan, self._plan.commands(slots, var_vals), dict(var_vals)))
    return orig(self, slots, var_vals, wait)
  monkeypatch.setattr(PythonGraph, "__call__", spy)
  f = TinyJit(step)
  with Context(JIT=1): outs = [f(*args).numpy() for args in calls]
  assert seen, "the JIT replayed through the graph runner"
  plan = seen[-1][0]
  assert all(p is plan for p, _, _ in seen[-2:]), "one plan per captured batch"
  return plan, [(c, v) for p, c, v in seen if p is plan], outs


def test_abi_signature_packing():
  sig = Signature("k", 2, ("<i", "<q", "<i"))
  assert list(sig.buffer_indices) == [0, 1] and list(sig.var_indices) == [2, 3, 4]
  assert sig.pack([5, -(1 << 40), -1]) == [(2, struct.pack("<i", 5)), (3, struct.pack("<q", -(1 << 40))), (4, b"\xff\xff\xff\xff")]
  with pytest.raises(LaunchError, match="takes 3 variable values, got 1"): sig.pack([1])
  assert MAX_BINDINGS == 31


def test_icb_plan_from_a_tinyjit_capture(monkeypatch):
  n = Variable("n", 1, 64)
  def step(a, b, n):
    x = (a * 2 + b).contiguous()
    y = (x * x - a).contiguous()
    z = (b + 1).contiguous()
    return (y + z).shrink(((0, n),)).sum().realize()
  vals = (10, 20, 30, 40)
  calls = [tuple(Tensor(np.full(64, v, np.float32), device="PYTHON") for _ in range(2)) + (n.bind(v),) for v in vals]
  plan, replays, outs = capture(monkeypatch, step, calls)
  for v, got in zip(vals, outs):
    np.testing.assert_allclose(got, (((v * 2.0 + v) ** 2 - v) + (v + 1.0)) * v, rtol=1e-5)
  r = plan.runner
  (c1, _), (c2, v2) = replays[-2], replays[-1]
  assert len(c1) == len(r.kernels) and all(isinstance(c, Command) for c in c1)
  # bindings: buffer i at index i, variable k of a kernel at nbufs + k pointing into the variables buffer
  for c, k in zip(c2, r.kernels):
    assert [i for i, _ in c.buffer_bindings()] == list(range(len(k.bufs)))
    assert [i for i, _ in c.var_bindings()] == list(range(len(k.bufs), len(k.bufs) + len(k.runner.var_names)))
    assert all(off % VAR_STRIDE == 0 and off < plan.var_nbytes for _, off in c.var_bindings())
  users = [j for j, k in enumerate(r.kernels) if k.runner.var_names]
  assert users, "a kernel reads n"
  # the variables buffer: n's value at its slot as an 8-byte integer, the low 4 bytes what an `int` parameter reads
  data = plan.var_bytes(v2)
  off = c2[users[0]].var_offsets[0]
  assert len(data) == plan.var_nbytes and struct.unpack_from("<q", data, off)[0] == v2["n"] == 40 and struct.unpack_from("<i", data, off)[0] == 40
  # barriers: a command that reads an earlier one's output waits (y reads x)
  assert any(plan.barriers) and plan.barriers == [bool(e) for e in plan.edges] and not plan.barriers[0]
  assert all(e <= set(range(j)) for j, e in enumerate(plan.edges))
  # a replay with new inputs rebinds exactly the changed buffer indices; the values go through the variables buffer only
  ups = plan.updates(c1, c2)
  assert ups and all(not u.full and not u.reset for u in ups)
  for u in ups:
    assert {i for i, _ in u.buffers} == {i for i, (a, b) in enumerate(zip(c1[u.kernel].buffers, c2[u.kernel].buffers)) if a is not b}
  assert plan.updates(c2, c2) == [], "nothing changed: nothing to encode"
  first = plan.updates(None, c2)
  assert [u.kernel for u in first] == list(range(len(c2))) and all(u.full for u in first)
  # every buffer is declared to the encoder once, with how it is used
  res = plan.resources(c2)
  assert len({id(h) for h, _, _ in res}) == len(res) == len({id(h) for c in c2 for h in c.buffers})
  for h, rd, wr in res:
    uses = [(c.kernel, i) for c in c2 for i, b in enumerate(c.buffers) if b is h]
    assert wr == any(i in plan.outs[j] for j, i in uses) and rd == any(i in plan.ins[j] for j, i in uses)


def test_symbolic_dims_and_empty_launches(monkeypatch):
  n = Variable("n", 1, 1024)
  def step(a, n): return (a.shrink(((0, n),)) * 3).contiguous().sum().realize()
  vals = (50, 60, 100, 100, 700)
  calls = [(Tensor(np.arange(1024, dtype=np.float32), device="PYTHON"), n.bind(v)) for v in vals]
  plan, replays, outs = capture(monkeypatch, step, calls)
  assert [float(o) for o in outs] == [3.0 * sum(range(v)) for v in vals]
  (c0, _), (c1, _), (c2, _) = replays[-3], replays[-2], replays[-1]
  assert plan.runner.symbolic_dims, "the elementwise kernel's grid follows n"
  j = min(plan.runner.symbolic_dims)
  assert c1[j].grid == c0[j].grid and c2[j].grid != c1[j].grid
  assert [u for u in plan.updates(c0, c1) if u.dims] == [] and any(u.kernel == j and u.dims for u in plan.updates(c1, c2))
  # an empty grid resets the command, a non-empty one after it encodes the whole command again
  j = 0
  empty = Command(j, c2[j].buffers, c2[j].var_offsets, (0, 1, 1), c2[j].block, c2[j].barrier)
  assert empty.empty and plan.updates(c2[:1], [empty]) == [Update(0, reset=True)] and plan.updates([empty], [empty]) == []
  assert plan.updates([empty], c2[:1]) == [Update(0, full=True)]
  assert plan.resources([empty]) == []
