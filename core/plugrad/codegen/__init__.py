"""The codegen pipeline: kernel AST (stage 2) → PROGRAM UOp, grown stage by stage and checked by the spec.

    optimize (actions: given, KernelInfo.opts_to_apply, BEAM search or the hand-coded heuristics; docs/optimizer.md)
    → the passes (codegen/passes.py: one named list, a renderer's own at named points) → linearize → render

`get_program(ast, renderer)` returns the PROGRAM at the SOURCE stage; the device's compiler adds the BINARY.
`DEBUG=2` prints each new kernel's applied actions and estimates, `DEBUG=4` the source, `DEBUG=5` the AST.
Given a `ProgramStore` (the engine passes the compile cache's), a PROGRAM is also kept across processes, keyed by
the AST, the renderer, the actions, every setting and the code that made it (`store_key`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import plugrad.trace as trace
from plugrad.codegen.opt import BEAM, NOOPT, Opt, Scheduler, hand_coded_optimizations
from plugrad.codegen.opt.search import CandidateTimer
from plugrad.codegen.passes import lower
from plugrad.helpers import DEBUG, MAX_LOADED_KERNELS, ContextVar, LRUCache
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import KernelInfo, Ops, UOp
from plugrad.uop.program import ProgramUOp, make_program
from plugrad.uop.serial import dumps_uop, loads_uop
from plugrad.uop.spec import maybe_check

_cache: LRUCache[tuple, ProgramUOp] = LRUCache(MAX_LOADED_KERNELS)  # bounded: a long run with new shapes stays flat
codegen_seconds = [0.0]  # total time spent here (the benchmark reads it)


def optimize(ast: UOp, renderer: Renderer, opts: Sequence[Opt] | None = None, timer: Callable[[Renderer], CandidateTimer] | None = None) -> UOp:
  """The optimized AST: `opts` when given, else the AST's `KernelInfo.opts_to_apply`, else BEAM search when BEAM > 0
  (candidates timed by `timer(renderer)`: the device layer passes its own), else the hand-coded heuristics (none with
  NOOPT=1). The applied actions are in the result's KernelInfo."""
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  if opts is None and info.opts_to_apply is not None: opts = tuple(info.opts_to_apply)
  k = Scheduler(ast.replace(arg=KernelInfo(info.name, (), None, info.dont_use_locals)), renderer)
  if opts is not None: k.apply_opts(list(opts))
  elif BEAM.value >= 1 and not info.applied_opts:
    from plugrad.codegen.opt.search import beam_search
    k = beam_search(k, BEAM.value, timer)
  elif not NOOPT: k = hand_coded_optimizations(k)
  return k.get_optimized_ast()


def linear_program(ast: UOp, renderer: Renderer, opts: Sequence[Opt] | None = None, device: str | None = None,
                   timer: Callable[[Renderer], CandidateTimer] | None = None) -> ProgramUOp:
  """The PROGRAM of kernel `ast` at the LINEAR stage (for `device`, default the renderer's): optimized, then through the
  codegen passes. A kernel written in lowered form (`KernelInfo.entry_pass`) skips the optimizer and joins the passes
  at its entry; its PROGRAM's kernel AST is empty (its registers and loops are explicit: nothing may optimize or lower
  it again), its LINEAR complete, so any renderer can render it."""
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  if info.entry_pass: return make_program(UOp(Ops.SINK, ast.dtype, (), info), device or renderer.device).with_linear(lower(ast, renderer))
  maybe_check("kernel", ast)
  if DEBUG >= 5: print(ast)
  opt_ast = optimize(ast, renderer, opts, timer)
  if trace.TRACING: trace.stage("optimized", opt_ast)
  return make_program(opt_ast, device or renderer.device).with_linear(lower(opt_ast, renderer))


def renderer_key(renderer: Renderer) -> tuple:
  """What makes two renderers give different kernels for one AST: a program cache's key part. `arch`: a GPU backend's
  target (CUDA sm_80/sm_90, AMD gfx942/gfx1100): one device name, different kernels."""
  return (type(renderer), renderer.device, getattr(renderer, "emulate", None), getattr(renderer, "arch", None))


class ProgramStore(Protocol):
  """Where PROGRAMs outlive the process: bytes by key (the device layer's compile cache implements it)."""
  def get(self, key: str) -> bytes | None: ...
  def put(self, key: str, blob: bytes) -> None: ...


_code_digests: dict[str, str] = {}


def _code_digest(module: str) -> str:
  """A digest of every .py file of the package holding `module` (plugrad's own, a plugin's): a program made by other
  code is another program."""
  pkg = module.split(".")[0]
  if (d := _code_digests.get(pkg)) is None:
    h, mod = hashlib.sha256(), sys.modules.get(pkg)
    if (f := getattr(mod, "__file__", None)) is not None:
      # a package: all of it; a lone module (a script's __main__): that file only, not the folder it sits in
      files = sorted(Path(f).parent.rglob("*.py")) if hasattr(mod, "__path__") else [Path(f)]
      for p in files: h.update(str(p.relative_to(Path(f).parent)).encode() + b"\0" + p.read_bytes())
    d = _code_digests[pkg] = h.hexdigest()
  return d


def _canon(v: object) -> str:
  """A repr that is the same in every process: sets sorted (their order follows the per-process string hash), the
  fields of dataclasses and the items of containers in canonical form too."""
  if isinstance(v, (set, frozenset)): return "{" + ", ".join(sorted(_canon(x) for x in v)) + "}"
  if isinstance(v, (tuple, list)): return type(v).__name__ + "(" + ", ".join(_canon(x) for x in v) + ")"
  if isinstance(v, dict): return "{" + ", ".join(sorted(f"{_canon(k)}: {_canon(x)}" for k, x in v.items())) + "}"
  if dataclasses.is_dataclass(v) and not isinstance(v, type):
    return type(v).__name__ + "(" + ", ".join(f"{f.name}={_canon(getattr(v, f.name))}" for f in dataclasses.fields(v)) + ")"
  return repr(v)


def store_key(ast: UOp, renderer: Renderer, opts: Sequence[Opt] | None) -> str:
  """The persistent key of a PROGRAM: the AST, the renderer (kind and every attribute: vector width, target CPU, ...),
  the actions, every setting (the context variables and PACK_BUDGET) and the code of plugrad and of the renderer's
  package."""
  from plugrad.codegen.opt.heuristic import PACK_BUDGET
  settings = sorted((k, _canon(v.value)) for k, v in ContextVar._registry.items())
  attrs = sorted((k, _canon(v)) for k, v in vars(renderer).items())
  h = hashlib.sha256(dumps_uop(ast))
  for part in (renderer_key(renderer), attrs, None if opts is None else tuple(opts), settings, PACK_BUDGET, os.environ.get("EMULATE", ""),
               _code_digest(__name__), _code_digest(type(renderer).__module__)):
    h.update(repr(part).encode())
  return h.hexdigest()


def _stored(store: ProgramStore, key: str, renderer: Renderer) -> ProgramUOp | None:
  if (blob := store.get(key)) is None: return None
  try: prg: ProgramUOp = loads_uop(blob)  # type: ignore[assignment]
  except Exception: return None  # written by another version of a dependency (a dtype, an enum): made again
  return prg if prg.op is Ops.PROGRAM and prg.stage == "source" and prg.device == renderer.device else None


def get_program(ast: UOp, renderer: Renderer, opts: Sequence[Opt] | None = None,
                timer: Callable[[Renderer], CandidateTimer] | None = None, store: ProgramStore | None = None) -> ProgramUOp:
  """The PROGRAM for kernel `ast` on `renderer`'s device, rendered (cached per AST, renderer kind and actions; with a
  `store` also across processes, except while tracing or printing the codegen: DEBUG>=2, VIZ, process replay)."""
  if ast.op is not Ops.SINK: raise TypeError(f"get_program needs a kernel AST (a SINK), got {ast.op!r}")
  key = (ast, *renderer_key(renderer), None if opts is None else tuple(opts), BEAM.value, NOOPT.value)
  if (hit := _cache.get(key)) is not None: return hit
  skey = store_key(ast, renderer, opts) if store is not None and not trace.TRACING and DEBUG < 2 else None
  if store is not None and skey is not None and (prg := _stored(store, skey, renderer)) is not None:
    _cache[key] = prg
    return prg
  start = time.perf_counter()
  rec = trace.kernel_begin(ast, renderer, opts) if trace.TRACING else None  # VIZ, process replay (plugrad/trace.py)
  try:
    prg = linear_program(ast, renderer, opts, timer=timer)
    prg = prg.with_source(renderer.render(prg))
  finally:
    if rec is not None and rec.program is None: trace.kernel_abort(rec)
  codegen_seconds[0] += time.perf_counter() - start
  if rec is not None: trace.kernel_end(rec, prg, time.perf_counter() - start)
  if DEBUG >= 2:
    e = prg.estimates
    print(f"codegen {prg.name:<24} opts {list(prg.applied_opts)}  flops {e.ops}  bytes {e.mem}  traffic {e.lds}  local bytes {e.local_bytes}")
  if DEBUG >= 4: print(prg.source)
  _cache[key] = prg
  if store is not None and skey is not None: store.put(skey, dumps_uop(prg))
  return prg
