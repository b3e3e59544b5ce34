import pytest

from plugrad import Tensor


@pytest.fixture
def training(monkeypatch):
  """Tensor.training set for one test (restored afterwards): `training(True)`."""
  def set_mode(mode: bool) -> None: monkeypatch.setattr(Tensor, "training", mode, raising=False)
  set_mode(False)
  return set_mode
