"""Tensor files: safetensors (read and written here, byte for byte the format of the `safetensors` package) and numpy
`.npz` (read). Every check runs before a tensor is made, so a bad file raises `StateFileError` (naming the file and
what is wrong) and yields nothing; a save goes through a temporary file, so a failed save leaves no half-written file.

safetensors layout: 8 bytes little-endian u64 N, N bytes of JSON `{name: {"dtype", "shape", "data_offsets": [b, e]},
"__metadata__": {str: str}}` (padded with spaces), then the raw little-endian data; offsets are relative to the data
and must cover it exactly, with no holes or overlaps.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from plugrad.dtype import DType, dtypes
from plugrad.helpers import prod
from plugrad.tensor import Tensor

SAFE_DTYPES: dict[str, DType] = {
  "BOOL": dtypes.bool, "I8": dtypes.int8, "I16": dtypes.int16, "I32": dtypes.int32, "I64": dtypes.int64, "U8": dtypes.uint8,
  "U16": dtypes.uint16, "U32": dtypes.uint32, "U64": dtypes.uint64, "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32,
  "F64": dtypes.float64}
SAFE_NAMES: dict[DType, str] = {v: k for k, v in SAFE_DTYPES.items()}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors package's limit: a bigger "length" is a corrupt file, not a header to read


class StateFileError(ValueError):
  """A tensor file that cannot be read (corrupt, truncated, not that format) or tensors that cannot be saved."""
  def __init__(self, path: str | os.PathLike[str], problem: str):
    super().__init__(f"{os.fspath(path)}: {problem}")
    self.path, self.problem = os.fspath(path), problem


def _np_dtype(dt: DType) -> np.dtype:
  # bfloat16 travels as its bit pattern (numpy has no bfloat16); everything else as explicit little-endian
  return np.dtype(np.uint16 if dt is dtypes.bfloat16 else dtypes.to_numpy(dt)).newbyteorder("<")


def _to_tensor(arr: np.ndarray, dt: DType, device: str | None) -> Tensor:
  arr = arr.astype(arr.dtype.newbyteorder("="), order="C", copy=False)  # native byte order and C layout for the device buffer
  t = Tensor(arr, device=device)
  return t.bitcast(dtypes.bfloat16) if dt is dtypes.bfloat16 else t


def _parse_header(path: Path, raw: bytes) -> tuple[dict[str, tuple[DType, tuple[int, ...], int, int]], dict[str, str], int]:
  """(name → (dtype, shape, begin, end)), the metadata, and where the data starts."""
  if len(raw) < 8: raise StateFileError(path, f"truncated or not a safetensors file: {len(raw)} bytes, less than the 8-byte header length")
  n = int.from_bytes(raw[:8], "little")
  if n > MAX_HEADER: raise StateFileError(path, f"not a safetensors file: header length {n} is over the {MAX_HEADER}-byte limit")
  if 8 + n > len(raw): raise StateFileError(path, f"truncated: the header needs {n} bytes but the file has {len(raw) - 8} after the length")
  try: header = json.loads(raw[8:8 + n].decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e: raise StateFileError(path, f"corrupt header: not UTF-8 JSON ({e})") from None
  if not isinstance(header, dict): raise StateFileError(path, f"corrupt header: a JSON {type(header).__name__}, not an object")
  meta = header.pop("__metadata__", {})
  if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
    raise StateFileError(path, "corrupt header: __metadata__ must map strings to strings")
  entries: dict[str, tuple[DType, tuple[int, ...], int, int]] = {}
  for name, info in header.items():
    def bad(why: str, name: str = name) -> StateFileError: return StateFileError(path, f"tensor {name!r}: {why}")
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
      raise bad(f"needs exactly dtype, shape and data_offsets, got {info!r}")
    if (dt := SAFE_DTYPES.get(info["dtype"])) is None: raise bad(f"unsupported dtype {info['dtype']!r} (supported: {', '.join(SAFE_DTYPES)})")
    shape, offs = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
      raise bad(f"shape must be a list of ints >= 0, got {shape!r}")
    if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1]:
      raise bad(f"data_offsets must be [begin, end] with 0 <= begin <= end, got {offs!r}")
    if (need := prod(shape) * dt.itemsize) != offs[1] - offs[0]:
      raise bad(f"data_offsets {offs} hold {offs[1] - offs[0]} bytes but {info['dtype']} {shape} needs {need}")
    entries[name] = (dt, tuple(shape), offs[0], offs[1])
  data_len, pos = len(raw) - 8 - n, 0
  for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
    if begin != pos: raise StateFileError(path, f"corrupt data layout: tensor {name!r} starts at {begin}, expected {pos} (a hole or an overlap)")
    pos = end
  if pos != data_len:
    why = "truncated" if pos > data_len else "corrupt: trailing bytes"
    raise StateFileError(path, f"{why}: the tensors need {pos} data bytes, the file holds {data_len}")
  return entries, meta, 8 + n


def safe_load(path: str | os.PathLike[str], device: str | None = None) -> dict[str, Tensor]:
  """The tensors of a .safetensors file, by name, on `device` (default: Device.DEFAULT)."""
  p = Path(path)
  raw = p.read_bytes()
  entries, _, start = _parse_header(p, raw)
  def arr(dt: DType, shape: tuple[int, ...], b: int) -> np.ndarray:
    if not prod(shape): return np.empty(shape, _np_dtype(dt))
    return np.frombuffer(raw, _np_dtype(dt), prod(shape), start + b).reshape(shape)
  return {name: _to_tensor(arr(dt, shape, b), dt, device) for name, (dt, shape, b, _) in entries.items()}


def safe_load_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
  """The `__metadata__` strings of a .safetensors file (the file is fully validated)."""
  p = Path(path)
  return _parse_header(p, p.read_bytes())[1]


def _check_saveable(name: str, t: Tensor, path: Path) -> None:
  if not isinstance(t, Tensor): raise StateFileError(path, f"cannot save {name!r}: a {type(t).__name__}, not a Tensor")
  if t.dtype not in SAFE_NAMES: raise StateFileError(path, f"cannot save {name!r}: dtype {t.dtype} has no safetensors name")
  if not all(isinstance(s, int) for s in t.shape): raise StateFileError(path, f"cannot save {name!r}: symbolic shape {t.shape}")


def _host_bytes(t: Tensor) -> bytes:
  arr = (t.bitcast(dtypes.uint16) if t.dtype is dtypes.bfloat16 else t).numpy()
  return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def safe_save(tensors: dict[str, Tensor], path: str | os.PathLike[str], metadata: dict[str, str] | None = None) -> None:
  """Write `tensors` to a .safetensors file (realizing them), replacing `path` only once the whole file is written."""
  p = Path(path)
  if not isinstance(tensors, dict): raise TypeError(f"safe_save needs a dict of name -> Tensor, got a {type(tensors).__name__}")
  if bad := [k for k in tensors if not isinstance(k, str) or k == "__metadata__"]: raise StateFileError(p, f"cannot save under the name(s) {bad}")
  if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise StateFileError(p, "metadata must map strings to strings")
  for k, t in tensors.items(): _check_saveable(k, t, p)
  if tensors: Tensor.realize(*tensors.values())  # one run for all of them, then each is copied out
  blobs = {k: _host_bytes(t) for k, t in tensors.items()}
  header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
  pos = 0
  for k, t in tensors.items():
    header[k] = {"dtype": SAFE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + len(blobs[k])]}
    pos += len(blobs[k])
  js = json.dumps(header, separators=(",", ":")).encode("utf-8")
  js += b" " * (-len(js) % 8)  # the data starts 8-byte aligned, as the safetensors package writes it
  _atomic_write(p, [len(js).to_bytes(8, "little"), js, *blobs.values()])


def _atomic_write(path: Path, chunks: list[bytes]) -> None:
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      for c in chunks: f.write(c)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def npz_load(path: str | os.PathLike[str], device: str | None = None) -> dict[str, Tensor]:
  """The arrays of a numpy .npz archive (np.savez / np.savez_compressed) as tensors on `device`; no pickles."""
  p = Path(path)
  try:
    z = np.load(p, allow_pickle=False)
    if not isinstance(z, np.lib.npyio.NpzFile): raise StateFileError(p, "not an .npz archive (a single .npy array?)")
    with z: arrays = {k: z[k] for k in z.files}
  except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as e:
    if isinstance(e, StateFileError): raise
    if isinstance(e, ValueError) and "allow_pickle" in str(e): raise StateFileError(p, "holds pickled Python objects (never loaded)") from None
    raise StateFileError(p, f"corrupt or truncated .npz: {type(e).__name__}: {e}") from None
  for k, a in arrays.items():
    if a.dtype.kind not in "biuf" or a.dtype.itemsize > 8: raise StateFileError(p, f"array {k!r} has dtype {a.dtype}, which a Tensor cannot hold")
  return {k: _to_tensor(a, dtypes.from_numpy(a.dtype.newbyteorder("=")), device) for k, a in arrays.items()}
