"""`scaled_dot_product_attention` through the fused kernels (`codegen/attention.py`, `codegen/attention_backward.py`):
the scores and probabilities never reach memory, forward or backward. The launch is a KERNEL node of the lazy graph
(scheduled, batched and replayed by TinyJit like any kernel) with a registered derivative that launches the two
backward kernels. It reads only the launch's inputs, so an output that was realized (logged) before `backward()` keeps
no reference to its own buffer (gradient.kernel_output_origin).

`FLASH_ATTENTION`: 1 (default) the fused forward wherever it applies, with the fused backward where `_fused_backward`
says it pays (GPUs; large score matrices on a CPU), else a backward by ordinary tensor ops (P and dS in memory once
each); 2 always that ordinary-ops backward, 3 always the fused one; 0 the plain formula (q·kᵀ, softmax, ·v: three
kernels, two (B, H, L, S) buffers). Figures: docs/benchmarks.md, "Fused attention".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from plugrad.dtype import dtypes
from plugrad.gradient import Grads, register_kernel_gradient
from plugrad.helpers import ContextVar, prod
from plugrad.tensor.custom import launch_program
from plugrad.tensor.helpers import is_buffer_form, tensor_cls
from plugrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
  from plugrad.codegen.attention import AttentionShape
  from plugrad.renderer.base import Renderer
  from plugrad.tensor.tensor import Tensor

# 0 the plain formula; the fused forward with 1 the backward `_fused_backward` picks, 2 the ordinary-ops backward, 3 the fused backward
FLASH_ATTENTION = ContextVar("FLASH_ATTENTION", 1, (0, 1, 2, 3))
# On a CPU the fused backward does 7 matmuls' work where the ordinary-ops backward does 5 (it recomputes the scores and
# dP in both of its kernels) and took 1.2-1.6x its time (2 threads and 1), but it keeps P and dS out of memory: 4x12x1024²
# causal fwd+bwd peaked at 872 MB instead of 2.0 GB. It is taken where those two (B, H, L, S) float32 buffers matter.
FUSED_BACKWARD_SCORE_BYTES = 64 << 20


def _fused_backward(sh: AttentionShape, renderer: Renderer) -> bool:
  """Whether the backward of `sh` takes the fused kernels: FLASH_ATTENTION=3 always, 1 on devices with workgroups (their
  memory traffic is what the scores cost) and elsewhere when one (B, H, L, S) float32 score matrix is at least
  FUSED_BACKWARD_SCORE_BYTES."""
  if FLASH_ATTENTION.value in (0, 2): return False
  return FLASH_ATTENTION.value == 3 or renderer.has_local or sh.B * sh.H * sh.L * sh.S * 4 >= FUSED_BACKWARD_SCORE_BYTES
_FUSED_DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)


def _mask_layout(mask: Tensor, lead: tuple[int, ...], L: int, S: int) -> tuple[Tensor, tuple[bool, bool, bool]]:
  """The additive float32 mask as (Bm, Hm, Lm, S) with each of the first three dims either full or 1 (broadcast), and
  which are full. The heads are the last leading dim, the batch all the others; a mask that varies along some batch
  dims but not all is expanded along the rest."""
  m = mask.where(0.0, -math.inf) if mask.dtype is dtypes.bool else mask.cast(dtypes.float32)
  m = m.reshape((1,) * (len(lead) + 2 - m.ndim) + m.shape)
  *mb, mh, ml, _ = m.shape
  full_b = any(d != 1 for d in mb)
  if full_b and any(d == 1 for d, n in zip(mb, lead[:-1]) if n != 1): m = m.expand(*lead[:-1], *m.shape[-3:])
  shape = (prod(lead[:-1]) if full_b else 1, lead[-1] if mh != 1 else 1, L if ml != 1 else 1, S)
  return m.expand(*m.shape[:-1], S).reshape(*shape) if m.shape[-1] == 1 else m.reshape(*shape), (full_b, mh != 1, ml != 1)


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float) -> Tensor | None:
  """softmax(q·kᵀ·scale + mask)·v by the fused kernel, or None where it does not apply (the caller computes the plain
  formula): FLASH_ATTENTION=0, multi-device tensors, dtypes other than float32/float16/bfloat16 (through float32) or mixed, symbolic or
  empty shapes, a mask that does not broadcast. q (..., L, E), k (..., S, E), v (..., S, Ev) with equal leading dims."""
  if FLASH_ATTENTION.value == 0 or q.dtype not in _FUSED_DTYPES or k.dtype is not q.dtype or v.dtype is not q.dtype or q.ndim < 2: return None
  if not isinstance(q.device, str): return None  # multi-device: the plain formula, which runs per device (docs/sharding.md)
  if q.dtype is dtypes.bfloat16:  # through float32 (the kernel computes in float32 anyway; its buffers hold float32 or float16)
    out = fused_attention(q.float(), k.float(), v.float(), mask, causal, scale)
    return None if out is None else out.cast(dtypes.bfloat16)
  if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2] or not all(isinstance(d, int) for d in (*q.shape, *k.shape, *v.shape)): return None
  qs, vs = tuple(d for d in q.shape if isinstance(d, int)), tuple(d for d in v.shape if isinstance(d, int))  # all ints (above)
  lead, (L, E), (S, Ev) = qs[:-2], qs[-2:], vs[-2:]
  if 0 in (*lead, L, E, S, Ev): return None
  if mask is not None:  # a mask that does not broadcast to (..., L, S) is the plain formula's error to raise
    target = (*lead, L, S)
    if mask.ndim > len(target) or any(d != 1 and d != t for d, t in zip(reversed(mask.shape), reversed(target))): return None
  from plugrad.codegen.attention import AttentionShape, attention_program  # the codegen loads on first use (import stays light)
  from plugrad.device.registry import Device
  dev = Device[q.device]
  lead = lead or (1,)
  B, H = prod(lead[:-1]), lead[-1]
  m, flags = _mask_layout(mask, lead, L, S) if mask is not None else (None, None)
  shape = AttentionShape(B, H, L, S, E, Ev, q.dtype, flags, causal, scale)
  prg = attention_program(shape, dev.renderer)
  register_kernel_gradient(prg, _backward_rule(shape, dev.renderer))
  T = tensor_cls()
  out = T.empty(B * H, L, Ev, dtype=q.dtype, device=q.device)
  lse = T.empty(B * H, L, dtype=dtypes.float32, device=q.device)
  kt = k.reshape(B * H, S, E).transpose(1, 2).contiguous()
  launch_program(prg, out, lse, q.reshape(B * H, L, E), kt, v.reshape(B * H, S, Ev), *([m] if m is not None else []))
  return out.reshape(*q.shape[:-2], L, Ev)


def _backward_rule(sh: AttentionShape, renderer: Renderer) -> Callable[[UOp, int, UOp], Grads]:
  """The derivative of one launch (a realized output keeps no reference to its own buffer): dQ, dK and dV by the fused
  backward kernels where `_fused_backward` says so, else all by `_plain_grads`; a float mask's gradient always by
  `_plain_grads` (lazy: computed only when the mask requires it)."""
  def rule(kernel: UOp, slot: int, g: UOp) -> Grads:
    T = tensor_cls()
    if slot != 0: return (None,) * len(kernel.src)  # lse is an internal output: nothing outside uses it
    _, _, q, kt, v, *masks = (T._wrap(s) for s in kernel.src)
    do, mask = T._wrap(g), masks[0] if masks else None
    if not _fused_backward(sh, renderer): return _plain_grads(sh, q, kt, v, mask, do)
    # the forward's output and log-sum-exp, unless this is the origin of a realized output (their buffers are constants there)
    outs = [T._wrap(UOp(Ops.AFTER, s.dtype, (s, kernel))) for s in kernel.src[:2]] if all(map(is_buffer_form, kernel.src[:2])) else None
    dmask = _plain_grads(sh, q, kt, v, mask, do)[5:] if mask is not None else ()
    return (None, None, *_fused_grads(sh, renderer, q, kt, v, mask, do, outs), *dmask)
  return rule


def _fused_grads(sh: AttentionShape, renderer: Renderer, q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None, do: Tensor,
                 outs: list[Tensor] | None) -> tuple[UOp, ...]:
  """(dQ, dKᵀ, dV) by the backward kernels (codegen/attention_backward.py), with the transposed copies they read. With
  the forward's (output, log-sum-exp) `outs`, D = rowsum(dO∘O) and the base-2 log-sum-exp are given to the dQ kernel;
  without, it computes them in a first pass over the keys."""
  from plugrad.codegen.attention import LOG2E, attention_program
  T = tensor_cls()
  BH, L, S, E, Ev, dt = sh.B * sh.H, sh.L, sh.S, sh.E, sh.Ev, sh.dtype
  do = do.cast(dt).reshape(BH, L, Ev)
  k = kt.transpose(1, 2).contiguous()
  dq = T.empty(BH, L, E, dtype=dt, device=q.device)
  m = [mask] if mask is not None else []
  kv = (q, kt, k, v.transpose(1, 2).contiguous(), do, *m)
  if outs is not None:
    lse2, dsum = outs[1] * LOG2E, (do.float() * outs[0].float()).sum(-1)
    launch_program(attention_program(sh, renderer, "backward_q_stats"), dq, lse2, dsum, *kv)
  else:
    lse2, dsum = T.empty(BH, L, device=q.device), T.empty(BH, L, device=q.device)
    launch_program(attention_program(sh, renderer, "backward_q"), dq, lse2, dsum, *kv)
  if mask is not None and sh.mask_dims[2]: m = [mask.transpose(-1, -2).contiguous()]  # the keys' queries contiguous
  dk, dv = T.empty(BH, S, E, dtype=dt, device=q.device), T.empty(BH, S, Ev, dtype=dt, device=q.device)
  launch_program(attention_program(sh, renderer, "backward_kv"), dk, dv, k, q.transpose(1, 2).contiguous(), v, do.transpose(1, 2).contiguous(),
                 q, do, lse2, dsum, *m)
  return dq.uop, dk.transpose(1, 2).uop, dv.uop


def _plain_grads(sh: AttentionShape, q: Tensor, kt: Tensor, v: Tensor, mask: Tensor | None, do: Tensor) -> tuple[UOp | None, ...]:
  """The launch's gradients by ordinary tensor ops: with P = softmax(q·kᵀ·scale + mask) recomputed once in memory,
  dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − rowsum(P∘dP)), dQ = dS·K·scale, dKᵀ = (Qᵀ·dS)·scale, dmask = dS summed over its
  broadcast dims (a float mask only)."""
  T = tensor_cls()
  do, qf, ktf, vf = do.float(), q.float(), kt.float(), v.float()
  s = (qf @ ktf) * sh.scale
  if mask is not None: s = (s.reshape(sh.B, sh.H, sh.L, sh.S) + mask).reshape(sh.B * sh.H, sh.L, sh.S)
  if sh.causal: s = T.ones(sh.L, sh.S, dtype=dtypes.bool, device=q.device).tril().where(s, -math.inf)
  # P and dS once each in memory: fused into the products' operands they would be recomputed per multiply-add
  p = s.softmax(-1).contiguous()
  dv = p.transpose(1, 2) @ do
  dp = do @ vf.transpose(1, 2)
  ds = (p * (dp - (p * dp).sum(-1, keepdim=True))).contiguous()
  dq, dkt = (ds @ ktf.transpose(1, 2)) * sh.scale, (qf.transpose(1, 2) @ ds) * sh.scale
  grads: list[UOp | None] = [None, None, dq.cast(q.dtype).uop, dkt.cast(kt.dtype).uop, dv.cast(v.dtype).uop]
  if mask is not None:
    dm = ds.reshape(sh.B, sh.H, sh.L, sh.S)
    keep = tuple(d for d, n in zip((0, 1, 2), mask.shape[:3]) if n == 1)
    grads.append((dm.sum(keep, keepdim=True) if keep else dm).reshape(mask.shape).uop)
  return tuple(grads)
