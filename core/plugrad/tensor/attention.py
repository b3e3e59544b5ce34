"""`scaled_dot_product_attention` through the fused kernel (`codegen/attention.py`): the scores and probabilities never
reach memory in the forward pass. The launch is a KERNEL node of the lazy graph (scheduled, batched and replayed by
TinyJit like any kernel) with a registered derivative: the backward recomputes the probabilities from the saved
log-sum-exp per row with ordinary tensor ops (one (B, H, L, S) buffer, as PyTorch's memory-efficient backward keeps).

`FLASH_ATTENTION`: 1 uses the fused kernel wherever it applies, 0 never; the default (2) uses it on every device with
workgroups (GPUs, where the scores' round trip through memory is the cost) and, on a CPU, where the plain formula's
float32 (B, H, L, S) scores would take more than `FLASH_MIN_SCORES` bytes: below that the three-kernel formula is
faster on a CPU (its q·kᵀ and P·v run as tuned matmuls; the fused kernel is 1.3-1.9x slower there), above it the
fused kernel keeps memory flat (4x12x1024² causal: 293 MB peak instead of 971 MB).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from plugrad.dtype import dtypes
from plugrad.gradient import Grads, register_kernel_gradient
from plugrad.helpers import ContextVar, prod
from plugrad.tensor.custom import launch_program
from plugrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
  from plugrad.codegen.attention import AttentionShape
  from plugrad.tensor.tensor import Tensor

FLASH_ATTENTION = ContextVar("FLASH_ATTENTION", 2, (0, 1, 2))
FLASH_MIN_SCORES = 256 << 20  # bytes of float32 scores above which a CPU takes the fused kernel (FLASH_ATTENTION=2)
_FUSED_DTYPES = (dtypes.float32, dtypes.float16)


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
  formula): FLASH_ATTENTION=0, dtypes other than float32/float16 or mixed, symbolic shapes, or (under the default) a
  CPU with scores that fit in FLASH_MIN_SCORES. q (..., L, E), k (..., S, E), v (..., S, Ev) with equal leading dims."""
  mode = FLASH_ATTENTION.value
  if mode == 0 or q.dtype not in _FUSED_DTYPES or k.dtype is not q.dtype or v.dtype is not q.dtype or q.ndim < 2: return None
  if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2] or not all(isinstance(d, int) for d in (*q.shape, *k.shape, *v.shape)): return None
  qs, vs = tuple(d for d in q.shape if isinstance(d, int)), tuple(d for d in v.shape if isinstance(d, int))  # all ints (above)
  lead, (L, E), (S, Ev) = qs[:-2], qs[-2:], vs[-2:]
  if 0 in (*lead, L, E, S, Ev): return None
  from plugrad.codegen.attention import AttentionShape, attention_program  # the codegen loads on first use (import stays light)
  from plugrad.device.registry import Device
  dev = Device[q.device]
  if mode == 2 and not dev.renderer.has_local and prod(lead) * L * S * 4 <= FLASH_MIN_SCORES: return None
  lead = lead or (1,)
  B, H = prod(lead[:-1]), lead[-1]
  m, flags = _mask_layout(mask, lead, L, S) if mask is not None else (None, None)
  shape = AttentionShape(B, H, L, S, E, Ev, q.dtype, flags, causal, scale)
  prg = attention_program(shape, dev.renderer)
  if prg not in _registered: register_kernel_gradient(prg, _backward_rule(shape)); _registered.add(prg)
  from plugrad.tensor.tensor import Tensor
  out = Tensor.empty(B * H, L, Ev, dtype=q.dtype, device=q.device)
  lse = Tensor.empty(B * H, L, dtype=dtypes.float32, device=q.device)
  kt = k.reshape(B * H, S, E).transpose(1, 2).contiguous()
  launch_program(prg, out, lse, q.reshape(B * H, L, E), kt, v.reshape(B * H, S, Ev), *([m] if m is not None else []))
  return out.reshape(*q.shape[:-2], L, Ev)


_registered: set[UOp] = set()


def _backward_rule(sh: AttentionShape) -> Callable[[UOp, int, UOp], Grads]:
  """The derivative of one launch: with P = exp(q·kᵀ·scale + mask - lse) recomputed, dV = Pᵀ·dO, dS = P∘(dO·Vᵀ - rowsum(dO∘O)),
  dQ = dS·K·scale, dKᵀ = (Qᵀ·dS)·scale, dmask = dS summed over its broadcast dims (a float mask only)."""
  def rule(kernel: UOp, slot: int, g: UOp) -> Grads:
    from plugrad.tensor.tensor import Tensor
    if slot != 0: return (None,) * len(kernel.src)  # lse is an internal output: nothing outside uses it
    out_buf, lse_buf, q, kt, v, *mask = (Tensor._wrap(s) for s in kernel.src)
    o, lse = Tensor._wrap(UOp(Ops.AFTER, out_buf.dtype, (out_buf.uop, kernel))), Tensor._wrap(UOp(Ops.AFTER, dtypes.float32, (lse_buf.uop, kernel)))
    do = Tensor._wrap(g).float()
    qf, ktf, vf = q.float(), kt.float(), v.float()
    s = (qf @ ktf) * sh.scale
    if mask: s = (s.reshape(sh.B, sh.H, sh.L, sh.S) + mask[0]).reshape(sh.B * sh.H, sh.L, sh.S)
    if sh.causal: s = Tensor.ones(sh.L, sh.S, dtype=dtypes.bool, device=q.device).tril().where(s, -math.inf)
    # P and dS once each in memory: fused into the products' operands they would be recomputed per multiply-add
    p = (s - lse.unsqueeze(-1)).exp().contiguous()
    dv = p.transpose(1, 2) @ do
    ds = (p * ((do @ vf.transpose(1, 2)) - (do * o.float()).sum(-1, keepdim=True))).contiguous()
    dq, dkt = (ds @ ktf.transpose(1, 2)) * sh.scale, (qf.transpose(1, 2) @ ds) * sh.scale
    grads: list[UOp | None] = [None, None, dq.cast(q.dtype).uop, dkt.cast(kt.dtype).uop, dv.cast(v.dtype).uop]
    if mask:
      dm = ds.reshape(sh.B, sh.H, sh.L, sh.S)
      keep = tuple(d for d, n in zip((0, 1, 2), mask[0].shape[:3]) if n == 1)
      grads.append((dm.sum(keep, keepdim=True) if keep else dm).reshape(mask[0].shape).uop)
    return tuple(grads)
  return rule
