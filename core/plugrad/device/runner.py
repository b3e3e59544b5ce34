"""`ProgramRunner`: turns a PROGRAM UOp into something you call with Buffers.

It finishes the program's missing stages with the device's own components (render, then compile through the
cache), loads it with the device's runtime, and on every call checks the arguments against what the kernel
declares, so that a wrong buffer fails here with names and sizes instead of corrupting memory in a driver.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import plugrad.trace as trace
from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.errors import DeviceError, LaunchError, PluginHookError
from plugrad.helpers import DEBUG
from plugrad.uop.ops import Ops, UOp

# a buffer of a dtype the codegen emulates may be passed where a kernel declares its storage (codegen/decompose.py)
_STORED_AS = {dtypes.bfloat16: dtypes.uint16}


class ProgramRunner:
  """`ProgramRunner(program)(bufs, var_vals, wait)` runs a PROGRAM (LINEAR stage or later) on `program.device`."""
  def __init__(self, program: UOp):
    if not isinstance(program, UOp) or program.op is not Ops.PROGRAM:
      raise TypeError(f"ProgramRunner needs a PROGRAM UOp, got {program.op!r} UOp" if isinstance(program, UOp) else
                      f"ProgramRunner needs a PROGRAM UOp, got {type(program).__name__}")
    p: Any = program
    if p.stage == "ast": raise ValueError(f"kernel {p.name!r} is at the AST stage: lower it to LINEAR (codegen) before running it")
    self.dev = Device[p.device]
    if p.stage == "linear":
      src = self.dev.renderer.render(p)
      if not isinstance(src, str): raise PluginHookError(f"{type(self.dev.renderer).__name__}.render must return a str, got {type(src).__name__}")
      p = p.with_source(src)
    self.name, self.device = p.name, self.dev.name
    if p.stage == "source":
      # through load_cached: a cached binary that fails to load is dropped and compiled again (device/compiler.py)
      def load(lib: bytes) -> tuple[Any, Any]:
        q = p.with_binary(lib)
        return q, self._load(q)
      p, self.lib = self.dev.compiler.load_cached(p.source, p.name, load)
    else: self.lib = self._load(p)
    self.program: Any = p
    self._bufs = [(dt, g.dtype.size) for g, (dt, _) in zip(p.buffers, p.signature)]
    self._vars = [v.arg for v in p.vars]
    self._static_dims = None if self._vars else p.launch_dims({})

  def _load(self, p: Any) -> Any:
    try: return self.dev.runtime.load(p)
    except DeviceError: raise
    except Exception as e: raise self._error("failed to load", e) from e

  def __repr__(self) -> str: return f"<ProgramRunner {self.name!r} on {self.device}>"

  def _error(self, what: str, e: Exception) -> LaunchError:
    return LaunchError(f"kernel {self.name!r} {what} on {self.device} (plugin {self.dev.distribution}): {type(e).__name__}: {e}")

  def _check(self, bufs: Sequence[Buffer]) -> None:
    if isinstance(bufs, Buffer) or not isinstance(bufs, Sequence):
      raise TypeError(f"kernel {self.name!r}: pass the buffers as a sequence, got {type(bufs).__name__}")
    if len(bufs) != len(self._bufs): raise ValueError(f"kernel {self.name!r} takes {len(self._bufs)} buffers, got {len(bufs)}")
    for i, (b, (dt, size)) in enumerate(zip(bufs, self._bufs)):
      if not isinstance(b, Buffer): raise TypeError(f"kernel {self.name!r}, buffer slot {i}: expected a Buffer, got {type(b).__name__}")
      if b.device != self.device:
        raise ValueError(f"kernel {self.name!r}, buffer slot {i}: the kernel runs on {self.device}, the buffer is on {b.device}")
      if b.dtype is not dt and _STORED_AS.get(b.dtype) is not dt:
        raise TypeError(f"kernel {self.name!r}, buffer slot {i}: expected {dt!r} elements, got a {b.dtype!r} buffer")
      if size != -1 and b.size < size: raise ValueError(f"kernel {self.name!r}, buffer slot {i}: expected {size} elements, got a buffer of {b.size}")

  def _vals(self, var_vals: Mapping[str | UOp, int] | None) -> dict[str, int]:
    given: dict[str, int] = {}
    for k, v in (var_vals or {}).items():
      if isinstance(k, UOp):
        if k.op is not Ops.DEFINE_VAR: raise TypeError(f"kernel {self.name!r}: var_vals keys must be names or Variables, got a {k.op!r} UOp")
        k = k.arg[0]
      if not isinstance(k, str): raise TypeError(f"kernel {self.name!r}: var_vals keys must be names or Variables, got {type(k).__name__}")
      given[k] = v
    out: dict[str, int] = {}
    for name, lo, hi in self._vars:
      if name not in given:
        raise ValueError(f"kernel {self.name!r} needs a value for variable {name!r} (in [{lo}, {hi}]); got values for {sorted(given)}")
      if not isinstance(v := given[name], int) or isinstance(v, bool):
        raise TypeError(f"kernel {self.name!r}: variable {name!r} must be an int, got {v!r}")
      if not lo <= v <= hi: raise ValueError(f"kernel {self.name!r}: variable {name!r} = {v} is outside its range [{lo}, {hi}]")
      out[name] = v
    return out

  @property
  def var_names(self) -> list[str]: return [n for n, _, _ in self._vars]

  def __call__(self, bufs: Sequence[Buffer], var_vals: Mapping[Any, int] | None = None, wait: bool = False) -> float | None:
    """Launch on `bufs` (slot order) with the variables' values; with `wait`, return the kernel's time in seconds."""
    self._check(bufs)
    vals = self._vals(var_vals)
    return self.launch([b.ensure_allocated().handle for b in bufs], tuple(vals[n] for n, _, _ in self._vars), wait)

  def launch(self, handles: Sequence[Any], vals: tuple[int, ...], wait: bool = False) -> float | None:
    """Launch on allocated buffer handles with the variables' values in `var_names` order, unchecked: for callers that
    checked the buffers once and replay them (the JIT)."""
    if self._static_dims is not None: gs, ls = self._static_dims
    else: gs, ls = self.program.launch_dims(dict(zip(self.var_names, vals)))
    # profiling (DEBUG>=2, VIZ's timeline): every launch waits and is timed
    if (timed := DEBUG >= 2 or trace.TIMELINE): wait, st = True, time.perf_counter()
    try: t = self.lib(*handles, global_size=gs, local_size=ls, vals=vals, wait=wait)
    except Exception as e: raise self._error("failed to launch", e) from e
    if timed: self._profile(gs, ls, dict(zip(self.var_names, vals)), t, st)
    return t

  def _profile(self, gs: tuple[int, ...], ls: tuple[int, ...], vals: dict[str, int], t: float | None, st: float) -> None:
    if t is None:  # a runtime that cannot time a launch: wall time around the synchronized launch
      self.dev.synchronize()
      t = time.perf_counter() - st
    est = None if self.program.external else self.program.estimates.at(vals)  # a kernel written outside plugrad: no counts
    ops, mem = (int(est.ops), int(est.mem)) if est is not None else (0, 0)
    trace.launched(self.name, self.device, st, t, gs, ls, ops, mem, ast=self.program.ast if trace.TIMELINE else None)
    if DEBUG >= 2:
      rates = f" {ops / t * 1e-9:9.2f} GFLOPS {mem / t * 1e-9:8.2f} GB/s" if t > 0 and est is not None else ""
      print(f"{self.name:<28} {self.device:<10} global {gs!s:<16} local {ls!s:<14} {t * 1e6:10.2f} us{rates}")

