"""What the side-by-side benchmarks share: each framework runs in a subprocess of the benchmark script (its thread
setting is read at start-up), and tinygrad's CPU device needs clang."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from typing import Any

INSTALL = {"torch": "pip install torch", "tinygrad": "pip install tinygrad==0.14.0"}


def clang() -> str | None:
  """tinygrad's CPU device compiles with clang (CC); a versioned clang-NN counts too."""
  return os.environ.get("CC") or shutil.which("clang") or next(iter(sorted(glob.glob("/usr/bin/clang-[0-9]*"), reverse=True)), None)


def settle_tiers() -> None:
  """After a warm-up: plugrad-cpu's tier-up (reused LLVM-compiled kernels recompiled by the C compiler, the faster code
  kept; plugrad_cpu/tiering.py), waited for. A loop gets that code by itself after a few calls, so it is what timed runs
  should measure, and no compile then runs beside a timed call. Nothing to wait for without plugrad-cpu."""
  try:
    from plugrad_cpu.tiering import settle
  except ImportError: return
  settle()


def run_peer(script: str, name: str, threads: int, *args: str, timeout: float | None = None,
             env_extra: dict[str, str] | None = None) -> dict[str, Any] | str:
  """`python script --peer name --threads N *args` in a subprocess: the JSON it prints last, or why there is none
  ("skipped: over N s" when it runs past `timeout` seconds and is killed). `env_extra` is added to its environment."""
  if name in INSTALL and importlib.util.find_spec(name) is None: return f"not installed ({INSTALL[name]})"
  env = {**os.environ, "THREADS": str(threads), "NUM_CPU_THREADS": str(threads), **(env_extra or {})}
  if name == "tinygrad":
    if (cc := clang()) is None: return "skipped: tinygrad's CPU device needs clang (apt install clang, or CC=...)"
    env.update(DEV="CPU", CC=cc)  # plugrad reads CC too, so it is set for tinygrad's process only
  try:
    proc = subprocess.run([sys.executable, script, "--peer", name, "--threads", str(threads), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
  except subprocess.TimeoutExpired: return f"skipped: over {timeout:.0f} s"
  if proc.returncode != 0: return "failed: " + (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return json.loads(proc.stdout.strip().splitlines()[-1])
