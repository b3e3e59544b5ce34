"""Kernel counts of canonical graphs: what fuses, what is realized, and what is reused."""
import numpy as np
import pytest

from plugrad import Tensor
from plugrad.engine.nodes import buffer_uop
from plugrad.engine.schedule import ScheduleError, create_schedule
from plugrad.uop.ops import Ops, UOp

DEV = "PYTHON"


def t(*shape, seed=0):
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), device=DEV)


def kernels(*ts: Tensor) -> int:
  return sum(1 for it in ts[0].schedule(*ts[1:]) if it.kind == "kernel")


def test_elementwise_chain_is_one_kernel():
  a, b, c = t(4, 5), t(4, 5, seed=1), t(4, 5, seed=2)
  assert kernels((a * b + c).relu()) == 1


def test_reduce_after_elementwise_is_one_kernel():
  a, b, c = t(4, 5), t(4, 5, seed=1), t(4, 5, seed=2)
  out = (a * b + c).relu().sum()
  assert kernels(out) == 1
  np.testing.assert_allclose(out.item(), np.maximum(a.numpy() * b.numpy() + c.numpy(), 0).sum(), rtol=1e-5)


def test_two_reductions_of_one_input():
  x = t(6, 7)
  assert kernels(x.sum(1), x.max(1)) == 2
  assert kernels(x.sum(1) + x.max(1)) == 1  # siblings in one kernel, two loops


def test_matmul_bias_relu_is_one_kernel():
  x, w, b = t(4, 8), t(8, 3, seed=1), t(3, seed=2)
  out = (x @ w + b).relu()
  assert kernels(out) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy() @ w.numpy() + b.numpy(), 0), rtol=1e-5, atol=1e-6)


def test_the_epilogue_ends_in_the_reduction_kernel():
  # relu(x@w1+b1) feeds another matmul, which reads each value many times: the bias and ReLU are applied once, in
  # the first matmul's kernel, and the second reads a plain buffer (it loads neither the bias nor the bare product)
  x, w1, b1, w2 = t(4, 8), t(8, 6, seed=1), t(6, seed=2), t(6, 3, seed=3)
  out = (x @ w1 + b1).relu() @ w2
  items = [it for it in out.schedule() if it.kind == "kernel"]
  assert len(items) == 2
  first, second = (sum(1 for u in it.ast.toposort if u.op is Ops.DEFINE_GLOBAL) for it in items)
  assert (first, second) == (4, 3)  # (out, x, w1, b1) and (out, h, w2)
  assert any(u.op in (Ops.MAX, Ops.WHERE) for u in items[0].ast.toposort)  # the ReLU
  np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy() @ w1.numpy() + b1.numpy(), 0) @ w2.numpy(), rtol=1e-5, atol=1e-5)


def test_an_epilogue_used_elsewhere_leaves_the_reduction_alone():
  # the product is also read outside the ReLU: realizing the ReLU too would add a kernel, so only the product is
  x, w1, w2 = t(4, 8), t(8, 6, seed=1), t(6, 3, seed=3)
  a = x @ w1
  out = a.relu() @ w2 + a.sum()
  assert kernels(out) == kernels(x @ w1 @ w2 + (x @ w1).sum())
  np.testing.assert_allclose(out.numpy(), np.maximum(x.numpy() @ w1.numpy(), 0) @ w2.numpy() + (x.numpy() @ w1.numpy()).sum(), rtol=1e-4, atol=1e-4)


def test_softmax_realizes_the_broadcast_reductions():
  x = t(3, 10)
  assert kernels(x.softmax(-1)) == 3  # max, sum of exp, the normalization


def test_a_softmax_over_a_matmul_keeps_its_row_statistics_in_one_kernel():
  # the matmul is realized (three readers); the max and the sum once counted it as a sibling reduction of theirs and
  # got kernels of their own (three softmax kernels instead of one where rows fuse: 275 -> 161 us at 4x128x128)
  from plugrad.helpers import Context
  q, k, v = (Tensor(np.random.default_rng(i).standard_normal((1, 4, 128, 64), np.float32), device="CPU") for i in range(3))
  with Context(ROW_FUSE=2):
    p = (q @ k.transpose(-1, -2) * 0.125).softmax(-1)
    assert kernels(p) == 2 and kernels(p @ v) == 3
    s = q.numpy() @ k.numpy().transpose(0, 1, 3, 2) * 0.125
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose((p @ v).numpy(), (e / e.sum(-1, keepdims=True)) @ v.numpy(), rtol=1e-5, atol=1e-6)


def test_a_smaller_sibling_reduction_still_gets_its_own_kernel():
  # a ResNet block's 3x3 conv and its 1x1 downsample added: two reduction nests, the smaller one realized apart
  x, w3, w1 = t(1, 16, 16, 16), t(16, 16, 3, 3, seed=1), t(16, 16, 1, 1, seed=2)
  out = (x.conv2d(w3, padding=1) + x.conv2d(w1)).relu()
  assert kernels(out) == 2


def test_conv_relu_is_one_kernel():
  x, w = t(1, 2, 6, 6), t(3, 2, 3, 3, seed=1)
  assert kernels(x.conv2d(w, padding=1).relu()) == 1


@pytest.mark.parametrize("batch", [1, 2])
def test_a_reshaped_buffer_read_behind_a_pad_takes_no_modulo(batch):
  # a max pool's output is realized with its window axes kept as 1s ((N, C, H, W, 1, 1)); the conv after it reads it
  # reshaped and padded. At batch 1 the leading 1 once made the channel index `... % C`, which survived behind the
  # pad's gate (the kernel ran 2.2x its time)
  x, w = t(batch, 4, 12, 12), t(4, 4, 3, 3, seed=1)
  pooled = x.max_pool2d(3, 2, padding=1)
  out = pooled.conv2d(w, padding=1)
  items = [it for it in out.schedule() if it.kind == "kernel"]
  assert len(items) == 2
  assert not any(u.op is Ops.MOD for u in items[1].ast.toposort)
  ref = out.numpy()
  np.testing.assert_allclose(ref, pooled.realize().conv2d(w, padding=1).numpy(), rtol=1e-5, atol=1e-5)


def test_view_chain_costs_no_copy():
  x = t(2, 3, 4)
  v = x.permute(2, 0, 1).reshape(4, 6)[1:3].flip(0)
  assert kernels(v + 1) == 1
  np.testing.assert_allclose((v + 1).numpy(), x.numpy().transpose(2, 0, 1).reshape(4, 6)[1:3][::-1] + 1)


def test_expensive_producer_is_not_recomputed():
  x = t(5, 6)
  s = x.sum(1, keepdim=True)
  a, b = x * s, x + s  # both broadcast the reduction: it is computed once
  items = a.schedule(b)
  assert sum(1 for it in items if it.kind == "kernel") == 3
  assert sum(1 for it in items for u in it.ast.toposort if u.op is Ops.REDUCE) == 1


def test_realized_buffers_are_reused():
  x = t(4, 4)
  y = (x * 2).realize()
  assert kernels(y + 1) == 1 and kernels(y) == 0
  z = x * 2 + 1
  z.realize()
  assert kernels(z) == 0


def test_contiguous_of_a_buffer_is_free():
  x = t(3, 3)
  assert kernels(x.contiguous()) == 0
  assert kernels(x.T.contiguous()) == 1


def test_assign_target_must_be_a_buffer():
  x = t(3, 3)
  with pytest.raises(ScheduleError, match="ASSIGN target"): create_schedule(UOp(Ops.ASSIGN, x.dtype, ((x.uop + x.uop), x.uop)))


def test_reader_of_the_old_value_runs_before_the_assign():
  w = Tensor(np.arange(4, dtype=np.float32), device=DEV).realize()
  old_plus = w.uop + w.uop  # reads w's buffer as it is now
  new = UOp(Ops.ASSIGN, w.dtype, (w.uop, w.uop * UOp.const(w.dtype, 10.0).reshape((1,)).expand((4,))))
  items, becomes = create_schedule(new, old_plus)
  assert [it.in_place for it in items] == [False, True]
  from plugrad.engine.buffers import buffer_of
  from plugrad.engine.realize import run_schedule
  run_schedule(items)
  def buf(u): return buffer_of(u if u.op is Ops.BUFFER else u.src[0])
  np.testing.assert_allclose(buf(becomes[old_plus]).numpy(), np.arange(4) * 2)
  np.testing.assert_allclose(buf(w.uop).numpy(), np.arange(4) * 10)


# ---- the schedule cache

def test_schedule_cache_reuses_a_graph_form_over_other_buffers():
  from plugrad.engine import schedule as sched
  from plugrad.helpers import Context
  with Context(SCHEDULE_CACHE=1):
    sched._cache.clear()  # an LRU of 512 forms: full after the tests before this one in the process, it would not grow
    rng = np.random.default_rng(0)
    def step(a, b): return ((Tensor(a) * Tensor(b)).contiguous() + 1).sum(axis=0)
    a1, b1, a2, b2 = (rng.random((5, 7), dtype=np.float32) for _ in range(4))
    items1 = step(a1, b1).schedule()
    n = len(sched._cache)
    out2, items2 = step(a2, b2), step(a2, b2).schedule()
    assert len(sched._cache) == n  # the same form: a hit
    assert [it.ast for it in items1] == [it.ast for it in items2]
    assert not {b for it in items1 for b in it.bufs} & {b for it in items2 for b in it.bufs}  # own inputs, new results
    np.testing.assert_allclose(out2.numpy(), (a2 * b2 + 1).sum(axis=0), rtol=1e-6)
    x = rng.random((5, 7), dtype=np.float32)
    t = Tensor(x)
    np.testing.assert_allclose((t * t + 1).sum(axis=0).numpy(), (x * x + 1).sum(axis=0), rtol=1e-6)  # a*a is another form than a*b
    assert len(sched._cache) > n


def test_schedule_cache_off():
  from plugrad.engine import schedule as sched
  from plugrad.helpers import Context
  with Context(SCHEDULE_CACHE=0):
    n = len(sched._cache)
    np.testing.assert_allclose((Tensor([1.0, 2.0]) * 3 + 0.5).numpy(), [3.5, 6.5])
    assert len(sched._cache) == n


# ---- reduction splitting (SPLIT_REDUCE): a long reduction into few outputs becomes partials + a reduction over them

def _names(r: Tensor) -> list[str]:
  return [it.ast.arg.name for it in create_schedule(r.uop)[0] if it.kind == "kernel"]


@pytest.mark.parametrize("shape,fn,ref,names", [
  ((64, 4, 8, 8), lambda x: x.sum((0, 2, 3)), lambda a: a.sum((0, 2, 3)), ["r_32_1_4_1_1", "r_4"]),  # BatchNorm's per-channel sum
  ((8192,), lambda x: x.max(), lambda a: a.max(), ["r_32_1", "r_1"]),
  ((8, 4096), lambda x: x.sum(1), lambda a: a.sum(1), ["r_32_8_1", "r_8"]),
  # elementwise work fuses on both sides: into the partials (x*2) and into the final kernel (+1)
  ((64, 4, 8, 8), lambda x: (x * 2).mean((0, 2, 3), keepdim=True) + 1, lambda a: (a * 2).mean((0, 2, 3), keepdims=True) + 1,
   ["r_32_1_4_1_1", "r_1_4_1_1"]),
])
def test_long_reduction_into_a_small_output_is_split(shape, fn, ref, names):
  from plugrad.helpers import Context
  a = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
  x = Tensor(a, device=DEV)
  assert _names(fn(x)) == names
  np.testing.assert_allclose(fn(x).numpy(), ref(a), rtol=1e-4, atol=1e-4)
  with Context(SPLIT_REDUCE=0):
    assert kernels(fn(x)) == 1
    np.testing.assert_allclose(fn(x).numpy(), ref(a), rtol=1e-4, atol=1e-4)


def test_split_keeps_the_reduction_semantics_and_dtype():
  rng = np.random.default_rng(4)
  ints = rng.integers(-3, 4, 8192).astype(np.int32)
  r = Tensor(ints, device=DEV).sum()
  assert r.dtype == Tensor(ints, device=DEV).sum().dtype and kernels(r) == 2
  assert int(r.numpy()) == int(ints.sum())
  neg = -np.abs(rng.standard_normal(4096).astype(np.float32)) - 1  # every value below MAX's identity's neighbourhood of 0
  assert float(Tensor(neg, device=DEV).max().numpy()) == float(neg.max())
  prodv = (1 + rng.standard_normal(4096).astype(np.float32) * 1e-4)
  from plugrad.uop.ops import Ops as O
  m = Tensor(prodv, device=DEV)
  pr = Tensor(m.uop.reduce_axis(O.MUL, (0,)))
  assert kernels(pr) == 2
  np.testing.assert_allclose(pr.numpy(), np.prod(prodv.astype(np.float64)), rtol=1e-4)


@pytest.mark.parametrize("shape,axes", [((4099,), (0,)), ((4099, 3), (0,)), ((4095, 2), (0, 1)), ((64, 64), (1,)), ((2048, 1024), (1,))])
def test_short_long_indivisible_or_wide_reductions_are_not_split(shape, axes):
  # 4099 is prime; 4095*2 reduces 8190 but no axis is divisible by 8; 64 per row is short; 2048 outputs are many
  a = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
  r = Tensor(a, device=DEV).sum(axes)
  assert kernels(r) == 1
  np.testing.assert_allclose(r.numpy(), a.sum(axes), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("k,ways,rest", [(8192, 2, 0), (12289, 4, 1)])
def test_long_reduction_over_reused_operands_is_cut_into_chunks(k, ways, rest):
  # a matmul with a long K into many outputs: the register tile would stream a K-long operand panel per tile, out of
  # cache; cut into chunks of about SPLIT_CHUNK (the GPT LM head's input gradient, K=50257: 2.3 -> 0.24 s). 12289 is
  # prime: chunks of whole vectors (3072) and a rest of one, reduced apart and added in the final kernel
  a, b = t(32, k), t(k, 32, seed=1)
  names = _names(a @ b)
  assert names[0] == f"r_{ways}_32_32_1" and len(names) == 2 + (rest > 0), names
  np.testing.assert_allclose((a @ b).numpy(), a.numpy().astype(np.float64) @ b.numpy(), rtol=1e-4, atol=1e-3)
  from plugrad.helpers import Context
  with Context(SPLIT_REDUCE=0): assert _names(a @ b) == ["r_32_32"]
  x = t(1024, k)  # long row sums reuse nothing: not cut (each element is read once anyway)
  assert kernels(x.sum(1) * 2) == 1


def test_padded_reductions_get_their_own_kernels():
  # chunk(3)'s backward adds three padded gradients (q, k, v). A reduction fused under a PAD would run its loop for every
  # element of the padded output and have the gate drop most results (3x the work for the QKV gradient): each ends in
  # its own kernel, and the kernel that adds the padded pieces reduces nothing
  a, b, c, d = t(8, 16), t(16, 12, seed=1), t(8, 16, seed=2), t(16, 20, seed=3)
  out = (a @ b).cat(c @ d, dim=1)
  items, _ = create_schedule(out.uop)
  assert len(items) == 3 and not any(u.op is Ops.REDUCE for u in items[-1].ast.toposort), items
  want = np.concatenate([a.numpy() @ b.numpy(), c.numpy() @ d.numpy()], axis=1)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def test_buffers_come_from_the_simplified_kernel():
  # the pad's gate is false on every element kept, so the load of `a` simplifies away: `a` is not one of the kernel's
  # buffers, and the buffers it does read (b) get the slots the AST names, renumbered densely after the output
  a, b = t(3).realize(), t(2, seed=1).realize()
  (it,) = [it for it in (a.pad((2, 1))[0:2] + b).schedule() if it.kind == "kernel"]
  slots = sorted(u.arg for u in it.ast.toposort if u.op is Ops.DEFINE_GLOBAL)
  assert slots == list(range(len(it.bufs))) == [0, 1]
  assert it.bufs[1] is buffer_uop(b.uop) and buffer_uop(a.uop) not in it.bufs + tuple(it.reads_before)
  np.testing.assert_allclose((a.pad((2, 1))[0:2] + b).numpy(), b.numpy())


def _written_sizes(*ts: Tensor) -> list[int]:
  return [it.bufs[0].arg for it in ts[0].schedule(*ts[1:]) if it.kind == "kernel"]  # each kernel's output BUFFER (arg: its size)


@pytest.mark.parametrize("groups", [1, 2])
def test_a_stride_1_conv_input_gradient_is_a_transposed_conv(groups):
  # op by op, the gradient of the conv's windows (N, C, H, W, 3, 3) summed over the output channels is written to a
  # buffer 9x the input's, then folded; the conv's derivative rule (tensor/nn_ops.py) reads the output gradient instead
  x = Tensor(np.random.default_rng(0).standard_normal((2, 4, 7, 6)).astype(np.float32), device=DEV, requires_grad=True)
  w, g = t(6, 4 // groups, 3, 3, seed=1), t(2, 6, 7, 6, seed=2)
  (x.conv2d(w, padding=1, groups=groups) * g).sum().backward()
  assert x.grad is not None and max(_written_sizes(x.grad)) <= x.numel()
  torch = pytest.importorskip("torch")
  tx = torch.tensor(x.numpy(), requires_grad=True)
  (torch.nn.functional.conv2d(tx, torch.tensor(w.numpy()), padding=1, groups=groups) * torch.tensor(g.numpy())).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_a_strided_conv_input_gradient_keeps_the_window_fold():
  # a transposed conv of a stride-2 conv's gradient would multiply the zeros put between its elements
  x = Tensor(np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32), device=DEV, requires_grad=True)
  w = t(6, 4, 3, 3, seed=1)
  x.conv2d(w, stride=2, padding=1).sum().backward()
  assert x.grad is not None and max(_written_sizes(x.grad)) == 2 * 4 * 4 * 4 * 9


def test_an_expensive_operand_broadcast_a_few_times_gets_its_own_kernel():
  # ~30 ALU ops per element (a BatchNorm backward) read by a reduction 9 times (a depthwise conv's input gradient):
  # fused, every read redoes them; RECOMPUTE_WORK (broadcast count x ALU ops) realizes it although 9 <= RECOMPUTE_MAX
  x, y = t(3, 40), t(3, 40, seed=1)
  e = x
  for i in range(15): e = (e * y + float(i)).relu()
  out = (e.reshape(3, 1, 40).expand(3, 9, 40) * t(1, 9, 40, seed=2)).sum(2)
  assert kernels(out) == 2
  cheap = ((x * y).reshape(3, 1, 40).expand(3, 9, 40) * t(1, 9, 40, seed=2)).sum(2)
  assert kernels(cheap) == 1
  ref = x.numpy()
  for i in range(15): ref = np.maximum(ref * y.numpy() + i, 0)
  np.testing.assert_allclose(out.numpy(), (ref[:, None, :] * t(1, 9, 40, seed=2).numpy()).sum(2), rtol=1e-4)
