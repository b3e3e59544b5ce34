"""Tensor files: safetensors (read and written here, byte for byte the format of the `safetensors` package) and numpy
`.npz` (read). Every check runs before a tensor is made, so a bad file raises `StateFileError` (naming the file and
what is wrong) and yields nothing; a save goes through a temporary file, so a failed save leaves no half-written file.

safetensors layout: 8 bytes little-endian u64 N, N bytes of JSON `{name: {"dtype", "shape", "data_offsets": [b, e]},
"__metadata__": {str: str}}` (padded with spaces), then the raw little-endian data; offsets are relative to the data
and must cover it exactly, with no holes or overlaps.

Reading a file an attacker wrote is safe (docs/security.md, "State files"): whatever the bytes, `safe_load` returns
the tensors the header describes or raises `StateFileError` — never another exception, a crash or a partial result —
in time and memory bounded by the limits below. The header is read and checked before the data (a bad header is
refused without reading gigabytes), duplicate names are refused, and BOOL bytes other than 0 and 1 load as True.
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
MAX_TENSORS = 100_000  # per file: bounds the time (~0.1 ms per tensor made) and memory of a load; real checkpoints have < 10,000
MAX_DIMS = 32          # numpy's limit (1.x); real tensors have fewer than 8
_MAX_ELEMENTS = 1 << 62  # a shape's element count, zero dimensions counted as 1, times the itemsize must stay below 2**63 (numpy)


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


class _Refused(Exception):
  """Raised inside the JSON parser's hook to stop parsing a header that is already known to be bad."""


def _read_header(path: Path, f: Any, size: int) -> tuple[bytes, int]:
  """The header's JSON bytes and the length of the data after it, read (and checked) without reading the data."""
  head = f.read(8)
  if len(head) < 8: raise StateFileError(path, f"truncated or not a safetensors file: {len(head)} bytes, less than the 8-byte header length")
  n = int.from_bytes(head, "little")
  if n > MAX_HEADER: raise StateFileError(path, f"not a safetensors file: header length {n} is over the {MAX_HEADER}-byte limit")
  if 8 + n > size: raise StateFileError(path, f"truncated: the header needs {n} bytes but the file has {max(0, size - 8)} after the length")
  if len(raw := f.read(n)) != n: raise StateFileError(path, f"truncated: the header needs {n} bytes but only {len(raw)} could be read")
  return raw, size - 8 - n


def _json(path: Path, raw: bytes) -> Any:
  """The header as JSON objects, refusing more than MAX_TENSORS objects, a repeated key or deep nesting while parsing."""
  if raw.count(b'"data_offsets"') > MAX_TENSORS:  # the quick refusal, before building anything
    raise StateFileError(path, f"refused: the header describes more than {MAX_TENSORS} tensors (plugrad.nn.formats.MAX_TENSORS)")
  objects = 0
  def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    nonlocal objects
    objects += 1
    if objects > MAX_TENSORS + 2:  # a tensor is one object; the metadata and the header itself two more
      raise _Refused(f"refused: the header describes more than {MAX_TENSORS} tensors (plugrad.nn.formats.MAX_TENSORS)")
    d = dict(pairs)
    if len(d) != len(pairs):
      seen: set[str] = set()
      dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
      raise _Refused(f"corrupt header: the key {dup[:200]!r} appears twice in one object")
    return d
  try: text = raw.decode("utf-8")
  except UnicodeDecodeError as e: raise StateFileError(path, f"corrupt header: not UTF-8 JSON ({e})") from None
  try: return json.loads(text, object_pairs_hook=hook)
  except _Refused as e: raise StateFileError(path, str(e)) from None
  except RecursionError: raise StateFileError(path, "corrupt header: JSON nested too deeply (a safetensors header is 3 levels deep)") from None
  except MemoryError: raise StateFileError(path, f"refused: the {len(raw)}-byte header does not fit in memory when parsed") from None
  except ValueError as e: raise StateFileError(path, f"corrupt header: not UTF-8 JSON ({str(e)[:300]})") from None  # incl. over-long numbers


def _shape(shape: Any, dt: DType) -> str | None:
  """Why `shape` is not a valid shape for dtype `dt`, or None."""
  if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
    return f"shape must be a list of ints >= 0, got {shape!r}"[:300]
  if len(shape) > MAX_DIMS: return f"shape has {len(shape)} dimensions, more than the {MAX_DIMS} a tensor may have"
  if prod(max(s, 1) for s in shape) * dt.itemsize >= _MAX_ELEMENTS:
    return f"shape {shape} is too big to address (over 2**62 bytes even counting a zero dimension as 1)"[:300]
  return None


def _parse_header(path: Path, raw: bytes, data_len: int) -> tuple[dict[str, tuple[DType, tuple[int, ...], int, int]], dict[str, str]]:
  """(name → (dtype, shape, begin, end)) and the metadata of a header whose data part holds `data_len` bytes."""
  header = _json(path, raw)
  if not isinstance(header, dict): raise StateFileError(path, f"corrupt header: a JSON {type(header).__name__}, not an object")
  meta = header.pop("__metadata__", {})
  if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
    raise StateFileError(path, "corrupt header: __metadata__ must map strings to strings")
  entries: dict[str, tuple[DType, tuple[int, ...], int, int]] = {}
  for name, info in header.items():
    def bad(why: str, name: str = name) -> StateFileError: return StateFileError(path, f"tensor {name[:200]!r}: {why}")
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
      raise bad(f"needs exactly dtype, shape and data_offsets, got {info!r}"[:400])
    if not isinstance(dname := info["dtype"], str) or (dt := SAFE_DTYPES.get(dname)) is None:
      raise bad(f"unsupported dtype {dname!r} (supported: {', '.join(SAFE_DTYPES)})"[:400])
    shape, offs = info["shape"], info["data_offsets"]
    if (why := _shape(shape, dt)) is not None: raise bad(why)
    if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1]:
      raise bad(f"data_offsets must be [begin, end] with 0 <= begin <= end, got {offs!r}"[:300])
    if (need := prod(shape) * dt.itemsize) != offs[1] - offs[0]:
      raise bad(f"data_offsets {offs} hold {offs[1] - offs[0]} bytes but {dname} {shape} needs {need}"[:300])
    entries[name] = (dt, tuple(shape), offs[0], offs[1])
  pos = 0
  for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
    if begin != pos:
      raise StateFileError(path, f"corrupt data layout: tensor {name[:200]!r} starts at {begin}, expected {pos} (a hole or an overlap)")
    pos = end
  if pos != data_len:
    why = "truncated" if pos > data_len else "corrupt: trailing bytes"
    raise StateFileError(path, f"{why}: the tensors need {pos} data bytes, the file holds {data_len}")
  return entries, meta


def _open(p: Path) -> tuple[Any, int]:
  f = open(p, "rb")  # a missing file or a directory is an OSError (FileNotFoundError, ...), not a malformed file
  try: return f, os.fstat(f.fileno()).st_size
  except BaseException:
    f.close()
    raise


def safe_load(path: str | os.PathLike[str], device: str | None = None) -> dict[str, Tensor]:
  """The tensors of a .safetensors file, by name, on `device` (default: Device.DEFAULT)."""
  p = Path(path)
  f, size = _open(p)
  with f:
    raw, data_len = _read_header(p, f, size)
    entries, _ = _parse_header(p, raw, data_len)
    data = f.read(data_len)
  if len(data) != data_len: raise StateFileError(p, f"truncated: the tensors need {data_len} data bytes, only {len(data)} could be read")
  def arr(dt: DType, shape: tuple[int, ...], b: int) -> np.ndarray:
    if not prod(shape): return np.empty(shape, _np_dtype(dt))
    if dt is dtypes.bool: return (np.frombuffer(data, np.uint8, prod(shape), b) != 0).reshape(shape)  # any nonzero byte is True
    return np.frombuffer(data, _np_dtype(dt), prod(shape), b).reshape(shape)
  return {name: _to_tensor(arr(dt, shape, b), dt, device) for name, (dt, shape, b, _) in entries.items()}


def safe_load_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
  """The `__metadata__` strings of a .safetensors file (the header is fully validated against the file's size)."""
  p = Path(path)
  f, size = _open(p)
  with f: return _parse_header(p, *_read_header(p, f, size))[1]


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
