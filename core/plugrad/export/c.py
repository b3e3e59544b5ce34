"""The C target: model.c + model.h (no plugrad headers), the weights as safetensors (or embedded), a Makefile and a demo
runner. The kernels are the CPU device's C: the captured source on the C path, else the captured LINEAR programs
rendered by the C renderer the device's renderer offers (`c_renderer()`, which the CPU's LLVM renderer has).

The kernel ABI is plugrad-cpu's (docs/writing-a-backend.md): buffers in slot order, variables by name, then
`core_id, core_count`. A kernel whose source holds plugrad-cpu's parallel-loop mark splits its loop across
`core_count` callers: without OpenMP it is called once as core 0 of 1, with OpenMP once per thread of a parallel region.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from plugrad.device.registry import Device
from plugrad.dtype import INVERSE_NAMES, DType, dtypes
from plugrad.export import c_runtime
from plugrad.export.common import ALIGN, ST_DTYPES, Captured, Copy, ExportError, Launch, Storage, safetensors_bytes
from plugrad.plugin.hookspecs import parse_device
from plugrad.renderer.cstyle import CStyleRenderer, c_identifier

# the text plugrad-cpu's renderers put before a loop that core_id/core_count split (plugrad_cpu.renderer.PARALLEL_MARK)
PARALLEL_MARK = "plugrad-cpu: parallel loop, split across core_count threads"
OMP_MIN_WORK = 1 << 20  # ops + bytes moved below which a parallel kernel runs on one thread (plugrad-cpu's WORK_PER_THREAD)


@dataclass(frozen=True)
class CKernel:
  fname: str            # the static function's name in model.c
  prelude: tuple[str, ...]  # typedefs and helpers it needs (shared ones are written once)
  body: str             # the function, from its signature to its closing brace
  parallel: bool
  work: int | None      # ops + bytes moved, None when symbolic


def c_renderer(device: str) -> CStyleRenderer:
  """The C renderer for kernels captured on `device` (a CPU device)."""
  if parse_device(device)[0] != "CPU":
    raise ExportError(f"export_model(target='c') needs the model on the CPU device (its kernels are host C); it was captured on {device}")
  r = Device[device].renderer
  if isinstance(r, CStyleRenderer): return r
  alt = getattr(r, "c_renderer", None)
  c = alt() if callable(alt) else None
  if not isinstance(c, CStyleRenderer):
    raise ExportError(f"export_model(target='c'): the {device} renderer {type(r).__name__} writes no C and offers no c_renderer(); "
                      "run with CPU_LLVM=0")
  return c


def _chunks(lines: list[str]) -> list[str]:
  """Top-level items of a kernel's prelude: one line, a `#if ... #endif` group or a brace-balanced helper each."""
  out: list[str] = []
  cur: list[str] = []
  depth = pp = 0
  for line in lines:
    s = line.strip()
    if not cur and not s: continue
    cur.append(line)
    if s.startswith("#if"): pp += 1
    elif s.startswith("#endif"): pp -= 1
    depth += line.count("{") - line.count("}")
    if depth == 0 and pp == 0:
      out.append("\n".join(cur))
      cur = []
  if cur: out.append("\n".join(cur))
  return out


def split_kernel(source: str, name: str, fname: str) -> tuple[list[str], str]:
  """(the prelude items, the kernel function renamed to `static void fname`) of one kernel's C source."""
  sym = c_identifier(name)
  lines = source.splitlines()
  sig = re.compile(rf"^(.*\s)?void\s+{re.escape(sym)}\s*\(")
  at = next((i for i, line in enumerate(lines) if sig.match(line)), None)
  if at is None: raise ExportError(f"export_model: the C of kernel {name!r} has no function `void {sym}(`")
  head = [line for line in lines[:at] if line.startswith("/* kernel ")]
  pre = [line for line in lines[:at] if not line.startswith("/* kernel ")]
  body = "\n".join([*head, sig.sub(f"static void {fname}(", lines[at], count=1), *lines[at + 1:]]).rstrip() + "\n"
  return _chunks(pre), body


def _ctype(dt: DType) -> str:
  return {dtypes.int64: "int64_t", dtypes.int32: "int32_t"}.get(dt, "int32_t")


def _c_str(s: str) -> str: return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _desc(s: Storage) -> str: return f"'{s.name}': {INVERSE_NAMES.get(s.dtype, s.dtype.name)}[{', '.join(map(str, s.shape))}]"


def _f32_last(s: Storage) -> int:
  last = s.shape[-1] if s.shape else 0
  return last if s.dtype is dtypes.float32 and isinstance(last, int) and last > 0 else 0


def generate(cap: Captured, embed_weights: bool = False) -> dict[str, str | bytes]:
  """The files of the C export of `cap`, by name."""
  r = c_renderer(cap.device)
  kernels: dict[str, CKernel] = {}  # by source
  calls: list[tuple[CKernel, Launch | Copy]] = []
  names: set[str] = set()
  for step in cap.steps:
    if isinstance(step, Copy):
      calls.append((CKernel("", (), "", False, 0), step))
      continue
    p = step.program
    ksrc = p.source if Device[cap.device].renderer is r else r.render(p)
    if (k := kernels.get(ksrc)) is None:
      fname = stem = f"k_{c_identifier(p.name)}"
      i = 1
      while fname in names: fname, i = f"{stem}_{i}", i + 1
      names.add(fname)
      prelude, body = split_kernel(ksrc, p.name, fname)
      est = p.estimates
      work = est.ops + est.lds if isinstance(est.ops, int) and isinstance(est.lds, int) else None
      k = kernels[ksrc] = CKernel(fname, tuple(prelude), body, PARALLEL_MARK in ksrc, work)
    calls.append((k, step))

  weights = cap.weights
  for w in weights:
    if w.dtype not in ST_DTYPES: raise ExportError(f"export_model: weight {w.name!r} has dtype {w.dtype!r}, which safetensors cannot hold")
  blob = safetensors_bytes(weights, {"format": "plugrad-export", "model": cap.name})
  scratch_at: dict[int, int] = {}
  total = 0
  for s in cap.storages:
    if s.kind == "scratch":
      scratch_at[s.index] = total
      total += (s.nbytes + ALIGN - 1) // ALIGN * ALIGN
  weight_no = {w.index: i for i, w in enumerate(weights)}
  in_no = {s.index: i for i, s in enumerate(cap.inputs)}
  out_no = {s.index: i for i, s in enumerate(cap.outputs)}

  def base(storage: int) -> str:
    if storage in in_no: return f"(const unsigned char *)inputs[{in_no[storage]}]"
    if storage in out_no: return f"(unsigned char *)outputs[{out_no[storage]}]"
    if storage in weight_no: return f"model_w[{weight_no[storage]}]"
    return f"(model_scratch + {scratch_at[storage]})"

  def ptr(storage: int, offset: int) -> str: return f"(void *)({base(storage)} + {offset})" if offset else f"(void *){base(storage)}"

  var_index = {v.name: i for i, v in enumerate(cap.vars)}
  run: list[str] = []
  for i, (k, step) in enumerate(calls):
    if isinstance(step, Copy):
      run.append(f"  memcpy({ptr(step.dest.storage, step.dest.offset)}, {ptr(step.src.storage, step.src.offset)}, "
                 f"{step.dest.size * step.dest.dtype.itemsize});  /* step {i}: copy */")
      continue
    args = [ptr(a.storage, a.offset) for a in step.args]
    args += [f"({_ctype(next(v for v in cap.vars if v.name == n).dtype)})vars[{var_index[n]}]" for n in step.vars]
    call = f"{k.fname}({', '.join(args)}"
    run.append(f"  /* step {i}: {step.name} */")
    if k.parallel:
      cond = f"{k.work}LL >= MODEL_OMP_MIN_WORK" if k.work is not None else "1"
      run += ["#ifdef _OPENMP", f"  #pragma omp parallel if ({cond})", f"  {call}, omp_get_thread_num(), omp_get_num_threads());", "#else",
              f"  {call}, 0, 1);", "#endif"]
    else: run.append(f"  {call}, 0, 1);")

  preludes: dict[str, None] = {}
  for k in kernels.values(): preludes.update(dict.fromkeys(k.prelude))
  writes_weights = any(w.written for w in weights)
  vars_sig = "".join(f", {_ctype(v.dtype)} {c_identifier(v.name)}" for v in cap.vars)
  n_in, n_out, n_var, n_w = len(cap.inputs), len(cap.outputs), len(cap.vars), len(weights)

  header = [
    "/* model.h: the model exported by plugrad.export (see docs/export.md for the ABI). */",
    "#ifndef PLUGRAD_EXPORT_MODEL_H", "#define PLUGRAD_EXPORT_MODEL_H", "#include <stddef.h>", "#include <stdint.h>",
    "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
    f"/* {cap.name}: {len(cap.launches)} kernel launches, {len(kernels)} distinct kernels, {n_w} weights ({len(blob)} bytes of safetensors) */",
    f"#define MODEL_NUM_INPUTS {n_in}", f"#define MODEL_NUM_OUTPUTS {n_out}", f"#define MODEL_NUM_VARS {n_var}",
    f'#define MODEL_WEIGHTS_FILE "model.safetensors"  /* what model_init(NULL) reads{" when no weights are embedded" if embed_weights else ""} */',
    ""]
  for what, group in (("input", cap.inputs), ("output", cap.outputs)):
    for i, s in enumerate(group):
      header.append(f"/* {what} {i} '{s.name}': {s.dtype.name}[{', '.join(map(str, s.shape))}], a buffer of {s.nbytes} bytes */")
      header.append(f"#define MODEL_{what.upper()}_{i}_BYTES {s.nbytes}")
  for i, v in enumerate(cap.vars):
    header.append(f"/* variable {i} '{v.name}': {v.lo} <= {v.name} <= {v.hi} ({v.value} at export) */")
  header += [
    "", "extern const size_t model_input_bytes[MODEL_NUM_INPUTS + 1], model_output_bytes[MODEL_NUM_OUTPUTS + 1];",
    "extern const char *const model_var_names[MODEL_NUM_VARS + 1];",
    "/* each output as text (\"'name': dtype[shape]\"), and its last axis' length when it is float32 (else 0): model_main prints",
    "   the argmax over it, a classifier's prediction */",
    "extern const char *const model_output_desc[MODEL_NUM_OUTPUTS + 1];", "extern const int64_t model_output_f32_last[MODEL_NUM_OUTPUTS + 1];",
    "extern const int64_t model_var_min[MODEL_NUM_VARS + 1], model_var_max[MODEL_NUM_VARS + 1], model_var_default[MODEL_NUM_VARS + 1];", "",
    "/* Load the weights (a safetensors file; NULL: " + ("the embedded weights" if embed_weights else "MODEL_WEIGHTS_FILE") + ") and allocate the",
    "   scratch memory. 0 on success, else -1 and model_error() says why. Calling it again reloads. */",
    "int model_init(const char *weights_path);",
    "/* Run the model once: inputs[i] points at model_input_bytes[i] bytes, outputs[i] at model_output_bytes[i] writable",
    "   bytes; the variables (symbolic dimensions) follow in name order. 0 on success, else -1 (see model_error()). */",
    f"int model_run(const void *const *inputs, void *const *outputs{vars_sig});",
    "/* model_run with the variables' values in an array (name order). */",
    "int model_run_v(const void *const *inputs, void *const *outputs, const int64_t *vars);",
    "void model_free(void);", "const char *model_error(void);", "",
    "#ifdef __cplusplus", "}", "#endif", "#endif", ""]

  def arr(vals: list[str]) -> str: return "{" + ", ".join(vals or ["0"]) + "}"
  tensors = [f"  {{{_c_str(w.name)}, {_c_str(ST_DTYPES[w.dtype])}, {len(w.shape)}, {{{', '.join(str(int(s)) for s in w.shape) or '0'}}}, "
             f"{w.nbytes}, {max(1, w.dtype.itemsize)}}}," for w in weights]
  src = [
    f"/* model.c: {cap.name} exported by plugrad.export from a TinyJit capture on {cap.device}. Build with the Makefile",
    "   (its MODEL_CFLAGS are needed for plugrad's results); see docs/export.md. */",
    "#include <stdarg.h>", "#include <stdint.h>", "#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>",
    "#ifdef _OPENMP", "#include <omp.h>", "#endif", '#include "model.h"', "",
    "#ifndef MODEL_OMP_MIN_WORK", f"#define MODEL_OMP_MIN_WORK {OMP_MIN_WORK}LL  /* ops + bytes below which a parallel kernel keeps one thread */",
    "#endif", f"#define MODEL_NUM_WEIGHTS {n_w}", f"#define MODEL_SCRATCH_BYTES {total}", "",
    f"const size_t model_input_bytes[MODEL_NUM_INPUTS + 1] = {arr([str(s.nbytes) for s in cap.inputs])};",
    f"const size_t model_output_bytes[MODEL_NUM_OUTPUTS + 1] = {arr([str(s.nbytes) for s in cap.outputs])};",
    f"const char *const model_var_names[MODEL_NUM_VARS + 1] = {arr([_c_str(v.name) for v in cap.vars])};",
    f"const char *const model_output_desc[MODEL_NUM_OUTPUTS + 1] = {arr([_c_str(_desc(s)) for s in cap.outputs])};",
    f"const int64_t model_output_f32_last[MODEL_NUM_OUTPUTS + 1] = {arr([str(_f32_last(s)) for s in cap.outputs])};",
    f"const int64_t model_var_min[MODEL_NUM_VARS + 1] = {arr([str(v.lo) for v in cap.vars])};",
    f"const int64_t model_var_max[MODEL_NUM_VARS + 1] = {arr([str(v.hi) for v in cap.vars])};",
    f"const int64_t model_var_default[MODEL_NUM_VARS + 1] = {arr([str(v.value) for v in cap.vars])};", "",
    "typedef struct { const char *name, *dtype; int ndim; int64_t shape[8]; size_t nbytes; int align; } model_tensor_t;",
    "static const model_tensor_t model_tensors[MODEL_NUM_WEIGHTS + 1] = {", *tensors, *(["  {0}"] if not tensors else []), "};",
    "static unsigned char *model_w[MODEL_NUM_WEIGHTS + 1];  /* each weight's bytes, inside the loaded file */",
    "static unsigned char *model_file_raw, *model_scratch_raw, *model_scratch;", "static char model_err[512];", "static int model_ready;", "",
    "static int model_fail(const char *fmt, ...);", c_runtime.LOADER, c_runtime.READER]
  if embed_weights:
    src += ["/* ---- the weights, embedded: the bytes of model.safetensors */",
            f"static {'' if writes_weights else 'const '}unsigned char model_blob[{len(blob)}] __attribute__((aligned(64))) = {{",
            _split_numbers(blob), "};"]
    load = "weights_path ? model_load_file(weights_path) : model_parse((unsigned char *)model_blob, sizeof model_blob)"
  else: load = "model_load_file(weights_path ? weights_path : MODEL_WEIGHTS_FILE)"
  src += ["", "/* ---- kernel typedefs and helpers */", *preludes, "", "/* ---- kernels */"]
  for k in kernels.values(): src += [k.body]
  src += [c_runtime.API.replace("%LOAD%", load),
          "int model_run_v(const void *const *inputs, void *const *outputs, const int64_t *vars) {",
          '  if (!model_ready) return model_fail("model_run before a successful model_init");',
          "  (void)inputs; (void)outputs; (void)vars;",
          *[f'  if (vars[{i}] < {v.lo} || vars[{i}] > {v.hi}) return model_fail("variable {v.name} = %lld is outside [{v.lo}, {v.hi}]", '
            f"(long long)vars[{i}]);" for i, v in enumerate(cap.vars)],
          *run, "  return 0;", "}", "",
          f"int model_run(const void *const *inputs, void *const *outputs{vars_sig}) {{",
          f"  const int64_t vars[MODEL_NUM_VARS + 1] = {arr([c_identifier(v.name) for v in cap.vars])};",
          "  return model_run_v(inputs, outputs, vars);", "}", ""]
  files: dict[str, str | bytes] = {"model.c": "\n".join(src), "model.h": "\n".join(header), "main.c": c_runtime.MAIN,
                                   "Makefile": c_runtime.MAKEFILE}
  if not embed_weights: files["model.safetensors"] = blob
  return files


def _split_numbers(blob: bytes, per_line: int = 32) -> str:
  return ",\n".join(",".join(str(b) for b in blob[i:i + per_line]) for i in range(0, len(blob), per_line))


def write(cap: Captured, out_dir: Path, embed_weights: bool = False) -> list[Path]:
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for name, content in generate(cap, embed_weights).items():
    path = out_dir / name
    if isinstance(content, bytes): path.write_bytes(content)
    else: path.write_text(content)
    paths.append(path)
  return paths
