"""The memory planner: the intermediate buffers of a captured function share a few allocations by liveness.

A buffer is live from the first launch that touches it to the last. Two buffers whose live ranges do not overlap can
use the same memory, so the planner places every intermediate at a byte offset of one arena per device (biggest
first, at the lowest offset that collides with no placed buffer live at the same time). A device whose allocator
cannot make views reuses whole buffers of the same dtype instead.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from plugrad.device.allocator import BufferSpec
from plugrad.device.buffer import Buffer
from plugrad.dtype import dtypes

ALIGN = 256  # bytes: every planned buffer starts at a multiple (wide vector loads, GPU storage-buffer offsets)


@dataclass(repr=False)
class MemoryPlan:
  """`replace` maps each planned buffer to the buffer (or arena view) that takes its place; the byte figures count
  planned buffers only: `bytes_before` is their sum, `bytes_after` what the plan allocates."""
  replace: dict[Buffer, Buffer] = field(default_factory=dict)
  bytes_before: int = 0
  bytes_after: int = 0

  def __str__(self) -> str:
    saved = 1 - self.bytes_after / self.bytes_before if self.bytes_before else 0.0
    return (f"memory planner: {len(self.replace)} intermediate buffers, {self.bytes_before:,} -> {self.bytes_after:,} bytes "
            f"({saved:.0%} saved)")

  __repr__ = __str__


def _round(n: int) -> int: return (n + ALIGN - 1) // ALIGN * ALIGN


def live_ranges(launches: Sequence[Iterable[Buffer]], buffers: Iterable[Buffer]) -> dict[Buffer, tuple[int, int]]:
  """(first, last) launch index that uses each of `buffers` (launches given as their buffer lists)."""
  want = set(buffers)
  ranges: dict[Buffer, tuple[int, int]] = {}
  for j, bufs in enumerate(launches):
    for b in bufs:
      if b in want: ranges[b] = (ranges[b][0], j) if b in ranges else (j, j)
  return ranges


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool: return a[0] <= b[1] and b[0] <= a[1]


def _place(ranges: dict[Buffer, tuple[int, int]]) -> tuple[dict[Buffer, int], int]:
  """Byte offsets for `ranges`' buffers such that buffers live at the same time never share bytes; and the arena size."""
  placed: list[tuple[int, int, tuple[int, int]]] = []  # (offset, nbytes, live range)
  offsets: dict[Buffer, int] = {}
  for b in sorted(ranges, key=lambda b: (-b.nbytes, ranges[b])):
    size, live = _round(max(b.nbytes, 1)), ranges[b]
    busy = sorted((o, o + n) for o, n, r in placed if _overlap(r, live))
    off = 0
    for start, end in busy:
      if off + size <= start: break
      off = max(off, end)
    offsets[b] = off
    placed.append((off, size, live))
  return offsets, max((offsets[b] + b.nbytes for b in offsets), default=0)


def _reuse(ranges: dict[Buffer, tuple[int, int]]) -> dict[Buffer, Buffer]:
  """Without views: each buffer takes a whole earlier buffer of its dtype that is dead by then and big enough."""
  out: dict[Buffer, Buffer] = {}
  free: list[tuple[Buffer, int]] = []  # (buffer, last use of what it holds now)
  for b in sorted(ranges, key=lambda b: ranges[b]):
    first, last = ranges[b]
    fit = [i for i, (f, end) in enumerate(free) if end < first and f.dtype is b.dtype and f.size >= b.size and f.options == b.options]
    if fit:
      i = min(fit, key=lambda i: free[i][0].size)
      out[b] = free[i][0]
      free[i] = (free[i][0], last)
    else:
      out[b] = b
      free.append((b, last))
  return out


def plan_memory(launches: Sequence[Sequence[Buffer]], buffers: Iterable[Buffer]) -> MemoryPlan:
  """Plan `buffers` (intermediates: nobody outside the launches holds them) over `launches` (each launch's buffers,
  in order). The returned replacements are new, unallocated buffers; the originals can be dropped."""
  ranges = live_ranges(launches, buffers)
  plan = MemoryPlan(bytes_before=sum(b.nbytes for b in ranges))
  groups: dict[tuple[str, BufferSpec | None], dict[Buffer, tuple[int, int]]] = {}
  for b, r in ranges.items(): groups.setdefault((b.device, b.options), {})[b] = r
  for (device, options), group in groups.items():
    first = next(iter(group))
    if first.allocator.supports_views:
      offsets, size = _place(group)
      arena = Buffer(device, size, dtypes.uint8, options)
      plan.replace.update({b: arena.view(b.size, b.dtype, offsets[b]) for b in group})
      plan.bytes_after += size
    else:
      reuse = _reuse(group)
      fresh = {orig: Buffer(device, orig.size, orig.dtype, options) for orig in set(reuse.values())}
      plan.replace.update({b: fresh[reuse[b]] for b in group})
      plan.bytes_after += sum(b.nbytes for b in fresh.values())
  return plan

