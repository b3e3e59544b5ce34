"""The ONNX backend node tests (the cases the `onnx` wheel ships in onnx/backend/test/data/node) run through
plugrad.onnx and graded as onnx's own backend runner grades them: every output's dtype and shape equal, values within
rtol 1e-3, atol 1e-7. `python tests/onnx/node_tests.py [--device DEV] [--filter TEXT] [--expanded] [--failures]
[--markdown FILE]` prints the summary (pass rate, refusals per op, exclusions with their reasons), every failure's first
line with --failures, and the per-op table with --markdown; tests/onnx/test_node_tests.py runs it under pytest."""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# What cannot be compared with another runtime, or what plugrad has no type for, with the reason (a case is excluded
# when its graph uses one of these ops or its data one of these types)
EXCLUDED_OPS = {
  "Bernoulli": "random", "RandomNormal": "random", "RandomNormalLike": "random", "RandomUniform": "random",
  "RandomUniformLike": "random", "Multinomial": "random",
  "StringConcat": "strings", "StringNormalizer": "strings", "StringSplit": "strings", "RegexFullMatch": "strings",
  "TfIdfVectorizer": "strings", "ImageDecoder": "image file decoding (bytes in, pixels out), not a tensor computation",
}
# Dropout in training mode with a non-zero ratio draws a random mask (the zero-ratio cases run)
EXCLUDED_CASES = {c: "Dropout in training mode: a random mask" for c in
                  ("test_training_dropout", "test_training_dropout_default", "test_training_dropout_default_mask", "test_training_dropout_mask")}
# Cases that run and differ, with why (each is a strict xfail in tests/onnx/test_node_tests.py)
KNOWN_FAILURES = {
  "test_dft_inverse": "values that are 0 come out as 5e-15 where the reference's float32 FFT leaves 1.9e-7 of rounding noise, "
                      "over the 1e-7 absolute tolerance",
  "test_dft_inverse_opset19": "the same as test_dft_inverse",
}
EXCLUDED_DOMAINS = {"ai.onnx.ml": "the classical-ML domain (tree ensembles, label encoders), not a tensor computation",
                    "ai.onnx.preview.training": "training-only optimizer ops (the preview domain)"}
EXCLUDED_TYPES = {8: "string tensors", 14: "complex numbers", 15: "complex numbers", 17: "float8", 18: "float8", 19: "float8",
                  20: "float8", 21: "4-bit integers", 22: "4-bit integers", 23: "float4", 24: "float8 (e8m0)", 25: "2-bit integers",
                  26: "2-bit integers"}


def node_test_dir() -> Path:
  import onnx
  return Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


@dataclass
class Result:
  case: str
  ops: tuple[str, ...]
  status: str  # passed, failed, unsupported (UnsupportedOnnxOpError or UnsupportedDTypeError: a clear refusal), excluded
  why: str = ""
  domain: str = "ai.onnx"  # the operator set of the case's op (its last node)


@dataclass
class Summary:
  results: list[Result] = field(default_factory=list)
  seconds: float = 0.0

  def count(self, status: str) -> int: return sum(r.status == status for r in self.results)

  def per_op(self) -> dict[str, collections.Counter[str]]:
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in self.results: table[r.ops[-1] if r.ops else "?"][r.status] += 1
    return dict(sorted(table.items()))

  def text(self) -> str:
    n, p, f, x, u = len(self.results), self.count("passed"), self.count("failed"), self.count("excluded"), self.count("unsupported")
    lines = [f"onnx node tests: {p} passed, {f} failed, {u} unsupported, {x} excluded of {n} cases in {self.seconds:.0f} s: "
             f"{100 * p / max(n, 1):.1f}% of all, {100 * p / max(n - x, 1):.1f}% of those not excluded"]
    ops = collections.Counter(r.ops[-1] for r in self.results if r.status == "unsupported")
    lines.append("  unsupported: " + (", ".join(f"{o} {c}" for o, c in ops.most_common()) or "none"))
    domains: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in self.results: domains[r.domain][r.status] += 1
    def rate(c: collections.Counter[str]) -> str:
      n_in = c.total() - c["excluded"]
      return f"{100 * c['passed'] / c.total():.1f}%, {100 * c['passed'] / n_in:.1f}% of the {n_in} not excluded" if n_in else "all excluded"
    lines.append("  per domain: " + "; ".join(f"{d} {c['passed']} of {c.total()} ({rate(c)})" for d, c in sorted(domains.items())))
    reasons = collections.Counter(r.why for r in self.results if r.status == "excluded")
    lines += [f"  excluded {c}: {why}" for why, c in reasons.most_common()]
    return "\n".join(lines)

  def markdown(self) -> str:
    rows = ["| op | passed | failed | unsupported | excluded |", "|---|---|---|---|---|"]
    for opname, c in self.per_op().items():
      rows.append(f"| {opname} | {c['passed']} | {c['failed']} | {c['unsupported']} | {c['excluded']} |")
    return "\n".join(rows)


def _load(pb: Path, tp: Any) -> Any:
  """A test's input or output file as the runner feeds it: a numpy array (TensorProto), a list of them (SequenceProto), or
  None or the value (OptionalProto), by the graph's declared type `tp` (as onnx's backend runner reads them)."""
  import onnx
  from onnx import numpy_helper
  kind = tp.WhichOneof("value")
  proto = {"sequence_type": onnx.SequenceProto, "optional_type": onnx.OptionalProto}.get(kind, onnx.TensorProto)()
  proto.ParseFromString(pb.read_bytes())
  if kind == "sequence_type": return numpy_helper.to_list(proto)
  if kind == "optional_type": return numpy_helper.to_optional(proto)
  return numpy_helper.to_array(proto)


def _elem_types(tp: Any) -> set[int]:
  """The element types in a value's type (through sequences and optionals); -1 for a map or a sparse tensor."""
  kind = tp.WhichOneof("value")
  if kind == "tensor_type": return {tp.tensor_type.elem_type}
  if kind in ("sequence_type", "optional_type"): return _elem_types(getattr(tp, kind).elem_type)
  return {-1}


def _types_in(model: Any) -> set[int]: return {t for vi in [*model.graph.input, *model.graph.output] for t in _elem_types(vi.type)}


def _mismatch(name: str, got: Any, ref: Any) -> str | None:
  """Why output `name` differs from the reference (None when it matches): a sequence element by element, an optional
  empty or not, a tensor's dtype and shape equal and its values within the tolerance (AssertionError)."""
  from plugrad.dtype import dtypes
  from plugrad.tensor import Tensor
  if ref is None or got is None:
    return None if ref is None and got is None else f"{name}: {'an empty optional' if got is None else 'a value'}, expected the other"
  if isinstance(ref, list):
    if not isinstance(got, list): return f"{name}: a {type(got).__name__}, expected a sequence"
    if len(got) != len(ref): return f"{name}: a sequence of {len(got)}, expected {len(ref)}"
    return next((m for i, (g, r) in enumerate(zip(got, ref)) if (m := _mismatch(f"{name}[{i}]", g, r)) is not None), None)
  if not isinstance(got, Tensor): return f"{name}: a {type(got).__name__}, expected a tensor"
  arr = got.float().numpy() if got.dtype == dtypes.bfloat16 else got.numpy()  # numpy has no bfloat16: compare in float32
  if ref.dtype.name == "bfloat16" and got.dtype == dtypes.bfloat16: ref = ref.astype(np.float32)
  if arr.dtype != ref.dtype: return f"{name}: dtype {arr.dtype}, expected {ref.dtype}"
  if arr.shape != ref.shape: return f"{name}: shape {arr.shape}, expected {ref.shape}"
  if ref.dtype.kind in "fc": np.testing.assert_allclose(arr, ref, rtol=1e-3, atol=1e-7)
  else: np.testing.assert_array_equal(arr, ref)
  return None


def run_case(case_dir: Path, device: str | None = None) -> Result:
  import onnx

  from plugrad.errors import UnsupportedDTypeError
  from plugrad.onnx import OnnxModel, UnsupportedOnnxOpError
  model = onnx.load(str(case_dir / "model.onnx"))
  ops = tuple(n.op_type for n in model.graph.node)
  domain = (model.graph.node[-1].domain if model.graph.node else "") or "ai.onnx"
  def result(status: str, why: str = "") -> Result: return Result(case_dir.name, ops, status, why, domain)
  if case_dir.name in EXCLUDED_CASES: return result("excluded", EXCLUDED_CASES[case_dir.name])
  for n in model.graph.node:
    if n.domain in EXCLUDED_DOMAINS: return result("excluded", EXCLUDED_DOMAINS[n.domain])
    if n.op_type in EXCLUDED_OPS: return result("excluded", EXCLUDED_OPS[n.op_type])
  types = _types_in(model)
  if -1 in types: return result("excluded", "map or sparse-tensor values")
  for t in types:
    if t in EXCLUDED_TYPES: return result("excluded", EXCLUDED_TYPES[t])
  try:
    m = OnnxModel(model, device)
    def files(data: Path, kind: str, vis: Any) -> list[Any]:
      pbs = sorted(data.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
      return [_load(p, vi.type) for p, vi in zip(pbs, vis)]
    for data in sorted(case_dir.glob("test_data_set_*")):
      feed = dict(zip([vi.name for vi in model.graph.input], files(data, "input", model.graph.input)))
      outs = m(**{s.name: feed[s.name] for s in m.inputs})
      for name, ref in zip(m.outputs, files(data, "output", model.graph.output)):
        if (why := _mismatch(name, outs[name], ref)) is not None: return result("failed", why)
  except Exception as e:
    msg = " ".join(f"{type(e).__name__}: {e}".split())
    refused = isinstance(e, (UnsupportedOnnxOpError, UnsupportedDTypeError))  # typed refusals naming the op or the dtype
    return result("unsupported" if refused else "failed", msg[:300])
  return result("passed")


def cases(filter_: str = "", expanded: bool = False) -> list[Path]:
  """The base cases (or, with `expanded`, also the *_expanded ones: the same ops written as their function bodies)."""
  return sorted(d for d in node_test_dir().iterdir() if d.is_dir() and (expanded or "expanded" not in d.name) and filter_ in d.name)


def run(device: str | None = None, filter_: str = "", progress: bool = False, expanded: bool = False) -> Summary:
  st = time.monotonic()
  s = Summary()
  todo = cases(filter_, expanded)
  for i, d in enumerate(todo):
    s.results.append(run_case(d, device))
    if progress and i % 100 == 99: print(f"  {i + 1}/{len(todo)} ({time.monotonic() - st:.0f} s)", file=sys.stderr, flush=True)
  s.seconds = time.monotonic() - st
  return s


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--device", default=os.environ.get("DEV"))
  ap.add_argument("--filter", default="", help="only the cases whose directory name contains this")
  ap.add_argument("--markdown", help="write the per-op table here")
  ap.add_argument("--failures", action="store_true", help="print every failure with its first line")
  ap.add_argument("--expanded", action="store_true", help="also the *_expanded cases (the ops as their function bodies)")
  args = ap.parse_args(argv)
  s = run(args.device, args.filter, progress=True, expanded=args.expanded)
  if args.failures:
    for r in s.results:
      if r.status in ("failed", "unsupported"): print(f"{r.status.upper()} {r.case}: {r.why}")
  print(s.text())
  if args.markdown: Path(args.markdown).write_text(s.markdown() + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
