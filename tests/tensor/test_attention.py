"""Attention's building blocks as the scheduler and the CPU compile them (issue 20): values against PyTorch where it is
installed, and structure: which kernels run and what work their estimates count (values on every device are in the
conformance suite, plugrad/testing/test_tensor_attention.py)."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import nn
from plugrad.engine.schedule import create_schedule
from plugrad.helpers import Context
from plugrad.tensor.tensor import Tensor
from plugrad.uop.ops import Ops
from plugrad.uop.shape import ShapeError

RNG = np.random.default_rng(7)


def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device="CPU")


def kernels(t: Tensor) -> list:
  items, _ = create_schedule(t.uop)
  return [it for it in items if it.kind == "kernel"]


def flops(t: Tensor) -> list[int]: return [int(it.program.estimates.ops) for it in kernels(t)]


@pytest.mark.parametrize("act", ["layernorm", "gelu", "affine_layernorm", "nn_layernorm_3d"])
def test_projection_fed_by_elementwise_work_counts_the_matmul_once(act):
  """A projection whose input is layernorm(x) or gelu(x): the normalization is computed once per element in its own
  kernel, not once per output column tile inside the matmul, and the matmul's estimate is the matmul's 2*M*N*K."""
  M, K, N = 256, 96, 128
  x, w, g, b = T(M, K), T(K, N), T(K), T(K)
  ln = nn.LayerNorm(K)
  a = {"layernorm": lambda: x.layernorm(), "gelu": lambda: x.gelu(), "affine_layernorm": lambda: x.layernorm() * g + b,
       "nn_layernorm_3d": lambda: ln(x.reshape(4, M // 4, K))}[act]
  fl = flops(a() @ w)
  assert max(fl) == 2 * M * N * K, fl
  # the elementwise kernel: a few dozen ops per element (on the CPU an exp2 is written out as ~30 vector ops, codegen/decompose.py)
  assert sum(fl) - max(fl) < 64 * M * K, fl
  with Context(RECOMPUTE_MAX=0):  # the old fusion recomputed the operand inside the matmul: its estimate says so
    assert max(flops(a() @ w)) > 2 * M * N * K
  np.testing.assert_allclose((a() @ w).numpy(), a().numpy() @ w.numpy(), rtol=1e-4, atol=2e-4)


def test_small_broadcast_stays_fused():
  """An operand broadcast at most RECOMPUTE_MAX times (attention's probabilities times a 16-wide value) is not worth a
  buffer of its own when its work is cheap: one kernel."""
  x, w = T(64, 32), T(32, 8)
  assert len(kernels((x * 2 + 1) @ w)) == 1


def test_attention_kernels():
  """q.k^T with its scale and mask ends in the matmul's kernel (no separate pass over the scores), the softmax is one
  kernel reading the scores once (its row statistics fused, ROW_FUSE), and the probabilities are computed once per
  score (not once per output column): three kernels, two score-sized buffers (the plain formula, FLASH_ATTENTION=0)."""
  q, k, v, m = T(2, 3, 64, 32), T(2, 3, 64, 32), T(2, 3, 64, 32), T(2, 1, 1, 64)
  with Context(FLASH_ATTENTION=0): ks = kernels(q.scaled_dot_product_attention(k, v, m))
  assert len(ks) == 3, [it.ast.arg.name for it in ks]
  qk = 2 * 2 * 3 * 64 * 64 * 32
  fl = [int(it.program.estimates.ops) for it in ks]
  assert fl[0] == qk + 2 * 2 * 3 * 64 * 64 and fl[2] == qk, fl  # q.k^T plus its scale and mask; P.V exactly
  scores = 2 * 3 * 64 * 64
  assert [it.bufs[0].arg for it in ks].count(scores) == 2  # the scaled scores and the probabilities: no third copy
  assert len(ks[1].bufs) == 2 and ks[1].program.estimates.mem == 2 * 4 * scores  # the softmax: one read, one write
  with Context(ROW_FUSE=0): assert len(kernels(q.scaled_dot_product_attention(k, v, m))) == 5


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layernorm", "affine_layernorm", "softmax_backward", "layernorm_backward"])
def test_row_statistics_read_the_input_once(op):
  """softmax, log-softmax and layernorm (and their backward passes, whose row sums are row statistics too) are one
  kernel per output on the CPU: the statistics run once per row in the kernel that broadcasts them, so each input is
  read from memory once and the estimate counts one read and one write per element. Without the fusion (ROW_FUSE=0)
  they are three kernels."""
  rows, w = 96, 128
  x, g, b = T(rows, w), T(w), T(w)
  def build() -> Tensor:
    if op.endswith("_backward"):
      xr = Tensor(x.numpy(), requires_grad=True)
      (xr.softmax(-1) if op.startswith("softmax") else xr.layernorm()).mul(x).sum().backward()
      assert xr.grad is not None
      return xr.grad
    if op == "affine_layernorm": return x.layernorm() * g + b
    return getattr(x, op)(-1)
  ks = kernels(build())
  assert len(ks) == 1, [it.ast.arg.name for it in ks]
  n = rows * w
  reads = n + 2 * w if op == "affine_layernorm" else 2 * n if op.endswith("_backward") else n  # a backward also reads its upstream gradient
  assert ks[0].program.estimates.mem == 4 * (reads + n), (ks[0].program.estimates.mem, reads)
  with Context(ROW_FUSE=0):
    if not op.endswith("_backward"): assert len(kernels(build())) == 3
  ref = build().numpy()
  with Context(ROW_FUSE=0): np.testing.assert_allclose(ref, build().numpy(), rtol=1e-5, atol=1e-5)


def test_column_statistics_stay_apart():
  """A statistic over the leading axis (softmax over axis 0) varies along the inner loop: fused it would be recomputed per
  element, so it keeps its own kernel."""
  assert len(kernels(T(64, 48).softmax(0))) == 3


def test_exp_is_vector_arithmetic_on_the_cpu():
  """The CPU renders a vector exp2 as arithmetic (libm would be called once per lane)."""
  src = kernels(T(4, 64).exp())[0].program.source
  assert "exp2" not in src.replace("vexp2", ""), src[:2000]


def test_values_against_torch():
  torch = pytest.importorskip("torch")
  x = RNG.standard_normal((4, 3, 16, 48)).astype(np.float32) * 10
  x[..., 40:] = -np.inf  # a padding mask
  tx = torch.from_numpy(x)
  np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(), torch.softmax(tx, -1).numpy(), rtol=1e-5, atol=1e-7)
  got, want = Tensor(x).log_softmax(-1).numpy(), torch.log_softmax(tx, -1).numpy()
  assert (np.isneginf(got) == np.isneginf(want)).all()
  fin = np.isfinite(want)
  np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)
  y = RNG.standard_normal((64, 384)).astype(np.float32) + 100
  np.testing.assert_allclose(Tensor(y).layernorm().numpy(), torch.nn.functional.layer_norm(torch.from_numpy(y), (384,)).numpy(), atol=2e-3)
  q, k, v = (RNG.standard_normal((2, 3, 32, 16)).astype(np.float32) for _ in range(3))
  bmask = RNG.random((32, 32)) < 0.7
  bmask[:, 0] = True
  fmask = RNG.standard_normal((2, 1, 1, 32)).astype(np.float32)
  fmask[..., 28:] = -np.inf
  tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
  F = torch.nn.functional.scaled_dot_product_attention
  for kw, tkw in (({}, {}), ({"attn_mask": Tensor(bmask)}, {"attn_mask": torch.from_numpy(bmask)}),
                  ({"attn_mask": Tensor(fmask)}, {"attn_mask": torch.from_numpy(fmask)}), ({"is_causal": True}, {"is_causal": True})):
    got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), **kw).numpy()
    np.testing.assert_allclose(got, F(tq, tk, tv, **tkw).numpy(), rtol=1e-4, atol=1e-5, err_msg=str(tkw))


def test_attention_backward_against_torch():
  torch = pytest.importorskip("torch")
  q, k, v = (RNG.standard_normal((2, 2, 16, 8)).astype(np.float32) for _ in range(3))
  g = RNG.standard_normal((2, 2, 16, 8)).astype(np.float32)
  for causal in (False, True):
    ts = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    (ts[0].scaled_dot_product_attention(ts[1], ts[2], is_causal=causal) * Tensor(g)).sum().backward()
    tt = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    (torch.nn.functional.scaled_dot_product_attention(*tt, is_causal=causal) * torch.from_numpy(g)).sum().backward()
    for a, b in zip(ts, tt):
      assert a.grad is not None and b.grad is not None
      np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_no_exp_in_the_value_matmul():
  """The P.V kernel reads realized probabilities (the exp ran once per score, vectorized), not exp per packed copy."""
  q, k, v = T(1, 2, 64, 32), T(1, 2, 64, 32), T(1, 2, 64, 32)
  pv = kernels(q.scaled_dot_product_attention(k, v))[-1]
  assert not any(u.op is Ops.EXP2 for u in pv.ast.toposort)


def _attention_kernels(t: Tensor) -> list[str]:
  return [u.arg.name for u in t.uop.toposort if u.op is Ops.KERNEL]


def test_fused_attention_policy_by_flag_and_dropout():
  """FLASH_ATTENTION=1 (default) takes the fused kernel on every device, 0 the plain formula; dropout in training needs
  the probabilities in memory, so it takes the plain formula, and so do dtypes the kernel does not take."""
  def sdpa(device: str, dtype: str = "float32", **kw) -> Tensor:
    q = Tensor(RNG.standard_normal((2, 4, 16, 8)).astype(dtype), device=device)
    return q.scaled_dot_product_attention(q, q, is_causal=True, **kw)
  assert _attention_kernels(sdpa("CPU")) == _attention_kernels(sdpa("PYTHON")) == ["flash_attn_8_16_16_8_causal"]
  with Context(FLASH_ATTENTION=0): assert _attention_kernels(sdpa("CPU")) == _attention_kernels(sdpa("PYTHON")) == []
  assert _attention_kernels(sdpa("CPU", "float64")) == []
  q = T(2, 4, 16, 8)
  with pytest.raises(ShapeError):  # a mask that does not broadcast gets the plain formula's error, not a fused-path one
    q.scaled_dot_product_attention(q, q, attn_mask=T(3, 16)).realize()
  Tensor.training = True
  try: assert _attention_kernels(sdpa("CPU", dropout_p=0.1)) == []
  finally: Tensor.training = False


def test_fused_attention_trains_under_tinyjit_like_the_plain_formula():
  """A causal self-attention block's training step under TinyJit: the fused forward and the two fused backward kernels
  are one launch each per step (FLASH_ATTENTION=3; the forward only with 2, and with 1 on a CPU for scores this small),
  replayed, and the weights' gradients match the plain formula's."""
  from plugrad import TinyJit
  x = T(2, 32, 16)
  def step(w: Tensor) -> tuple[Tensor, Tensor]:
    q, k, v = (x @ w).reshape(2, 32, 3, 2, 8).permute(2, 0, 3, 1, 4)
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    w.grad = None
    (out * out).sum().backward()
    return out.realize(), w.grad.realize()
  got, w0 = {}, RNG.standard_normal((16, 48)).astype(np.float32) * 0.3
  for flash in (3, 1, 2, 0):
    with Context(FLASH_ATTENTION=flash):
      w = Tensor(w0, device="CPU", requires_grad=True)
      w.realize()
      jit = TinyJit(step)
      for _ in range(3): out, g = jit(w)
      names = [ei.runner.program.name for ei in jit.captured.items if hasattr(ei.runner, "program")]
      kinds = sorted(n.split("_")[2] if "_bwd_" in n else "fwd" for n in names if n.startswith("flash_attn"))
      assert kinds == {3: ["bwd", "bwd", "fwd"], 1: ["fwd"], 2: ["fwd"], 0: []}[flash]  # 1: scores this small take the ops backward
      got[flash] = (out.numpy(), g.numpy())
  for flash in (3, 1, 2):
    np.testing.assert_allclose(got[flash][0], got[0][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[flash][1], got[0][1], rtol=1e-4, atol=1e-5)


def test_fused_attention_estimates_count_the_causal_loop_at_its_longest():
  """The fused causal kernel's key loop ends after the tile's last row (a bound that depends on the instance): the
  estimates count its longest trip, an upper bound, and the kernel runs."""
  from plugrad.codegen.attention import AttentionShape, attention_program
  from plugrad.device.registry import Device
  p = attention_program(AttentionShape(1, 2, 64, 64, 16, 16, causal=True, scale=0.25), Device["CPU"].renderer)
  assert any(u.op is Ops.RANGE and u.src[0].op is not Ops.CONST for u in p.uops)
  full = 2 * 64 * 64 * 16 * 2 * 2  # q·kᵀ and p·v multiply-adds over every (query, key) pair
  assert full <= p.estimates.ops < 2 * full


def test_fused_backward_after_the_output_was_realized():
  """An output realized (logged) before backward() keeps a graph without its own buffers, so the backward cannot read
  the forward's log-sum-exp: it takes the two-pass dQ kernel (flash_attn_bwd_q2), with the same gradients as the
  one-pass kernel that reads them (flash_attn_bwd_q) and as the plain formula."""
  q, k, v, g = (RNG.standard_normal((2, 3, 24, 8)).astype(np.float32) for _ in range(4))
  grads = {}
  for flash, realize_first in ((3, False), (3, True), (0, False)):
    with Context(FLASH_ATTENTION=flash):
      ts = [Tensor(x, device="CPU", requires_grad=True) for x in (q, k, v)]
      out = ts[0].scaled_dot_product_attention(ts[1], ts[2], is_causal=True)
      if realize_first: out.realize()
      loss = (out * Tensor(g, device="CPU")).sum()
      names = {u.arg.name for u in loss.gradient(ts[0])[0].uop.toposort if u.op is Ops.KERNEL}
      if flash: assert {n.split("_6_")[0] for n in names} == ({"flash_attn_bwd_q2"} if realize_first else {"flash_attn", "flash_attn_bwd_q"}), names
      loss.backward()
      grads[(flash, realize_first)] = [t.grad.numpy() for t in ts]
  for key in ((3, False), (3, True)):
    for a, b in zip(grads[key], grads[(0, False)]): np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_fused_backward_policy():
  """FLASH_ATTENTION=1 takes the fused backward on devices with workgroups and, on a CPU, from one score matrix of
  FUSED_BACKWARD_SCORE_BYTES on (it costs more work there and saves memory); 2 never, 3 always."""
  from plugrad.codegen.attention import AttentionShape
  from plugrad.device.registry import Device
  from plugrad.tensor.attention import FUSED_BACKWARD_SCORE_BYTES, _fused_backward
  small, big = AttentionShape(2, 4, 128, 128, 32, 32), AttentionShape(4, 12, 1024, 1024, 64, 64)
  assert 2 * 4 * 128 * 128 * 4 < FUSED_BACKWARD_SCORE_BYTES <= 4 * 12 * 1024 * 1024 * 4
  for mode, want in ((1, (False, True, True)), (2, (False, False, False)), (3, (True, True, True))):
    with Context(FLASH_ATTENTION=mode):
      assert (_fused_backward(small, Device["CPU"].renderer), _fused_backward(big, Device["CPU"].renderer),
              _fused_backward(small, Device["PYTHON"].renderer)) == want
