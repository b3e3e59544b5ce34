"""BEAM search (`BEAM=n`): find the actions that make a kernel fastest on the real device.

Each step extends every kernel in the beam by one more action from `ACTIONS` (the invalid ones raise KernelOptError
and are dropped), lowers and renders the new candidates here, compiles them in parallel worker processes (each
compile under BEAM_TIMEOUT seconds), times them on the device with real buffers and keeps the `n` fastest (the beam
itself stays in the running, so the search stops when a step finds nothing faster). Every timed candidate, the
hand-coded seed too, is run once more on the search's own inputs and must give the unoptimized kernel's numbers: one
that does not (an optimizer or compiler bug) is dropped before it can win or seed the next step, and counted
(`stats["wrong"]`; listed at DEBUG>=2). The chosen actions are kept on disk per (renderer, kernel, n), signed like the
compile cache (plugrad/diskcache.py), so the next run applies them at once.

Timing needs the device layer (buffers, compiler, runtime), which sits above the codegen: the caller passes a
`CandidateTimer` factory (the engine passes `plugrad.device.search.DeviceTimer`); nothing is registered by import.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import plugrad.diskcache as diskcache
from plugrad.codegen.opt.kernel import KernelOptError, Opt, OptOps, Scheduler
from plugrad.helpers import DEBUG, getenv
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import UOp
from plugrad.uop.program import ProgramUOp, make_program


class BeamError(RuntimeError):
  """BEAM search cannot run (no timer for the device) or found no candidate that runs correctly."""


class CandidateTimer(Protocol):
  def compile_all(self, programs: list[ProgramUOp], timeout: float) -> list[bytes | None]:
    """Each program's binary (None: it failed or took longer than `timeout` seconds), compiled in parallel."""
  def time(self, program: ProgramUOp, limit: float) -> float:
    """Seconds one launch takes on real buffers (the best of a few runs; a first run slower than `limit` stops early)."""
  def same_results(self, program: ProgramUOp, reference: ProgramUOp) -> bool:
    """Whether both give the same outputs on the inputs `time` runs them on."""


ACTIONS: list[Opt] = [Opt(OptOps.TC, 0)] + [Opt(OptOps.NOLOCALS)]
for _ax in range(6):
  ACTIONS += [Opt(OptOps.UPCAST, _ax, a) for a in (2, 3, 4, 6, 8, 16)] + [Opt(OptOps.LOCAL, _ax, a) for a in (2, 4, 8, 16, 32)]
  ACTIONS += [Opt(OptOps.THREAD, _ax, a) for a in (2, 4, 8)] + [Opt(OptOps.PADTO, _ax, 32)]
  ACTIONS += [Opt(OptOps.SWAP, _ax, b) for b in range(_ax + 1, 6)]
for _ax in range(4):
  ACTIONS += [Opt(OptOps.UNROLL, _ax, a) for a in (0, 2, 4, 8, 16, 32)] + [Opt(OptOps.GROUP, _ax, a) for a in (4, 8, 16, 32)]
  ACTIONS += [Opt(OptOps.GROUPTOP, _ax, a) for a in (16, 64, 256)]


def candidates(k: Scheduler) -> list[Scheduler]:
  """`k` extended by each action of `ACTIONS` that applies to it: one step of the search (the fuzzer samples these)."""
  out: list[Scheduler] = []
  for o in ACTIONS:
    c = k.copy()
    try: c.apply_opt(o)
    except KernelOptError: continue
    out.append(c)
  return out


def _program(k: Scheduler) -> ProgramUOp | None:
  from plugrad.codegen import lower
  ast = k.get_optimized_ast()
  try:
    p = make_program(ast, k.renderer.device).with_linear(lower(ast, k.renderer))
    return p.with_source(k.renderer.render(p))
  except Exception as e:  # a lowering bug must not end the search; it is reported and the candidate dropped
    if DEBUG >= 1: print(f"\nBEAM: {k.applied} failed to lower: {type(e).__name__}: {e}", file=sys.stderr)
    return None


def _cache_name(k: Scheduler, width: int) -> str:
  rd = k.renderer
  ident = "|".join([type(rd).__module__, type(rd).__name__, str(rd.device).split(":")[0], str(getattr(rd, "emulate", "")),
                    str(rd.vector_width), str(width), k.ast.to_python()])
  return hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json"


# an entry is "<HMAC hex>\n<JSON>" (plugrad/diskcache.py); anything else, bigger or nested deeper is a miss: a hostile
# or damaged file must not cost more than a read, nor crash the run (json recurses per nesting level)
_MAX_ENTRY, _MAX_DEPTH = 64 << 10, 4
_STALE_TMP_S = 600  # a BEAM cache .tmp this old belongs to a writer that died (a write takes milliseconds)


def _depth(text: str) -> int:
  depth = most = 0
  for ch in text:  # the format has no strings holding brackets: op names are identifiers
    if ch in "[{": most = max(most, depth := depth + 1)
    elif ch in "]}": depth -= 1
  return most


def cached_actions(k: Scheduler, width: int) -> list[Opt] | None:
  if (d := diskcache.secure_dir()) is None or (key := diskcache.secret(d)) is None: return None
  name = _cache_name(k, width)
  path = d / "beam" / name
  try:
    if path.stat().st_size > _MAX_ENTRY: return None
    mac, _, body = path.read_bytes().partition(b"\n")
    if not diskcache.valid(key, bytes.fromhex(mac.decode("ascii")), name.encode(), body): return None
    text = body.decode()
    if _depth(text) > _MAX_DEPTH: return None
    raw = json.loads(text)
    out = [Opt(OptOps[o], a, n) for o, a, n in raw]
    os.utime(path)  # its last use, for the LRU eviction in _store
  except (OSError, ValueError, UnicodeError, RecursionError, KeyError, TypeError): return None
  return out


def _store(k: Scheduler, width: int, opts: list[Opt]) -> None:
  if (d := diskcache.secure_dir()) is None or (key := diskcache.secret(d)) is None: return
  name = _cache_name(k, width)
  path = d / "beam" / name
  try:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    body = json.dumps([[o.op.name, o.axis, o.amount] for o in opts]).encode()
    tmp = path.with_suffix(f".{time.monotonic_ns()}.tmp")
    try:
      tmp.write_bytes(diskcache.digest(key, name.encode(), body).hex().encode() + b"\n" + body)
      tmp.replace(path)
    finally: tmp.unlink(missing_ok=True)  # a full disk fails the write after creating the file: leave nothing behind
    _evict(path.parent, diskcache.cap_bytes())
  except OSError as e:
    if DEBUG >= 1: print(f"BEAM: could not write the cache {path}: {e}", file=sys.stderr)


def _evict(beam: Path, cap: int) -> None:
  """Remove the least recently used entries (by mtime, touched on each hit) until the directory fits in `cap` bytes,
  and the .tmp files of writers that died between writing and renaming (older than _STALE_TMP_S)."""
  now = time.time()
  for e in os.scandir(beam):
    if e.name.endswith(".tmp"):
      with contextlib.suppress(OSError):
        if now - e.stat().st_mtime > _STALE_TMP_S: os.unlink(e.path)
  entries = sorted((e.stat().st_mtime, e.stat().st_size, e.path) for e in os.scandir(beam) if e.name.endswith(".json"))
  excess = sum(size for _, size, _ in entries) - cap
  for _, size, p in entries:
    if excess <= 0: break
    Path(p).unlink(missing_ok=True)
    excess -= size


stats = {"searches": 0, "cache_hits": 0, "candidates": 0, "wrong": 0}  # what BEAM did in this process (tests and the benchmark read it)


def beam_search(k: Scheduler, width: int, timer: Callable[[Renderer], CandidateTimer] | None = None) -> Scheduler:
  """The scheduler with the actions BEAM search chose for kernel `k` (a copy; `k` is not changed); `timer(renderer)`
  times candidates on the device (only needed when the disk cache has no entry)."""
  if getenv("BEAM_CACHE", 1) and (hit := cached_actions(k, width)) is not None:
    try:
      out = k.copy().apply_opts(hit)
      stats["cache_hits"] += 1
      return out
    except KernelOptError: pass  # a cache entry from an older optimizer: search again
  if timer is None:
    raise BeamError(f"BEAM search for kernel {k.info.name!r} needs a timer for the device layer to time candidates: pass "
                    "timer=plugrad.device.search.DeviceTimer (the engine does)")
  timing = timer(k.renderer)
  stats["searches"] += 1
  timeout, max_steps = float(getenv("BEAM_TIMEOUT", 10.0)), int(getenv("BEAM_STEPS", 3))
  show = sys.stderr.isatty() or DEBUG >= 1
  start, tried = time.perf_counter(), 0
  base = _program(k)
  if base is None: raise BeamError(f"kernel {k.info.name!r} does not lower without actions")
  (blib,) = timing.compile_all([base], timeout)
  if blib is None: raise BeamError(f"kernel {k.info.name!r} does not compile without actions")
  base = base.with_binary(blib)
  wrong: list[list[Opt]] = []

  def correct(c: Scheduler, p: ProgramUOp) -> bool:
    # a candidate that computes something else must neither win nor seed the next step: checked as soon as it is timed
    if timing.same_results(p, base): return True
    wrong.append(list(c.applied))
    return False

  # the search starts from the hand-coded choice (timing unoptimized candidates of a big kernel would take minutes);
  # the unoptimized kernel is the reference for the correctness check
  from plugrad.codegen.opt.heuristic import hand_coded_optimizations
  seed = hand_coded_optimizations(k.copy())
  sp = _program(seed) if seed.applied else None
  slib = timing.compile_all([sp], timeout)[0] if sp is not None else None
  first, fprog = (seed, sp.with_binary(slib)) if sp is not None and slib is not None else (k, base)
  if first is not k and not correct(first, fprog): first, fprog = k, base
  best_t = timing.time(fprog, math.inf)
  timed: list[tuple[float, Scheduler, ProgramUOp]] = [(best_t, first, fprog)]
  beam = list(timed)
  seen: set[UOp] = {k.ast, first.ast}
  for step in range(max_steps):
    kids = [c for _, b, _ in beam for c in candidates(b)]
    kids = [c for c in kids if not (c.ast in seen or seen.add(c.ast))]  # type: ignore[func-returns-value]
    progs = [(c, p) for c in kids if (p := _program(c)) is not None]
    libs = timing.compile_all([p for _, p in progs], timeout)
    step_timed: list[tuple[float, Scheduler, ProgramUOp]] = []
    for (c, p), lib in zip(progs, libs):
      if lib is None: continue
      tried += 1
      pb = p.with_binary(lib)
      try:
        t = timing.time(pb, 1.5 * beam[0][0])
        if not correct(c, pb): continue
      except Exception as e:
        if DEBUG >= 1: print(f"\nBEAM: {c.applied} failed to run: {type(e).__name__}: {e}", file=sys.stderr)
        continue
      step_timed.append((t, c, pb))
      if show: print(f"\rBEAM {k.info.name}: step {step + 1}, {tried} candidates, best {min(x[0] for x in timed + step_timed) * 1e6:9.1f} us, "
                     f"{time.perf_counter() - start:6.1f} s", end="", file=sys.stderr, flush=True)
    stats["candidates"] += len(progs)
    timed += step_timed
    new_beam = sorted(beam + step_timed, key=lambda x: x[0])[:width]
    if new_beam[0][0] >= beam[0][0] * 0.99 and step > 0: break
    beam = new_beam
  if show: print(file=sys.stderr)
  stats["wrong"] += len(wrong)
  if wrong and DEBUG >= 2:
    print(f"BEAM {k.info.name}: dropped {len(wrong)} candidate(s) whose results differ from the unoptimized kernel's: "
          + "; ".join(str(w) for w in wrong), file=sys.stderr)
  t, c, _ = min(timed, key=lambda x: x[0])
  if DEBUG >= 1: print(f"BEAM {k.info.name}: {c.applied} {t * 1e6:.1f} us (hand-coded {best_t * 1e6:.1f} us)", file=sys.stderr)
  if getenv("BEAM_CACHE", 1): _store(k, width, c.applied)
  return c.copy()
