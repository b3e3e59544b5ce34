"""The composition fuzzer (issue 32; docs/testing.md, "The composition fuzzer"): seeded random programs of ordinary
Tensor ops, realized together so the scheduler fuses freely, compared with float64 numpy on the CPU (LLVM and C
renderers), PYTHON and WEBGPU; on the CPU every kernel is also run without actions, under the default actions and under
sampled BEAM candidate action lists (tests/fuzz/kernels.py). FUZZ_EXAMPLES=N runs N programs (default 32)."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import numpy as np
import pytest

from plugrad.engine.schedule import create_schedule
from plugrad.helpers import Context
from plugrad.uop.ops import UOp
from tests.fuzz.kernels import STATS, CPUBackend, cpu_backend, run_schedule
from tests.fuzz.programs import KINDS, FuzzError, Program, Step, build, generate, mismatch, reference

DEFAULT_EXAMPLES = 32
BEAM_SAMPLES = 4  # sampled BEAM action lists per kernel, besides the default actions


def fuzz_examples(env: Mapping[str, str] = os.environ) -> int:
  raw = env.get("FUZZ_EXAMPLES", "").strip()
  if not raw: return DEFAULT_EXAMPLES
  try: n = int(raw)
  except ValueError: n = 0
  if n < 1: raise FuzzError(f"FUZZ_EXAMPLES={raw!r} is not valid: expected an integer >= 1 (the number of random programs)")
  return n


EXAMPLES = fuzz_examples()
# seeds whose programs fail for a known reason: strict xfails, so the fix turns them red until the entry goes
KNOWN: dict[int, str] = {}


def seeds() -> Iterable[object]:
  for s in range(EXAMPLES):
    yield pytest.param(s, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN[s])) if s in KNOWN else s


def _cpu_backend(name: str) -> CPUBackend:
  be = cpu_backend(name)
  if isinstance(be, str): pytest.skip(be)
  return be


def _own_cpu_backend() -> str:
  """The renderer the CPU device itself uses (CPU_LLVM; plugins/cpu/README.md)."""
  try:
    from plugrad_cpu.plugin import llvm_mode
  except ImportError: pytest.skip("plugrad-cpu is not installed (pip install -e 'plugins/cpu[llvm]')")
  return "llvm" if llvm_mode() else "c"


def check_cpu(prog: Program, backend: str) -> None:
  be = _cpu_backend(backend)
  ref = reference(prog)
  vals = build(prog, "CPU")  # once: the outputs share their inputs and subexpressions
  outs = [vals[i] for i in prog.outputs]
  items, becomes = create_schedule(*dict.fromkeys(t.uop for t in outs))
  run = run_schedule(items, be, BEAM_SAMPLES, np.random.default_rng([32, prog.seed]))
  problems = list(run.mismatches)
  for chain in ("noopt", "default"):
    for i, t in zip(prog.outputs, outs):
      got = run.output(chain, becomes, t.uop, tuple(int(d) for d in t.shape))
      if m := mismatch(got, ref[i], f"v{i} ({backend}, {'no actions' if chain == 'noopt' else 'default actions'})"): problems.append(m)
  if backend == _own_cpu_backend():  # the user's path: the engine realizes everything together on the CPU device
    problems += _device_problems(prog, ref, "CPU")
  _count(prog, f"CPU ({backend})", problems)


def _device_problems(prog: Program, ref: list, device: str) -> list[str]:
  vals = build(prog, device)
  outs = [vals[i] for i in prog.outputs]
  outs[0].realize(*outs[1:])
  return [m for i, t in zip(prog.outputs, outs) if (m := mismatch(t.numpy(), ref[i], f"v{i} ({device})"))]


def _count(prog: Program, where: str, problems: list[str]) -> None:
  STATS["programs"] += 1
  STATS[f"programs on {where}"] += 1
  STATS["known-bug mismatches" if prog.seed in KNOWN else "mismatches"] += len(problems)
  assert not problems, prog.describe() + "\n" + "\n".join(problems)


@pytest.mark.parametrize("backend", ["llvm", "c"])
@pytest.mark.parametrize("seed", seeds())
def test_cpu(seed: int, backend: str) -> None:
  check_cpu(generate(seed), backend)


@pytest.mark.parametrize("seed", seeds())
def test_python(seed: int) -> None:
  prog = generate(seed)
  _count(prog, "PYTHON", _device_problems(prog, reference(prog), "PYTHON"))


@pytest.mark.parametrize("seed", seeds())
def test_webgpu(seed: int) -> None:
  pytest.importorskip("plugrad_webgpu", reason="plugrad-webgpu is not installed (pip install -e plugins/webgpu)")
  from plugrad_webgpu.context import probe
  if (why := probe()) is not None: pytest.skip(f"no WebGPU adapter here: {why}")
  prog = generate(seed)
  _count(prog, "WEBGPU", _device_problems(prog, reference(prog), "WEBGPU"))


# ---- the program that found issue 32 (fixed by 189b9c6): a padded region whose fill becomes 1 under sqrt(|x| + 1),
# summed over the padded axis, which the CPU heuristics upcast (r_1_6_4, UPCAST axis 0 amount 6: [2, 4, 6, 8] for
# [2, 2, 2, 2]); every sampled BEAM action list of it is checked too

def issue32_program() -> Program:
  a = np.random.default_rng(3).standard_normal((1, 5, 2)).astype(np.float32)
  return Program(1_000_032, [a], [Step("input", (), 0), Step("pad", (0,), (((1, 0), (0, 1), (1, 1)), 0)), Step("unary", (1,), "sqrt1"),
                            Step("sum", (2,), ((0,), True))], (3,))


@pytest.mark.parametrize("backend", ["llvm", "c"])
def test_issue32_padded_reduction_cpu(backend: str) -> None:
  check_cpu(issue32_program(), backend)


@pytest.mark.parametrize("device", ["PYTHON", "WEBGPU"])
def test_issue32_padded_reduction_other_devices(device: str) -> None:
  if device == "WEBGPU":
    pytest.importorskip("plugrad_webgpu", reason="plugrad-webgpu is not installed (pip install -e plugins/webgpu)")
    from plugrad_webgpu.context import probe
    if (why := probe()) is not None: pytest.skip(f"no WebGPU adapter here: {why}")
  prog = issue32_program()
  _count(prog, device, _device_problems(prog, reference(prog), device))


# ---- found by the fuzzer (FUZZ_EXAMPLES=1400, seed 1006, a sampled BEAM list): a row statistic computed inside its
# consumer's reduction (ROW_FUSE=1, the CPU default) did not lower once the output axis was upcast (LinearizeError: two
# loops over the same range: the consumer's first copy took the statistic's loop before its second copy had joined it);
# fixed in lower_reduces, and checked under every action on every device by plugrad.testing.test_optimizer_actions

def test_upcast_of_a_row_fused_statistic_lowers() -> None:
  from plugrad import Tensor
  from plugrad.codegen import get_program
  from plugrad.codegen.opt import Opt, OptOps
  from plugrad.device.registry import Device
  x = Tensor(np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32), device="CPU")
  with Context(ROW_FUSE=1): it = ((x.sum(1, keepdim=True) * x).sum(1, keepdim=True) * 2).schedule()[0]
  prg = get_program(it.ast, Device["CPU"].renderer, opts=[Opt(OptOps.UPCAST, 0, 2)])
  assert list(prg.applied_opts) == [Opt(OptOps.UPCAST, 0, 2)]


# ---- the fuzzer itself

def test_programs_cover_every_step_kind_and_share_values() -> None:
  """The CI seeds (at least the default 32) together use every kind of step, read some value twice (a shared
  subexpression) and realize several outputs together; the same seed gives the same program."""
  progs = [generate(s) for s in range(max(EXAMPLES, DEFAULT_EXAMPLES))]
  kinds = {s.kind for p in progs for s in p.steps}
  assert kinds == set(KINDS), f"step kinds never generated: {set(KINDS) - kinds}"
  assert any(len(p.outputs) > 1 for p in progs)
  assert any(max(np.unique([a for s in p.steps for a in s.args], return_counts=True)[1], default=0) > 1 for p in progs)
  assert generate(5).describe() == generate(5).describe() and generate(5).describe() != generate(6).describe()


def test_reference_masks_the_undecidable_elements() -> None:
  """A comparison whose operand sits at its threshold, and a float -> int cast of a whole number, are left out."""
  prog = Program(0, [np.array([0.5, 2.0, -1.0], np.float32)],
                 [Step("input", (), 0), Step("where", (0, 0, 0), 0.5), Step("cast", (0,), "int32")], (1, 2))
  ref = reference(prog)
  assert ref[1].unsure.tolist() == [True, False, False] and ref[2].unsure.tolist() == [False, True, True]
  assert mismatch(np.array([9.0, 2.0, -1.0], np.float32), ref[1], "v1") is None
  assert mismatch(np.array([0.5, 2.5, -1.0], np.float32), ref[1], "v1") is not None


@pytest.mark.parametrize("raw", ["0", "-3", "many", "2.5"])
def test_fuzz_examples_must_be_a_positive_integer(raw: str) -> None:
  with pytest.raises(FuzzError, match=f"FUZZ_EXAMPLES='{raw}' is not valid"): fuzz_examples({"FUZZ_EXAMPLES": raw})
  assert fuzz_examples({}) == DEFAULT_EXAMPLES and fuzz_examples({"FUZZ_EXAMPLES": "7"}) == 7


def test_a_wrong_kernel_is_reported() -> None:
  """The kernel check compares each action list with the unoptimized outputs: a kernel whose default-actions program
  computes something else (planted: another kernel's program over the same buffers) is reported."""
  be = _cpu_backend(_own_cpu_backend())
  from plugrad import Tensor
  from tests.fuzz import kernels
  x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  (right,), _ = create_schedule(x.sum(1).uop)
  (wrong,), _ = create_schedule(x.max(1).uop)
  real = kernels.runner

  def planted(b: CPUBackend, ast: UOp, opts: object) -> object:
    return real(b, wrong.ast if opts is None and ast is right.ast else ast, opts)  # type: ignore[arg-type]
  counts = dict(STATS)
  kernels.runner = planted  # type: ignore[assignment]
  try: res = run_schedule([right], be, 0, np.random.default_rng(0))
  finally: kernels.runner = real
  STATS.clear()
  STATS.update(counts)  # a planted kernel is not one the fuzzer checked
  assert len(res.mismatches) == 1 and "under default actions" in res.mismatches[0], res.mismatches
