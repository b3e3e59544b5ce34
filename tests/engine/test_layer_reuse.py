"""A model's repeated layers reuse their kernels: each layer after the first schedules the same kernel ASTs (buffers are
slots, not identities), so codegen runs once per distinct kernel however deep the model is, and a second call of the
same model on new inputs reuses the whole schedule."""
import importlib.util
from pathlib import Path

import pytest

from plugrad import Device, Tensor, nn
from plugrad.codegen import get_program
from plugrad.engine import schedule as sched
from plugrad.uop.ops import Ops

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models.py"


@pytest.fixture(scope="module")
def models():
  spec = importlib.util.spec_from_file_location("bench_models", MODELS)
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def encoder(models, layers: int):
  Tensor.manual_seed(0)
  m = models.Encoder(hidden=32, heads=2, ffn=64, layers=layers, vocab=50, max_seq=16)
  Tensor.realize(*nn.get_parameters(m))  # loaded weights: their init kernels are no part of the forward
  return m


def inputs(seed: int):
  Tensor.manual_seed(seed)
  return Tensor.randint(2, 8, low=0, high=50).realize(), Tensor.ones(2, 8).contiguous().realize()


def kernel_asts(m, ids, mask):
  return [it.ast for it in m(ids, mask).schedule() if it.kind == "kernel"]


def test_encoder_layers_share_kernels(models):
  ids, mask = inputs(1)
  two, three = kernel_asts(encoder(models, 2), ids, mask), kernel_asts(encoder(models, 3), ids, mask)
  assert len(three) > len(two)  # one more layer: more launches...
  assert set(three) == set(two)  # ...of the same kernels
  # the codegen cache hands every launch of one AST the same program: one codegen per distinct kernel (the fused
  # attention's launches carry their PROGRAM already: one per shape, the same for every layer)
  renderer = Device[Device.DEFAULT].renderer
  assert len({id(a if a.op is Ops.PROGRAM else get_program(a, renderer)) for a in three}) == len(set(two))
  assert sum(a.op is Ops.PROGRAM for a in set(three)) == 1


def test_second_call_reuses_the_schedule(models, monkeypatch):
  m = encoder(models, 2)
  first, second = inputs(1), inputs(2)
  m(*first).realize()
  built, inner = [], sched._create_schedule
  monkeypatch.setattr(sched, "_create_schedule", lambda sink: built.append(sink) or inner(sink))
  assert m(*second).numpy().shape == (2, 8, 32)
  assert not built  # new input buffers, same graph form: a schedule cache hit
