"""The typed errors of the device and plugin layers. They sit at the floor, so the device, plugin and backend modules
all raise them without importing each other. Each message names the device, the plugin's distribution where one is
involved, and what to do."""
from __future__ import annotations


class DeviceError(RuntimeError):
  """Base of every device/plugin error."""


class UnknownDeviceError(DeviceError, KeyError):
  """No installed plugin provides this device name (the message says which package would)."""
  def __str__(self) -> str: return str(self.args[0]) if self.args else ""


class InvalidDeviceStringError(DeviceError, ValueError):
  """A device string that is not `NAME` or `NAME:index`."""


class DeviceUnavailableError(DeviceError):
  """The device is known but cannot be used here (its probe said why, or its plugin failed to load)."""


class DeviceIndexError(DeviceUnavailableError):
  """A device index beyond the device count its plugin reports (`DEV=CPU:7` on a machine with one CPU device)."""


class DeviceFallbackError(DeviceUnavailableError):
  """PLUGRAD_STRICT_PLUGINS=1 and the default device would fall back past a failed, conflicting or misconfigured
  device (without it, that is a `DeviceFallbackWarning`)."""


class PluginLoadError(DeviceError):
  """A plugin's entry point failed to import or its registration hook raised."""


class PluginAPIVersionError(PluginLoadError):
  """A plugin was built against an incompatible plugin API version."""


class PluginTimeoutError(PluginLoadError):
  """A plugin's import, `plugrad_devices()` or a device probe did not answer within PLUGRAD_PROBE_TIMEOUT seconds."""


class PluginConflictError(DeviceError):
  """Two distributions claim the same device name."""


class PluginHookError(DeviceError, TypeError):
  """A plugin hook returned the wrong type or raised."""


class OutOfMemoryError(DeviceError, MemoryError):
  """An allocation failed even after freeing the allocator's cache."""


class CompileError(DeviceError):
  """A kernel failed to compile; carries the compiler's message and the kernel name."""


class LaunchError(DeviceError):
  """A runtime raised while launching a kernel."""


class UnsupportedDTypeError(DeviceError, TypeError):
  """A dtype the device cannot hold or compute in (its renderer's `dtype_support` said why)."""


class ShardingError(DeviceError, ValueError):
  """A multi-device (sharded or replicated) tensor used in a way plugrad cannot place: the base of the errors below, and
  what an operation that has no multi-device form raises (a precompiled kernel given a sharded tensor). docs/sharding.md."""


class DeviceMismatchError(ShardingError):
  """Operands on different devices or device tuples (`x.shard(("CPU:0", "CPU:1")) + y.to("CPU")`): the message names both."""


class ShardAxisError(ShardingError, IndexError):
  """`shard(devices, axis)` with an axis out of range for the tensor's shape, or with a symbolic size along it."""

