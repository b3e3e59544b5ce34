"""Conformance: the optimizer's actions keep a kernel's results on the device under test. Each kernel here is run
under every single action that applies to it (and pairs of them) and compared with numpy in float64.

The kernels are reductions over padded inputs whose pad fill stops being zero after an elementwise op (sqrt(|0| + 1)
= 1, exp(0) = 1, a comparison with a negative value): along a padded axis, a copy of the loop body that the optimizer
makes (UPCAST, UNROLL, GROUP, LOCAL, THREAD) can then read nothing but the fill and become a constant that no longer
depends on the loops around it. Such a copy once kept its accumulator outside those loops and summed across them.
A row statistic fused into its consumer's reduction is checked under the same actions."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.codegen.opt import KernelOptError, Opt, OptOps, Scheduler
from plugrad.engine.buffers import buffer_of
from plugrad.engine.realize import run_schedule
from plugrad.engine.schedule import ScheduleItem, create_schedule
from plugrad.helpers import Context
from plugrad.tensor.tensor import Tensor
from plugrad.uop.ops import KernelInfo

pytestmark = pytest.mark.plugrad_conformance

A = np.random.default_rng(3).standard_normal((1, 5, 2)).astype(np.float32)
B = np.random.default_rng(4).standard_normal((3, 4, 6)).astype(np.float32)
C = np.random.default_rng(5).standard_normal((6, 5)).astype(np.float32)
PAD_A = ((1, 0), (0, 1), (1, 1))
PAD_B = ((0, 1), (2, 1), (0, 2))

# name -> (input, pads, the op on the padded tensor as a plugrad Tensor method chain and as numpy)
CASES: dict[str, tuple[np.ndarray, Any, Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = {
  # the reproducer of the bug: a padded axis (0) upcast in full, one copy reading only the fill
  "sqrt_abs_sum0": (A, PAD_A, lambda x: (x.abs() + 1).sqrt().sum(0, keepdim=True), lambda x: np.sqrt(np.abs(x) + 1).sum(0, keepdims=True)),
  "exp_sum1": (A, PAD_A, lambda x: x.exp().sum(1), lambda x: np.exp(x).sum(1)),
  "exp_sum2": (B, PAD_B, lambda x: x.exp().sum(2), lambda x: np.exp(x).sum(2)),
  "max_of_neg_fill": (B, PAD_B, lambda x: (x - 5).max(1), lambda x: (x - 5).max(1)),
  "count_below": (B, PAD_B, lambda x: (x < 0.5).float().sum((0, 2)), lambda x: (x < 0.5).astype(np.float64).sum((0, 2))),
  # a row statistic computed inside its consumer's reduction (ROW_FUSE=2): with the output axis upcast, the statistic's
  # copies must share one loop (the consumer's first copy once took that loop before the second copy had joined it)
  "row_fused_statistic": (C, ((0, 1), (2, 1)), lambda x: (x.sum(1, keepdim=True) * x).sum(1, keepdim=True) * 2,
                          lambda x: (x.sum(1, keepdims=True) * x).sum(1, keepdims=True) * 2),
}


def _kernel(dev: str, name: str) -> tuple[list[ScheduleItem], ScheduleItem, np.ndarray]:
  x, pads, f, ref = CASES[name]
  t = f(Tensor(x, device=dev).realize().pad(pads))
  with Context(ROW_FUSE=2): items, _ = create_schedule(t.uop)
  # the actions are forced on the last kernel (the reduction); one before it may materialize the padded input
  return items, [it for it in items if it.kind == "kernel"][-1], ref(np.pad(x.astype(np.float64), pads))


def _actions(k: Scheduler) -> list[Opt]:
  outs, reds = len(k.output_axes), len(k.reduce_axes)
  cands = [Opt(op, ax, n) for ax in range(outs) for op, n in itertools.product((OptOps.UPCAST, OptOps.LOCAL, OptOps.THREAD), (2, 3, 0))]
  cands += [Opt(op, ax, n) for ax in range(reds) for op, n in itertools.product((OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP), (2, 3, 0))]
  return cands


def _valid(k: Scheduler, opts: list[Opt]) -> bool:
  try: Scheduler(k.ast, k.renderer).apply_opts(opts)
  except KernelOptError: return False
  return True


@pytest.mark.parametrize("name", list(CASES))
def test_actions_on_padded_reductions(run_device, plugrad_dev, name):
  items, target, want = _kernel(run_device, name)
  k = Scheduler(target.ast, plugrad_dev.renderer)
  singles = [o for o in _actions(k) if _valid(k, [o])]
  assert any(o.op is OptOps.UPCAST for o in singles), "no UPCAST applies: the test kernel lost its point"
  pairs = [[a, b] for a, b in itertools.combinations(singles, 2) if a.op is not b.op and _valid(k, [a, b])]
  checked = []
  for opts in [[], *([o] for o in singles), *pairs[:24]]:
    info = target.ast.arg if isinstance(target.ast.arg, KernelInfo) else KernelInfo()
    forced = dataclasses.replace(target, ast=target.ast.replace(arg=dataclasses.replace(info, opts_to_apply=tuple(opts))))
    run_schedule([forced if it is target else it for it in items])
    got = buffer_of(target.bufs[0]).numpy().reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} with actions {opts}")
    checked.append(opts)
  assert len(checked) > len(singles)
