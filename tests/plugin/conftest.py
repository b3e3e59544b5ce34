"""Fixtures of the plugin-system tests."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from plugrad.device.registry import Device
from plugrad.plugin.manager import PluginManager, get_manager


@pytest.fixture
def use_manager() -> Iterator[Callable[[PluginManager], None]]:
  """Make the process-wide `Device` use a given manager for one test, then restore the previous one (no leaks)."""
  before = get_manager()
  yield Device.reset
  Device.reset(before)
