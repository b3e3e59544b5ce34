"""Tracing and profiling: what the compiler did to each kernel and how long each launch ran.

One mechanism serves three tools: `DEBUG>=2` (a timed line per launch, a summary at exit), VIZ (`VIZ=1`: every
get_program with its stages, graph_rewrite passes and fired rules, every launch, the JIT's memory plans; docs/viz.md)
and process replay (`PLUGRAD_REPLAY_DB`: every get_program input to sqlite; docs/replay.md).

It is off by default and costs one module-attribute test when off: `get_program`, `graph_rewrite` and the launch path
check `trace.TRACING` (and launches `DEBUG`) once per call before doing anything else here. While on, the hooks record
UOps by reference; they are turned into JSON only when the trace is saved.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugrad.helpers import DEBUG, SettingsError, parse_setting

TRACING = False          # the one flag the codegen hooks test; True while VIZ records or a replay database is set
TIMELINE = False         # launches wait and are timed for VIZ's timeline (DEBUG>=2 times them too)
MAX_STEPS = 2000         # rewrite steps kept per pass (the rest are counted): a runaway pass must not fill memory
_T0 = time.perf_counter()


def _setting(key: str, default: Any, choices: Sequence[Any] | None = None) -> tuple[Any, SettingsError | None]:
  try: return parse_setting(key, os.environ.get(key), default, choices), None
  except SettingsError as e: return default, e


VIZ, _viz_error = _setting("VIZ", 0, (0, 1, 2))
VIZ_PORT, _port_error = _setting("VIZ_PORT", 8128)
REPLAY_DB: str = os.environ.get("PLUGRAD_REPLAY_DB", "").strip()
_pending_error = _viz_error or _port_error  # raised at the first kernel (settings fail where first used, not at import)


def default_trace_file() -> str:
  """Where VIZ saves a run's trace unless VIZ_FILE says otherwise (and what `python -m plugrad viz` opens by default)."""
  user = os.getuid() if hasattr(os, "getuid") else 0
  return os.environ.get("VIZ_FILE", "").strip() or os.path.join(tempfile.gettempdir(), f"plugrad-trace-{user}.json")


# ---- records

@dataclass
class Pass:
  """One graph_rewrite call inside a kernel's codegen: `steps` are (rule, before, after) with the UOps by reference."""
  name: str
  phase: str
  input: Any
  output: Any = None
  steps: list[tuple[Any, Any, Any]] = field(default_factory=list)
  dropped: int = 0


@dataclass
class KernelRecord:
  """One get_program: its inputs, the graphs of its stages, its passes and the PROGRAM it returned."""
  order: int
  ast: Any
  renderer: Any
  opts: tuple[Any, ...] | None
  stages: list[tuple[str, Any]] = field(default_factory=list)
  passes: list[Pass] = field(default_factory=list)
  phase: str = "optimize"
  program: Any = None
  seconds: float = 0.0
  settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Launch:
  name: str
  device: str
  start: float      # seconds since the trace began
  seconds: float
  global_size: tuple[int, ...] = ()
  local_size: tuple[int, ...] = ()
  ops: int = 0
  mem: int = 0
  kind: str = "kernel"  # kernel | graph | copy
  kernel: int | None = None  # index into Trace.kernels


@dataclass
class MemoryRecord:
  jit: str
  launches: list[str]
  buffers: list[dict[str, Any]]
  bytes_before: int
  bytes_after: int


class Trace:
  def __init__(self, graphs: bool):
    self.graphs = graphs  # keep stages and passes (VIZ); without it only the replay recorder sees kernels
    self.kernels: list[KernelRecord] = []
    self.launches: list[Launch] = []
    self.memory: list[MemoryRecord] = []
    self.kernel_of: dict[Any, int] = {}  # optimized kernel AST -> index in `kernels` (launches name their kernel by it)
    self.lock = threading.Lock()
    self.started = time.time()


_trace: Trace | None = None
_local = threading.local()  # this thread's stack of kernels being compiled (a nested get_program gets its own record)
_order = [0]
_replay_recorder: Callable[[KernelRecord], None] | None = None


def enable(graphs: bool = True) -> Trace:
  """Turn tracing on (VIZ does this at import); returns the trace being recorded."""
  global TRACING, TIMELINE, _trace
  if _trace is None: _trace = Trace(graphs)
  else: _trace.graphs |= graphs
  TRACING, TIMELINE = True, _trace.graphs
  return _trace


def disable() -> Trace | None:
  """Turn tracing off and return what was recorded (a replay recorder stays off too)."""
  global TRACING, TIMELINE, _trace, _replay_recorder
  out, _trace, _replay_recorder, TRACING, TIMELINE = _trace, None, None, False, False
  return out


def current() -> Trace | None: return _trace


def set_replay_recorder(fn: Callable[[KernelRecord], None] | None) -> None:
  global _replay_recorder
  _replay_recorder = fn
  if fn is not None: enable(graphs=False)


def _stack() -> list[KernelRecord]:
  if (s := getattr(_local, "stack", None)) is None: s = _local.stack = []
  return s


# ---- codegen hooks (called only while TRACING)

def kernel_begin(ast: Any, renderer: Any, opts: Sequence[Any] | None) -> KernelRecord:
  if _pending_error is not None: raise SettingsError(str(_pending_error))
  from plugrad.helpers import ContextVar
  settings = {}
  for k, v in ContextVar._registry.items():
    try: settings[k] = v.value
    except SettingsError: pass
  with (_trace.lock if _trace is not None else threading.Lock()):
    _order[0] += 1
    rec = KernelRecord(_order[0], ast, renderer, None if opts is None else tuple(opts), settings=settings)
  rec.stages.append(("ast", ast))
  _stack().append(rec)
  return rec


def stage(name: str, u: Any) -> None:
  """The kernel being compiled reached stage `name` with graph `u` (later passes are counted in this phase)."""
  if (s := _stack()) and _trace is not None and _trace.graphs:
    s[-1].stages.append((name, u))
    s[-1].phase = name


def kernel_end(rec: KernelRecord, program: Any, seconds: float) -> None:
  s = _stack()
  if s and s[-1] is rec: s.pop()
  rec.program, rec.seconds = program, seconds
  if _trace is not None and _trace.graphs:
    rec.stages.append(("linear", program))
    with _trace.lock:
      _trace.kernel_of.setdefault(program.ast, len(_trace.kernels))
      _trace.kernels.append(rec)
  if _replay_recorder is not None and not s: _replay_recorder(rec)  # only what callers asked for, not BEAM's inner candidates


def kernel_abort(rec: KernelRecord) -> None:
  s = _stack()
  if s and s[-1] is rec: s.pop()


class RecordingMatcher:
  """Stands in for a PatternMatcher in one graph_rewrite: applies the same rules in the same order (through the
  matcher's compiled or interpreted functions) and records which rule fired on which node."""
  def __init__(self, pm: Any, p: Pass):
    self.pm, self.p, self.pdict = pm, p, pm.pdict

  def rewrite(self, uop: Any, ctx: Any = None) -> Any:
    for fn, rule in self.pdict.get(uop.op, ()):
      if (r := fn(uop, ctx)) is not None:
        if r is not uop:
          if len(self.p.steps) < MAX_STEPS: self.p.steps.append((rule, uop, r))
          else: self.p.dropped += 1
        return r
    return None

  def firing_rule(self, uop: Any, ctx: Any = None) -> Any: return self.pm.firing_rule(uop, ctx)


def rewrite_begin(pm: Any, sink: Any, name: str | None) -> RecordingMatcher | None:
  """A recording stand-in for `pm` when the current thread compiles a kernel for VIZ, else None (rewrite as usual)."""
  if _trace is None or not _trace.graphs or not (s := _stack()): return None
  if name is None:  # an unnamed pass is named by its caller
    f = sys._getframe(2)
    name = f"{f.f_code.co_name} ({os.path.basename(f.f_code.co_filename)}:{f.f_lineno})"
  p = Pass(name, s[-1].phase, sink)
  s[-1].passes.append(p)
  return RecordingMatcher(pm, p)


def rewrite_end(rec: RecordingMatcher, out: Any) -> None:
  rec.p.output = out
  if not rec.p.steps:  # a pass that changed nothing is not worth a row in VIZ
    s = _stack()
    if s and s[-1].passes and s[-1].passes[-1] is rec.p: s[-1].passes.pop()


# ---- launches (DEBUG>=2 and VIZ)

_stats: dict[tuple[str, str], list[float]] = {}  # (name, device) -> [launches, seconds, ops, bytes]
_summary_registered = [False]


def launched(name: str, device: str, start: float, seconds: float, global_size: tuple[int, ...] = (), local_size: tuple[int, ...] = (),
             ops: int = 0, mem: int = 0, kind: str = "kernel", ast: Any = None) -> None:
  """A timed launch (`start` from time.perf_counter()): counted for the DEBUG>=2 summary and kept for VIZ's timeline
  (`ast`: the kernel's optimized AST, which names its record)."""
  if DEBUG >= 2:
    st = _stats.setdefault((name, device), [0, 0.0, 0, 0])
    st[0] += 1; st[1] += seconds; st[2] += ops; st[3] += mem
    if not _summary_registered[0]:
      _summary_registered[0] = True
      atexit.register(_print_summary)
  if _trace is not None and _trace.graphs:
    with _trace.lock:
      _trace.launches.append(Launch(name, device, start - _T0, seconds, tuple(global_size), tuple(local_size), ops, mem, kind,
                                    None if ast is None else _trace.kernel_of.get(ast)))


def _rate(x: float, t: float) -> str: return f"{x / t * 1e-9:9.2f}" if t > 0 else f"{'-':>9}"


def summary() -> str:
  """The DEBUG>=2 table: every kernel (and graph batch, copy) that ran, by total time."""
  rows = sorted(_stats.items(), key=lambda kv: -kv[1][1])
  total = sum(v[1] for _, v in rows) or 1e-12
  out = [f"plugrad kernel time summary (DEBUG=2): {len(rows)} kernels, {sum(int(v[0]) for _, v in rows)} launches, {total * 1e3:.3f} ms",
         f"{'total ms':>10} {'share':>6} {'runs':>6} {'avg us':>10} {'GFLOPS':>9} {'GB/s':>9}  {'device':<10} kernel"]
  for (name, device), (n, t, ops, mem) in rows:
    out.append(f"{t * 1e3:10.3f} {t / total:6.1%} {int(n):6d} {t / n * 1e6:10.2f} {_rate(ops, t)} {_rate(mem, t)}  {device:<10} {name}")
  return "\n".join(out)


def _print_summary() -> None:
  # only when DEBUG>=2 at exit: a `Context(DEBUG=2)` block that ended earlier printed its lines, not a process summary
  if _stats and DEBUG >= 2: print(summary(), flush=True)


# ---- the JIT's memory plan

def jit_memory(name: str, launches: Sequence[tuple[str, Sequence[Any]]], plan: Any) -> None:
  """The buffers `plan` (engine/memory.MemoryPlan) placed for TinyJit `name`: live range (launch indices), the arena or
  buffer they share, byte offset and size. `launches` are (name, Buffers before the plan) in launch order."""
  if _trace is None or not _trace.graphs: return
  first: dict[Any, int] = {}
  last: dict[Any, int] = {}
  for j, (_, bufs) in enumerate(launches):
    for b in bufs:
      if b in plan.replace:
        first.setdefault(b, j)
        last[b] = j
  bases: dict[int, int] = {}
  rows = []
  for b, new in plan.replace.items():
    if b not in first: continue
    base = new.base
    rows.append({"device": b.device, "dtype": str(b.dtype), "nbytes": b.nbytes, "arena": bases.setdefault(id(base), len(bases)),
                 "arena_bytes": base.nbytes, "offset": new.offset if new is not base else 0, "first": first[b], "last": last[b]})
  with _trace.lock:
    _trace.memory.append(MemoryRecord(name, [n for n, _ in launches], rows, plan.bytes_before, plan.bytes_after))


# ---- saving (JSON: the format `python -m plugrad viz FILE` reopens)

FORMAT = 1


class _Nodes:
  """A kernel's node table: every UOp referenced gets an index; its sources are indices."""
  def __init__(self) -> None:
    self.ids: dict[Any, int] = {}
    self.rows: list[list[Any]] = []

  def __call__(self, u: Any) -> int:
    if (i := self.ids.get(u)) is not None: return i
    for n in u.toposort:
      if n not in self.ids:
        self.ids[n] = len(self.rows)
        self.rows.append([n.op.name, str(n.dtype).replace("dtypes.", ""), _arg_text(n.arg), [self.ids[s] for s in n.src]])
    return self.ids[u]


def _arg_text(a: Any) -> str:
  if a is None: return ""
  t = a if isinstance(a, str) else repr(a)
  return t if len(t) <= 200 else t[:197] + "..."


def _linear_text(uops: Sequence[Any]) -> list[str]:
  idx = {u: i for i, u in enumerate(uops)}
  return [f"{i:4d} {u.op.name:<14} {str(u.dtype).replace('dtypes.', ''):<22} {str([idx.get(s, '?') for s in u.src]):<18} {_arg_text(u.arg)}"
          for i, u in enumerate(uops)]


def _num(x: Any) -> Any: return x if isinstance(x, int) else str(x.render() if hasattr(x, "render") else x)


def renderer_id(r: Any) -> str:
  """The renderer's class and, for a GPU backend, its target (`arch`): what decides the code for one kernel AST."""
  arch = getattr(r, "arch", None)
  return f"{type(r).__module__}.{type(r).__qualname__}" + (f"[{arch}]" if arch else "")


def _kernel_json(i: int, k: KernelRecord) -> dict[str, Any]:
  nodes = _Nodes()
  p = k.program
  stages = [{"name": n, "root": nodes(u)} for n, u in k.stages if n != "linear"]
  passes = [{"name": ps.name, "phase": ps.phase, "input": nodes(ps.input), "output": nodes(ps.output) if ps.output is not None else None,
             "dropped": ps.dropped, "steps": [{"rule": repr(r.pat), "location": r.location, "before": nodes(b), "after": nodes(a)}
                                              for r, b, a in ps.steps]} for ps in k.passes]
  est = p.estimates
  return {"id": i, "order": k.order, "name": p.name, "device": p.device, "renderer": renderer_id(k.renderer),
          "opts": [repr(o) for o in p.applied_opts], "opts_given": None if k.opts is None else [repr(o) for o in k.opts],
          "estimates": {"flops": _num(est.ops), "bytes": _num(est.mem), "traffic": _num(est.lds), "local_bytes": est.local_bytes},
          "codegen_ms": round(k.seconds * 1e3, 3), "global_size": [_num(x) for x in p.global_size], "local_size": [_num(x) for x in p.local_size],
          "stages": stages, "passes": passes, "linear": _linear_text(p.uops), "source": p.source, "nodes": nodes.rows}


def to_json(t: Trace) -> dict[str, Any]:
  with t.lock: kernels, launches, memory = list(t.kernels), list(t.launches), list(t.memory)
  return {"format": FORMAT, "created": t.started, "argv": list(sys.argv), "kernels": [_kernel_json(i, k) for i, k in enumerate(kernels)],
          "launches": [{"name": ln.name, "kernel": ln.kernel, "device": ln.device, "kind": ln.kind, "start_us": round(ln.start * 1e6, 3),
                        "us": round(ln.seconds * 1e6, 3),
                        "global_size": list(ln.global_size), "local_size": list(ln.local_size),
                        "gflops": round(ln.ops / ln.seconds * 1e-9, 3) if ln.seconds > 0 else None,
                        "gbs": round(ln.mem / ln.seconds * 1e-9, 3) if ln.seconds > 0 else None} for ln in launches],
          "memory": [{"jit": m.jit, "launches": m.launches, "buffers": m.buffers, "bytes_before": m.bytes_before, "bytes_after": m.bytes_after}
                     for m in memory]}


def save(path: str, t: Trace | None = None) -> str:
  """Write trace `t` (default: the one being recorded) as JSON to `path`; returns the path."""
  if (t := t or _trace) is None: raise RuntimeError("nothing is being traced: set VIZ=1 (or call plugrad.trace.enable()) first")
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f: json.dump(to_json(t), f)
  os.replace(tmp, path)
  return path


# the VIZ server (plugrad.viz, above every floor); `import plugrad` sets it when VIZ=1, and so wires process replay
serve_trace: Callable[[str, int], None] | None = None


def _viz_at_exit() -> None:
  if _trace is None or not _trace.kernels and not _trace.launches: return
  path = save(default_trace_file())
  print(f"VIZ: trace of {len(_trace.kernels)} kernels and {len(_trace.launches)} launches saved to {path}", file=sys.stderr, flush=True)
  if VIZ == 1 and serve_trace is not None: serve_trace(path, int(VIZ_PORT))
  else: print(f"VIZ: open it with: python -m plugrad viz {path}", file=sys.stderr, flush=True)


if _pending_error is not None: TRACING = True  # so that the first get_program raises the bad setting's error
elif VIZ:
  enable(graphs=True)
  atexit.register(_viz_at_exit)
