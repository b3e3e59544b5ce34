"""State dicts (naming, load checks that leave the model unchanged) and tensor files (safetensors bit-exact round
trips, with the `safetensors` package and PyTorch where installed; corrupt and truncated files; .npz)."""
import json
import os
from collections import namedtuple

import numpy as np
import pytest

from plugrad import Tensor, dtypes, nn
from plugrad.nn.state import StateDictError, StateFileError, get_parameters, get_state_dict, load_state_dict, npz_load, safe_load, safe_save

RNG = np.random.default_rng(0)


class Net:
  def __init__(self):
    self.conv = nn.Conv2d(1, 2, 3)
    self.blocks = [nn.Linear(3, 4), nn.BatchNorm(4)]
    self.heads = {"out": nn.Linear(4, 2, bias=False)}
    self.scale, self.name, self.nothing = Tensor([2.0], requires_grad=False), "net", None


def snapshot(model) -> dict[str, np.ndarray]: return {k: v.numpy().copy() for k, v in get_state_dict(model).items()}


def test_state_dict_names_follow_attributes_lists_and_dicts():
  assert list(get_state_dict(Net())) == ["conv.weight", "conv.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
                                         "blocks.1.num_batches_tracked", "blocks.1.running_mean", "blocks.1.running_var", "heads.out.weight",
                                         "scale"]
  assert list(get_state_dict(nn.Linear(2, 2), prefix="enc")) == ["enc.weight", "enc.bias"]


def test_state_dict_of_tuples_namedtuples_shared_tensors_and_cycles():
  Pair = namedtuple("Pair", ["left", "right"])
  shared = Tensor([1.0])

  class Tree:
    def __init__(self):
      self.pair, self.tup, self.me = Pair(shared, Tensor([2.0])), (shared,), self
  sd = get_state_dict(Tree())
  assert list(sd) == ["pair.left", "pair.right", "tup.0"] and sd["pair.left"] is sd["tup.0"]
  assert len(get_parameters(Tree())) == 2  # the shared tensor once


def test_load_state_dict_copies_values_into_the_models_own_memory():
  src, dst = Net(), Net()
  want = snapshot(src)
  loaded = load_state_dict(dst, get_state_dict(src))
  assert len(loaded) == len(want)
  for k, v in snapshot(dst).items(): np.testing.assert_array_equal(v, want[k])
  src.conv.weight.assign(src.conv.weight * 0).realize()  # changing the source afterwards does not reach the copy
  np.testing.assert_array_equal(dst.conv.weight.numpy(), want["conv.weight"])


def test_load_state_dict_handles_sources_that_read_the_model():
  """Swapping two layers of one model: each copy must read the other layer's value from before the load."""
  class Two:
    def __init__(self): self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
  m = Two()
  before = snapshot(m)
  load_state_dict(m, {"a.weight": m.b.weight, "a.bias": m.b.bias, "b.weight": m.a.weight, "b.bias": m.a.bias})
  np.testing.assert_array_equal(m.a.weight.numpy(), before["b.weight"])
  np.testing.assert_array_equal(m.b.weight.numpy(), before["a.weight"])


def _bad_dicts():
  good = get_state_dict(Net())
  missing = dict(good); del missing["heads.out.weight"]
  extra = {**good, "zzz.weight": Tensor([1.0])}
  shape = {**good, "heads.out.weight": Tensor.zeros(4, 2)}  # the last key: every key is checked before any write
  dtype = {**good, "scale": Tensor([2], dtype=dtypes.int32)}
  not_tensor = {**good, "scale": np.array([2.0], np.float32)}
  return [(missing, r"missing keys \['heads.out.weight'\]"), (extra, r"unexpected keys \['zzz.weight'\]"),
          (shape, r"'heads.out.weight' has shape \(4, 2\), the model's tensor \(2, 4\)"), (dtype, r"'scale' has dtype dtypes.int32"),
          (not_tensor, r"'scale' is a ndarray")]


@pytest.mark.parametrize("case", range(5))
def test_a_failed_load_changes_nothing(case):
  bad, pattern = _bad_dicts()[case]
  target = Net()
  before = snapshot(target)
  with pytest.raises(StateDictError, match="nothing was loaded.*" + pattern): load_state_dict(target, bad)
  for k, v in snapshot(target).items(): np.testing.assert_array_equal(v, before[k])


def test_non_strict_load_allows_missing_and_unexpected_keys_but_not_mismatches():
  m = Net()
  load_state_dict(m, {"scale": Tensor([5.0]), "other": Tensor([1.0])}, strict=False)
  assert m.scale.item() == 5.0
  with pytest.raises(StateDictError, match="shape"): load_state_dict(m, {"scale": Tensor([1.0, 2.0])}, strict=False)


# ---------------------------------------------------------------- safetensors

SAMPLES = {
  "f32": np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38, -1.5], np.float32),
  "f16": np.array([[0.0, -0.0], [np.inf, 6e-8], [65504, -2.5]], np.float16),
  "f64": np.array([np.pi, -np.e, 5e-324, np.nan]),
  "bf16": np.array([0x3F80, 0xC000, 0x7F80, 0x0001, 0x7FC1, 0x8000], np.uint16),  # bit patterns: 1, -2, inf, subnormal, nan, -0
  "i8": np.array([-128, 127, 0], np.int8), "i16": np.array([-32768, 32767], np.int16), "i32": np.array([[-(2**31), 2**31 - 1]], np.int32),
  "i64": np.array([-(2**63), 2**63 - 1, 7], np.int64), "u8": np.array([0, 255], np.uint8), "u16": np.array([65535], np.uint16),
  "u32": np.array([2**32 - 1, 1], np.uint32), "u64": np.array([2**64 - 1, 3], np.uint64), "bool": np.array([True, False, True]),
  "scalar": np.array(1.25, np.float32), "empty": np.zeros((2, 0), np.float32),
}


def to_tensor(name: str, a: np.ndarray) -> Tensor: return Tensor(a).bitcast(dtypes.bfloat16) if name == "bf16" else Tensor(a)


def bits(t: Tensor) -> bytes: return (t.bitcast(dtypes.uint16) if t.dtype is dtypes.bfloat16 else t).numpy().tobytes()


def test_safetensors_round_trip_is_bit_exact_for_every_dtype(tmp_path):
  path = tmp_path / "all.safetensors"
  tensors = {k: to_tensor(k, a) for k, a in SAMPLES.items()}
  safe_save(tensors, path, metadata={"format": "pt"})
  back = safe_load(path)
  assert list(back) == list(SAMPLES)
  for k, t in tensors.items():
    assert back[k].dtype is t.dtype and back[k].shape == t.shape, k
    assert bits(back[k]) == bits(t), k


def test_safetensors_file_layout(tmp_path):
  path = tmp_path / "x.safetensors"
  safe_save({"a": Tensor([1.0, 2.0]), "b": Tensor([[3]], dtype=dtypes.int64)}, path)
  raw = path.read_bytes()
  n = int.from_bytes(raw[:8], "little")
  assert n % 8 == 0  # data 8-byte aligned
  header = json.loads(raw[8:8 + n])
  assert header == {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "I64", "shape": [1, 1], "data_offsets": [8, 16]}}
  assert raw[8 + n:] == np.array([1.0, 2.0], "<f4").tobytes() + np.array([3], "<i8").tobytes()


def test_a_failed_save_leaves_the_old_file(tmp_path):
  path = tmp_path / "keep.safetensors"
  safe_save({"a": Tensor([1.0])}, path)
  before = path.read_bytes()
  with pytest.raises(StateFileError, match="keep.safetensors.*'b'.*not a Tensor"): safe_save({"a": Tensor([2.0]), "b": [1.0]}, path)
  with pytest.raises(StateFileError, match="__metadata__"): safe_save({"__metadata__": Tensor([2.0])}, path)
  assert path.read_bytes() == before and os.listdir(tmp_path) == ["keep.safetensors"]


def _file(tmp_path, header: bytes | dict, data: bytes = b"", length: int | None = None) -> str:
  h = header if isinstance(header, bytes) else json.dumps(header).encode()
  path = tmp_path / "bad.safetensors"
  path.write_bytes((len(h) if length is None else length).to_bytes(8, "little") + h + data)
  return str(path)


F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
CORRUPT = {
  "empty": (lambda p: (p / "bad.safetensors").write_bytes(b"") or str(p / "bad.safetensors"), "truncated or not a safetensors file: 0 bytes"),
  "huge length": (lambda p: _file(p, b"{}", length=2**40), "over the 104857600-byte limit"),
  "short header": (lambda p: _file(p, b"{}", length=100), "truncated: the header needs 100 bytes"),
  "not json": (lambda p: _file(p, b"{not json"), "not UTF-8 JSON"),
  "not an object": (lambda p: _file(p, b"[1, 2]"), "a JSON list, not an object"),
  "bad dtype": (lambda p: _file(p, {"w": {**F32_2, "dtype": "C64"}}, bytes(8)), "tensor 'w': unsupported dtype 'C64'"),
  "bad shape": (lambda p: _file(p, {"w": {**F32_2, "shape": [-2]}}, bytes(8)), "tensor 'w': shape must be a list of ints >= 0"),
  "size mismatch": (lambda p: _file(p, {"w": {**F32_2, "shape": [3]}}, bytes(8)), r"'w': data_offsets \[0, 8\] hold 8 bytes but F32 \[3\] needs 12"),
  "missing field": (lambda p: _file(p, {"w": {"dtype": "F32", "shape": [2]}}, bytes(8)), "needs exactly dtype, shape and data_offsets"),
  "truncated data": (lambda p: _file(p, {"w": F32_2}, bytes(5)), "truncated: the tensors need 8 data bytes, the file holds 5"),
  "trailing bytes": (lambda p: _file(p, {"w": F32_2}, bytes(12)), "trailing bytes"),
  "overlap": (lambda p: _file(p, {"w": F32_2, "v": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)), "a hole or an overlap"),
  "bad metadata": (lambda p: _file(p, {"__metadata__": {"a": 1}}), "__metadata__ must map strings to strings"),
}


@pytest.mark.parametrize("case", CORRUPT)
def test_corrupt_or_truncated_safetensors_raise_a_clear_error(tmp_path, case):
  make, pattern = CORRUPT[case]
  path = make(tmp_path)
  with pytest.raises(StateFileError, match=f"bad.safetensors: .*{pattern}"): safe_load(path)


def test_a_saved_file_cut_anywhere_is_reported_truncated(tmp_path):
  path = tmp_path / "m.safetensors"
  safe_save(get_state_dict(nn.Linear(3, 2)), path)
  raw = path.read_bytes()
  for cut in (3, 12, len(raw) - 1):
    path.write_bytes(raw[:cut])
    with pytest.raises(StateFileError, match="truncated"): safe_load(path)


def test_model_round_trip_through_a_file(tmp_path, training):
  a, b = Net(), Net()
  safe_save(get_state_dict(a), tmp_path / "net.safetensors")
  load_state_dict(b, safe_load(tmp_path / "net.safetensors"))
  x = Tensor(RNG.standard_normal((2, 3)).astype(np.float32))
  np.testing.assert_array_equal(b.blocks[1](b.blocks[0](x)).numpy(), a.blocks[1](a.blocks[0](x)).numpy())


def test_interop_with_the_safetensors_package_numpy(tmp_path):
  st = pytest.importorskip("safetensors.numpy")
  samples = {k: a for k, a in SAMPLES.items() if k != "bf16"}  # numpy has no bfloat16
  safe_save({k: Tensor(a) for k, a in samples.items()}, tmp_path / "ours.safetensors")
  theirs = st.load_file(str(tmp_path / "ours.safetensors"))
  for k, a in samples.items(): assert theirs[k].dtype == a.dtype and theirs[k].shape == a.shape and theirs[k].tobytes() == a.tobytes(), k
  st.save_file(theirs, str(tmp_path / "theirs.safetensors"))
  back = safe_load(tmp_path / "theirs.safetensors")
  for k, a in samples.items(): assert back[k].numpy().tobytes() == a.tobytes() and back[k].shape == a.shape, k


def test_interop_with_the_safetensors_package_torch(tmp_path):
  pytest.importorskip("torch")
  st = pytest.importorskip("safetensors.torch")
  tensors = {k: to_tensor(k, a) for k, a in SAMPLES.items() if k not in ("u16", "u32", "u64")}  # unsigned wider than 8 bits: torch's support varies
  safe_save(tensors, tmp_path / "ours.safetensors")
  theirs = st.load_file(str(tmp_path / "ours.safetensors"))
  for k, t in tensors.items():
    assert tuple(theirs[k].shape) == t.shape and theirs[k].contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes() == bits(t), k
  st.save_file(theirs, str(tmp_path / "theirs.safetensors"))
  back = safe_load(tmp_path / "theirs.safetensors")
  for k, t in tensors.items(): assert back[k].dtype is t.dtype and bits(back[k]) == bits(t), k


# ---------------------------------------------------------------- npz

def test_npz_load(tmp_path):
  a, b = RNG.standard_normal((2, 3)).astype(np.float32), np.arange(4, dtype=np.int64)
  np.savez(tmp_path / "plain.npz", a=a, b=b)
  np.savez_compressed(tmp_path / "packed.npz", a=a)
  got = npz_load(tmp_path / "plain.npz")
  np.testing.assert_array_equal(got["a"].numpy(), a)
  assert got["b"].dtype is dtypes.int64 and got["b"].tolist() == [0, 1, 2, 3]
  np.testing.assert_array_equal(npz_load(tmp_path / "packed.npz")["a"].numpy(), a)


def test_bad_npz_files_raise_a_clear_error(tmp_path):
  np.savez(tmp_path / "ok.npz", a=np.zeros(1000))
  (tmp_path / "cut.npz").write_bytes((tmp_path / "ok.npz").read_bytes()[:500])
  np.save(tmp_path / "single.npy", np.zeros(3))
  np.savez(tmp_path / "complex.npz", c=np.zeros(2, np.complex64))
  np.savez(tmp_path / "objects.npz", o=np.array([{}], dtype=object))
  for name, pattern in [("cut.npz", "corrupt or truncated"), ("single.npy", "not an .npz archive"), ("complex.npz", "array 'c' has dtype complex64"),
                        ("objects.npz", "holds pickled Python objects")]:
    with pytest.raises(StateFileError, match=f"{name}: {pattern}"): npz_load(tmp_path / name)
