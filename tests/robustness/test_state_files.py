"""Malformed safetensors files (issue 22, item 6): each one raises `StateFileError` naming the file and what is wrong —
never a TypeError, RecursionError or numpy ValueError — in bounded time and memory; a fuzz test writes random bytes
over a valid file and over its header and accepts only StateFileError or a load equal to what the header describes."""
from __future__ import annotations

import json
import random
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrad import Tensor, dtypes
from plugrad.nn import formats
from plugrad.nn.state import StateFileError, safe_load, safe_load_metadata, safe_save

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def write(path: Path, header: bytes | dict | list | str, data: bytes = b"", length: int | None = None) -> Path:
  js = header if isinstance(header, bytes) else json.dumps(header).encode()
  path.write_bytes((len(js) if length is None else length).to_bytes(8, "little") + js + data)
  return path


def nested(depth: int) -> bytes: return b"[" * depth + b"]" * depth


# (header, data, length override) → a pattern the message must contain; each must be a StateFileError naming the file
CASES: dict[str, tuple[Any, bytes, int | None, str]] = {
  # the length prefix
  "empty file": (None, b"", None, "truncated or not a safetensors file: 0 bytes"),
  "seven bytes": (None, b"\x01" * 7, None, "less than the 8-byte header length"),
  "length 2**40": (b"{}", b"", 2**40, "over the 104857600-byte limit"),
  "length just over the limit": (b"{}", b"", formats.MAX_HEADER + 1, "over the 104857600-byte limit"),
  "length 2**64-1": (b"{}", b"", 2**64 - 1, "over the 104857600-byte limit"),
  "length beyond the file": (b"{}", b"", 100, "truncated: the header needs 100 bytes"),
  "length zero": (b"", b"", None, "not UTF-8 JSON"),
  # the JSON
  "not utf-8": (b"{\"w\xff\": 1}", b"", None, "not UTF-8 JSON"),
  "not json": (b"{not json", b"", None, "not UTF-8 JSON"),
  "truncated json": (b'{"w": {"dtype": "F32", "sha', b"", None, "not UTF-8 JSON"),
  "a list, not an object": (b"[1, 2]", b"", None, "a JSON list, not an object"),
  "a string, not an object": (b'"safetensors"', b"", None, "a JSON str, not an object"),
  "deeply nested list": (nested(100_000), b"", None, "nested too deeply"),
  "deeply nested in a tensor": (b'{"w": {"dtype": ' + nested(50_000) + b', "shape": [], "data_offsets": [0, 0]}}', b"", None, "nested too deeply"),
  "deeply nested objects": (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"", None, "nested too deeply"),
  "a 5000-digit number": (b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 0]}}', b"", None, "not UTF-8 JSON"),
  "duplicate tensor names": (b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
                             b'"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', bytes(16), None, "the key 'w' appears twice"),
  # a tensor's record
  "record not an object": ({"w": [1, 2, 3]}, b"", None, "tensor 'w': needs exactly dtype, shape and data_offsets"),
  "missing field": ({"w": {"dtype": "F32", "shape": [2]}}, bytes(8), None, "needs exactly dtype, shape and data_offsets"),
  "extra field": ({"w": {**F32_2, "device": "cuda"}}, bytes(8), None, "needs exactly dtype, shape and data_offsets"),
  "unknown dtype": ({"w": {**F32_2, "dtype": "C64"}}, bytes(8), None, "tensor 'w': unsupported dtype 'C64'"),
  "dtype a list": ({"w": {**F32_2, "dtype": ["F32"]}}, bytes(8), None, "unsupported dtype \\['F32'\\]"),
  "dtype an object": ({"w": {**F32_2, "dtype": {"F32": 1}}}, bytes(8), None, "unsupported dtype"),
  "dtype null": ({"w": {**F32_2, "dtype": None}}, bytes(8), None, "unsupported dtype None"),
  "shape not a list": ({"w": {**F32_2, "shape": "2"}}, bytes(8), None, "shape must be a list of ints >= 0"),
  "negative shape": ({"w": {**F32_2, "shape": [-2]}}, bytes(8), None, "shape must be a list of ints >= 0"),
  "float shape": ({"w": {**F32_2, "shape": [2.0]}}, bytes(8), None, "shape must be a list of ints >= 0"),
  "bool shape": ({"w": {**F32_2, "shape": [True, True]}}, bytes(8), None, "shape must be a list of ints >= 0"),
  "nested shape": ({"w": {**F32_2, "shape": [[2]]}}, bytes(8), None, "shape must be a list of ints >= 0"),
  "huge empty shape": ({"w": {"dtype": "F32", "shape": [2**70, 0], "data_offsets": [0, 0]}}, b"", None, "too big to address"),
  "huge empty shape 2": ({"w": {"dtype": "F64", "shape": [2**31, 2**31, 0], "data_offsets": [0, 0]}}, b"", None, "too big to address"),
  "100 dimensions": ({"w": {"dtype": "F32", "shape": [1] * 100, "data_offsets": [0, 4]}}, bytes(4), None, "100 dimensions, more than the 32"),
  "offsets not a list": ({"w": {**F32_2, "data_offsets": "0-8"}}, bytes(8), None, "data_offsets must be \\[begin, end\\]"),
  "three offsets": ({"w": {**F32_2, "data_offsets": [0, 4, 8]}}, bytes(8), None, "data_offsets must be \\[begin, end\\]"),
  "negative offset": ({"w": {**F32_2, "data_offsets": [-8, 0]}}, bytes(8), None, "data_offsets must be \\[begin, end\\]"),
  "offsets reversed": ({"w": {**F32_2, "data_offsets": [8, 0]}}, bytes(8), None, "data_offsets must be \\[begin, end\\]"),
  "string offsets": ({"w": {**F32_2, "data_offsets": ["0", "8"]}}, bytes(8), None, "data_offsets must be \\[begin, end\\]"),
  "offsets beyond 2**64": ({"w": {"dtype": "U8", "shape": [1], "data_offsets": [2**64, 2**64 + 1]}}, bytes(1), None, "a hole or an overlap"),
  "size mismatch": ({"w": {**F32_2, "shape": [3]}}, bytes(8), None, r"'w': data_offsets \[0, 8\] hold 8 bytes but F32 \[3\] needs 12"),
  # the data layout
  "offsets past the data": ({"w": F32_2}, bytes(5), None, "truncated: the tensors need 8 data bytes, the file holds 5"),
  "overlap": ({"w": F32_2, "v": {**F32_2, "data_offsets": [4, 12]}}, bytes(12), None, "a hole or an overlap"),
  "hole": ({"w": F32_2, "v": {**F32_2, "data_offsets": [12, 20]}}, bytes(20), None, "a hole or an overlap"),
  "trailing bytes": ({"w": F32_2}, bytes(12), None, "trailing bytes"),
  # the metadata
  "metadata not strings": ({"__metadata__": {"a": 1}}, b"", None, "__metadata__ must map strings to strings"),
  "metadata a list": ({"__metadata__": ["a"]}, b"", None, "__metadata__ must map strings to strings"),
  "metadata null": ({"__metadata__": None}, b"", None, "__metadata__ must map strings to strings"),
}


def make(tmp_path: Path, case: str) -> Path:
  header, data, length, _ = CASES[case]
  path = tmp_path / "bad.safetensors"
  if header is None: path.write_bytes(data)
  else: write(path, header, data, length)
  return path


@pytest.mark.parametrize("case", CASES)
def test_malformed_file_raises_state_file_error(tmp_path: Path, case: str):
  path = make(tmp_path, case)
  for load in (safe_load, safe_load_metadata):
    with pytest.raises(StateFileError, match=f"bad.safetensors: .*{CASES[case][3]}") as e: load(path)
    assert type(e.value) is StateFileError and e.value.path == str(path), case


def test_a_missing_file_is_an_os_error(tmp_path: Path):
  with pytest.raises(FileNotFoundError): safe_load(tmp_path / "nope.safetensors")
  with pytest.raises(IsADirectoryError): safe_load(tmp_path)


def test_a_bad_header_is_refused_before_the_data_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  path = write(tmp_path / "big.safetensors", {"w": {**F32_2, "dtype": "C64"}}, bytes(8))
  reads: list[int] = []
  real = formats._read_header
  monkeypatch.setattr(formats, "_read_header", lambda p, f, size: reads.append(size) or real(p, f, size))
  with pytest.raises(StateFileError, match="C64"): safe_load(path)
  assert reads == [path.stat().st_size]


def _many(tmp_path: Path, n: int, key: str = "data_offsets") -> Path:
  """n empty tensors: a 13 MB header for 200,000 (once: 22 s and 350 MB)."""
  body = ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"{key}":[0,0]}}' for i in range(n))
  return write(tmp_path / "many.safetensors", ("{" + body + "}").encode())


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "escaped-keys"])
def test_200k_tensors_are_refused_in_bounded_time_and_memory(tmp_path: Path, escaped: bool):
  path = _many(tmp_path, 200_000, "data\\u005foffsets" if escaped else "data_offsets")  # an escaped key defeats a byte count
  tracemalloc.start()
  st = time.perf_counter()
  try:
    with pytest.raises(StateFileError, match=f"more than {formats.MAX_TENSORS} tensors"): safe_load(path)
    _, peak = tracemalloc.get_traced_memory()
  finally: tracemalloc.stop()
  # the memory is what tells a bounded parse from the unbounded one (350 MB); the time only guards against a hang (a
  # loaded 2-core machine took 21 s for the bounded parse under tracemalloc, an idle one well under 10)
  assert time.perf_counter() - st < 60 and peak < 200 << 20, (time.perf_counter() - st, peak)


def test_a_giant_header_is_refused_without_reading_it(tmp_path: Path):
  path = tmp_path / "giant.safetensors"
  with open(path, "wb") as f:  # a sparse 150 MB file claiming a 150 MB header
    f.write((150 << 20).to_bytes(8, "little"))
    f.truncate(8 + (150 << 20))
  tracemalloc.start()
  try:
    with pytest.raises(StateFileError, match="over the 104857600-byte limit"): safe_load(path)
    assert tracemalloc.get_traced_memory()[1] < 1 << 20
  finally: tracemalloc.stop()


def test_many_tensors_under_the_limit_still_load(tmp_path: Path):
  got = safe_load(_many(tmp_path, 2000))
  assert len(got) == 2000 and got["t1999"].shape == (0,)


def test_bool_bytes_other_than_0_and_1_load_as_true(tmp_path: Path):
  path = write(tmp_path / "b.safetensors", {"b": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}, bytes([0, 1, 2, 255]))
  assert safe_load(path)["b"].tolist() == [False, True, True, True]


# ---- fuzzing

def valid_file(path: Path) -> Path:
  rng = np.random.default_rng(0)
  safe_save({"w": Tensor(rng.standard_normal((3, 4)).astype(np.float32)), "idx": Tensor(np.arange(5, dtype=np.int64)),
             "half": Tensor(rng.standard_normal(6).astype(np.float16)), "mask": Tensor(np.array([True, False, True])),
             "bf": Tensor(rng.standard_normal(4).astype(np.float32)).cast(dtypes.bfloat16), "empty": Tensor(np.zeros((0, 3), np.float32)),
             "u8": Tensor(np.arange(7, dtype=np.uint8)), "scalar": Tensor(np.float64(2.5))}, path, metadata={"format": "pt", "step": "7"})
  return path


NP = {"BOOL": np.uint8, "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
      "U64": np.uint64, "F16": np.float16, "BF16": np.uint16, "F32": np.float32, "F64": np.float64}


def check_load(path: Path) -> str:
  """'error' when safe_load refused the file with StateFileError, 'loaded' when it returned exactly what the header
  describes (checked here independently: names, dtypes, shapes, the bytes at each offset); anything else fails."""
  raw = path.read_bytes()
  try: got = safe_load(path)
  except StateFileError as e:
    assert str(e).startswith(f"{path}: "), e
    return "error"
  n = int.from_bytes(raw[:8], "little")
  header = json.loads(raw[8:8 + n])
  header.pop("__metadata__", None)
  assert set(got) == set(header)
  data = raw[8 + n:]
  for name, info in header.items():
    t = got[name]
    assert t.dtype is formats.SAFE_DTYPES[info["dtype"]] and t.shape == tuple(info["shape"]), name
    b, e = info["data_offsets"]
    want = np.frombuffer(data[b:e], np.dtype(NP[info["dtype"]]).newbyteorder("<"))
    have = (t.bitcast(dtypes.uint16) if t.dtype is dtypes.bfloat16 else t).numpy().reshape(-1)
    if info["dtype"] == "BOOL": want = want != 0
    assert have.tobytes() == want.astype(want.dtype.newbyteorder("=")).tobytes(), name
  return "loaded"


def damage(rng: random.Random, raw: bytes, lo: int, hi: int) -> bytes:
  out = bytearray(raw)
  for _ in range(rng.choice([1, 1, 2, 4])):
    at, k = rng.randrange(lo, hi), rng.choice([1, 1, 2, 3, 8])
    out[at:at + k] = rng.randbytes(k) if rng.random() < 0.8 else rng.choice([b"[", b"{", b"]", b"}", b'"', b",", b"0", b"-", b"9" * k])[:k]
  if rng.random() < 0.1: out = out[:rng.randrange(len(out))]  # and sometimes cut short
  return bytes(out)


@pytest.mark.parametrize("region", ["whole-file", "header"])
def test_fuzz_random_bytes_give_state_file_error_or_a_correct_load(tmp_path: Path, region: str):
  good = valid_file(tmp_path / "good.safetensors").read_bytes()
  assert check_load(tmp_path / "good.safetensors") == "loaded"
  n = int.from_bytes(good[:8], "little")
  lo, hi = (0, len(good)) if region == "whole-file" else (0, 8 + n)
  rng = random.Random(22)
  counts = {"error": 0, "loaded": 0}
  path = tmp_path / "fuzz.safetensors"
  for i in range(300):
    bad = damage(rng, good, lo, hi)
    path.write_bytes(bad)
    try: counts[check_load(path)] += 1
    except AssertionError as e: raise AssertionError(f"case {i}: {e}; file {bad[:8 + n + 16]!r}") from e
  assert counts["error"] > 100 and (region == "header" or counts["loaded"] > 20), counts  # the data region loads when damaged
