#!/usr/bin/env python3
"""The per-plugin test matrix from built wheels (docs/testing.md, "The plugin matrix").

Builds a wheel of every distribution (`python -m build`), then for each cell makes a fresh virtual environment (no
editable installs, no system site-packages) and installs from those wheels only, with each package's declared
dependencies from the package index: the core alone, and the core with each plugin. In a cell it runs the plugin's own
tests (a copy of `plugins/<name>/tests`, outside the repository, so the installed wheel is what they import) and
`python -m plugrad conformance` for each device configuration, at every tier this machine allows. It prints the matrix
(configuration x tier, and the plugin tests) as Markdown with the reason for every skip, writes it as JSON, and exits 1
when anything failed.

    python tools/matrix.py [--cells core,cpu,...] [--jobs N] [--out DIR]
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIERS = ("render", "compile", "emulate", "run")
TIMEOUT = 1800  # seconds for one command of a cell


@dataclass(frozen=True)
class Config:
  """One conformance run: a device under some settings (extra environment, extra pytest arguments)."""
  device: str
  label: str
  env: dict[str, str] = field(default_factory=dict)
  pytest_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cell:
  name: str
  source: str  # the distribution's directory in the repository
  distribution: str
  extras: tuple[str, ...]
  configs: tuple[Config, ...]
  tests: str | None = None  # the plugin's own tests, run from a copy
  # Python run in the cell before the conformance runs: prints why they cannot run here (a system tool missing), or nothing
  precheck: str | None = None
  crosscheck: bool = False  # the device runs here: its tensor-level tests also compare with PyTorch (plugrad[crosscheck])
  minutes: int = 2  # about how long the cell takes on 2 cores with a cold cache: the longest start first


KERNELS_ONLY = ("-k", "test_kernel")  # emulated targets differ in kernel-level features only: the tensor tests run once
CELLS = (
  Cell("core", "core", "plugrad", ("test",), (
    Config("PYTHON", "PYTHON"), Config("NULL", "NULL"),
    *(Config("PYTHON", f"PYTHON EMULATE={t}", {"EMULATE": t}, KERNELS_ONLY) for t in ("CUDA", "METAL", "AMD", "AMD_MFMA"))), crosscheck=True),
  Cell("cpu", "plugins/cpu", "plugrad-cpu", ("llvm", "test"),
       (Config("CPU", "CPU (C, CPU_LLVM=0)", {"CPU_LLVM": "0"}), Config("CPU", "CPU (LLVM, CPU_LLVM=1)", {"CPU_LLVM": "1"})), "plugins/cpu/tests",
       crosscheck=True, minutes=8),
  Cell("webgpu", "plugins/webgpu", "plugrad-webgpu", ("test",), (Config("WEBGPU", "WEBGPU"),), "plugins/webgpu/tests", crosscheck=True),
  Cell("cuda", "plugins/cuda", "plugrad-cuda", ("test",),
       tuple(Config("CUDA", f"CUDA {a}", {"CUDA_ARCH": a}) for a in ("sm_80", "sm_90")), "plugins/cuda/tests"),
  Cell("amd", "plugins/amd", "plugrad-amd", ("test",), tuple(Config("AMD", f"AMD {a}", {"AMD_ARCH": a}) for a in ("gfx942", "gfx1100")),
       "plugins/amd/tests", "from plugrad_amd.toolchain import missing\nprint(missing() or '')"),
  Cell("metal", "plugins/metal", "plugrad-metal", ("test",),
       tuple(Config("METAL", f"METAL {v} (syntax-checked off macOS)", {"METAL_LANGUAGE": v}) for v in ("3.1", "3.0")), "plugins/metal/tests",
       "import sys\nfrom plugrad_metal.syntax import find_clang\n"
       "print('' if sys.platform == 'darwin' or find_clang() else 'its compile tier off macOS needs clang (apt-get install clang-19)')"),
  Cell("opencl", "examples/plugrad-opencl", "plugrad-opencl", ("pocl", "test"), (Config("OPENCL", "OPENCL (PoCL)"),),
       "examples/plugrad-opencl/tests", crosscheck=True, minutes=15),  # PoCL compiles each kernel with its own LLVM: ~0.5 s
)


def sh(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = TIMEOUT) -> subprocess.CompletedProcess[str]:
  try: return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired as e:
    out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return subprocess.CompletedProcess(cmd, 124, out, f"timed out after {timeout} s")


def build_wheels(cells: list[Cell], wheelhouse: Path) -> None:
  """One wheel per distribution, each built in its own isolated build environment, as a release would."""
  wheelhouse.mkdir(parents=True, exist_ok=True)
  sources = dict.fromkeys(["core", *(c.source for c in cells)])
  def one(src: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    with tempfile.TemporaryDirectory() as tmp:  # a copy: the build must not leave build/ or egg-info in the checkout
      shutil.copytree(REPO / src, Path(tmp) / "src", ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
      return src, sh([sys.executable, "-m", "build", "--wheel", "--outdir", str(wheelhouse), str(Path(tmp) / "src")])
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    for src, res in pool.map(one, sources):
      if res.returncode != 0: sys.exit(f"matrix: building the wheel of {src} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")


def clean_env(venv_dir: Path, cache: Path) -> dict[str, str]:
  """The environment of a cell's commands: its venv first on PATH, nothing of this checkout or this interpreter's
  packages (PYTHONPATH, PYTHONHOME, a virtualenv), its own plugrad cache."""
  keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "XDG_CACHE_HOME", "CC", "THREADS")
  env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("PIP_")}  # pip's settings: its index, cache, certificates
  path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not p.startswith(sys.prefix)]
  env.update(PATH=os.pathsep.join([str(venv_dir / "bin"), *path]), VIRTUAL_ENV=str(venv_dir), PLUGRAD_CACHE_DIR=str(cache),
             PLUGRAD_STRICT_PLUGINS="1", SPEC="1", PYTHONDONTWRITEBYTECODE="1")
  return env


def junit_counts(xml_file: Path) -> dict[str, Any]:
  """passed/failed/skipped counts and the skip reasons (with counts) of a pytest run's JUnit XML."""
  counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
  reasons: collections.Counter[str] = collections.Counter()
  failures: list[str] = []
  if not xml_file.exists(): return {**counts, "skips": [], "failures": ["pytest wrote no results"]}
  for case in ET.parse(xml_file).iter("testcase"):
    name = f"{case.get('classname', '')}::{case.get('name', '')}"
    if (s := case.find("skipped")) is not None:
      kind = "xfailed" if s.get("type") == "pytest.xfail" else "skipped"
      counts[kind] += 1
      if kind == "skipped": reasons[(s.get("message") or "").strip()] += 1
    elif case.find("failure") is not None or case.find("error") is not None:
      counts["failed"] += 1
      failures.append(name)
    else: counts["passed"] += 1
  return {**counts, "skips": [{"reason": r, "count": n} for r, n in reasons.most_common()], "failures": failures}


def run_cell(cell: Cell, wheelhouse: Path, work: Path) -> dict[str, Any]:
  """Everything of one cell; never raises: a step that fails is recorded with its output's tail. The cell's venv and
  compile cache (~1-2 GB with torch) are removed when it is done; its reports stay."""
  try: return _run_cell(cell, wheelhouse, work)
  finally:
    for scratch in ("venv", "cache"): shutil.rmtree(work / cell.name / scratch, ignore_errors=True)


def _run_cell(cell: Cell, wheelhouse: Path, work: Path) -> dict[str, Any]:
  res: dict[str, Any] = {"cell": cell.name, "distribution": cell.distribution, "steps": [], "configs": [], "tests": None, "ok": True}
  def step(name: str, proc: subprocess.CompletedProcess[str], ok: bool | None = None) -> bool:
    ok = proc.returncode == 0 if ok is None else ok
    res["steps"].append({"step": name, "ok": ok, "returncode": proc.returncode, **({} if ok else {"tail": (proc.stdout + proc.stderr)[-4000:]})})
    res["ok"] &= ok
    return ok
  st = time.monotonic()
  root = work / cell.name
  shutil.rmtree(root, ignore_errors=True)
  venv.EnvBuilder(with_pip=False, clear=True).create(root / "venv")  # pip from outside (--python): no ensurepip per cell
  env = clean_env(root / "venv", root / "cache")
  py = str(root / "venv" / "bin" / "python")
  def wheel(dist: str, extras: str) -> str:  # our distributions by file, so nothing of the same name on the index is taken
    return f"{next(wheelhouse.glob(dist.replace('-', '_') + '-*.whl'))}[{extras}]"
  reqs = [wheel("plugrad", "test,crosscheck" if cell.crosscheck else "test")]
  if cell.name != "core": reqs.append(wheel(cell.distribution, ",".join(cell.extras)))
  pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--progress-bar=off"]
  if not step("install", sh([*pip, *reqs], env=env)): return res
  mod = cell.distribution.replace("-", "_")
  where = sh([py, "-c", f"import {mod}, plugrad; print({mod}.__file__); print(plugrad.__file__)"], env=env, cwd=root)
  from_venv = where.returncode == 0 and all(line.startswith(str(root / "venv")) for line in where.stdout.split())
  step("imports come from the venv's wheels", where, from_venv)
  res["installed"] = sh([sys.executable, "-m", "pip", "--python", py, "list", "--format=freeze"], env=env).stdout.split()
  devices = sh([py, "-m", "plugrad", "devices", "--json"], env=env, cwd=root)
  step("python -m plugrad devices", devices)
  step("python -m plugrad plugins", sh([py, "-m", "plugrad", "plugins"], env=env, cwd=root))
  if cell.name == "core" and devices.returncode == 0:
    info = json.loads(devices.stdout)
    names = sorted(d["device"] for d in info["devices"])
    step(f"core alone: default PYTHON, devices {names}", devices, info["default"] == "PYTHON" and names == ["NULL", "PYTHON"])
  if cell.tests is not None:
    copy = root / "tests"
    shutil.copytree(REPO / cell.tests, copy, ignore=shutil.ignore_patterns("__pycache__"))
    proc = sh([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", f"--junitxml={root / 'tests.xml'}", str(copy)], env=env, cwd=root)
    res["tests"] = junit_counts(root / "tests.xml")
    step("plugin tests", proc, proc.returncode == 0 and res["tests"]["failed"] == 0)
  why = sh([py, "-c", cell.precheck], env=env, cwd=root).stdout.strip() if cell.precheck else ""
  for cfg in cell.configs:
    if why:
      res["configs"].append({"label": cfg.label, "device": cfg.device, "skipped": why})
      continue
    out = root / f"conformance-{len(res['configs'])}.json"
    proc = sh([py, "-m", "plugrad", "conformance", cfg.device, "--json", str(out), *(["--", *cfg.pytest_args] if cfg.pytest_args else [])],
              env={**env, **cfg.env}, cwd=root)
    report = json.loads(out.read_text()) if out.exists() else None
    res["configs"].append({"label": cfg.label, "device": cfg.device, "report": report})
    step(f"conformance {cfg.label}", proc, proc.returncode == 0 and report is not None and report["ok"])
  res["seconds"] = round(time.monotonic() - st, 1)
  return res


def _counts(c: dict[str, int]) -> str:
  if not any(c.values()): return "-"
  parts = [f"{c['passed']} pass"] + [f"{c[k]} {k[:-2] if k != 'skipped' else 'skip'}" for k in ("failed", "skipped", "xfailed") if c.get(k)]
  return ", ".join(parts)


def markdown(results: list[dict[str, Any]]) -> str:
  lines = ["| cell | configuration | " + " | ".join(TIERS) + " | plugin tests | result |", "|---" * (len(TIERS) + 4) + "|"]
  notes: list[str] = []
  for r in results:
    tests = _counts(r["tests"]) if r["tests"] else "-"
    verdict = "ok" if r["ok"] else "**FAILED**"
    rows = r["configs"] or [{"label": "-", "report": None}]
    for i, cfg in enumerate(rows):
      if (rep := cfg.get("report")) is not None:
        not_run = {sk["tier"] for sk in rep.get("skips", []) if sk["count"] == 0}  # a tier the run left out, with why
        tiers = ["not run" if t in not_run and not any(rep["tiers"][t].values()) else _counts(rep["tiers"][t]) for t in TIERS]
      else: tiers = ["skipped" if cfg.get("skipped") else "-"] * len(TIERS)
      first = [r["cell"], tests, verdict] if i == 0 else ["", "", ""]
      lines.append(f"| {first[0]} | {cfg['label']} | " + " | ".join(tiers) + f" | {first[1]} | {first[2]} |")
      if cfg.get("skipped"): notes.append(f"- {r['cell']} / {cfg['label']}: not run: {cfg['skipped']}")
      for s in (rep or {}).get("skips", []):
        what = f"{s['count']} skipped" if s["count"] else "not run"
        notes.append(f"- {r['cell']} / {cfg['label']} / {s['tier']}: {what}: {s['reason']}")
      for f in (rep or {}).get("failures", []):
        notes.append(f"- {r['cell']} / {cfg['label']} / {f['tier']}: FAILED {f['test']}: {f['message'][:300]}")
    for s in (r["tests"] or {}).get("skips", []): notes.append(f"- {r['cell']} / plugin tests: {s['count']} skipped: {s['reason']}")
    for f in (r["tests"] or {}).get("failures", []): notes.append(f"- {r['cell']} / plugin tests: FAILED {f}")
    for s in r["steps"]:
      if not s["ok"]: notes.append(f"- {r['cell']}: step `{s['step']}` failed (exit {s['returncode']}):\n\n```\n{s.get('tail', '')[-1500:]}\n```")
  return "\n".join(lines + ["", "Skips, failures and their reasons:", "", *notes] if notes else lines)


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--cells", default=",".join(c.name for c in CELLS), help="comma-separated cells (default: all)")
  ap.add_argument("--jobs", type=int, default=2, help="cells run at once (default 2)")
  ap.add_argument("--out", default=str(REPO / "build" / "matrix"), help="work directory: wheels, venvs, matrix.md, matrix.json")
  args = ap.parse_args(argv)
  known = {c.name: c for c in CELLS}
  if unknown := [n for n in args.cells.split(",") if n not in known]:
    print(f"matrix: unknown cell(s) {unknown}; the cells are {list(known)}", file=sys.stderr)
    return 2
  cells = [known[n] for n in args.cells.split(",")]
  out = Path(args.out).resolve()
  shutil.rmtree(out / "wheels", ignore_errors=True)
  st = time.monotonic()
  build_wheels(cells, out / "wheels")
  print(f"matrix: {len(list((out / 'wheels').glob('*.whl')))} wheels built in {time.monotonic() - st:.0f} s", flush=True)
  results: dict[str, dict[str, Any]] = {}
  with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
    futures = {pool.submit(run_cell, c, out / "wheels", out / "cells"): c for c in sorted(cells, key=lambda c: -c.minutes)}
    for fut in concurrent.futures.as_completed(futures):
      r = results[futures[fut].name] = fut.result()
      print(f"matrix: cell {r['cell']}: {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s", flush=True)
  ordered = [results[c.name] for c in cells]
  table = markdown(ordered)
  (out / "matrix.md").write_text(table + "\n")
  (out / "matrix.json").write_text(json.dumps({"seconds": round(time.monotonic() - st, 1), "cells": ordered}, indent=1))
  print(table)
  print(f"matrix: {sum(r['ok'] for r in ordered)}/{len(ordered)} cells ok in {time.monotonic() - st:.0f} s; {out / 'matrix.json'}")
  return 0 if all(r["ok"] for r in ordered) else 1


if __name__ == "__main__":
  sys.exit(main())
