"""The plugin API that backends import: `hookimpl`, `DeviceSpec`, `API_VERSION` (see docs/writing-a-backend.md).

Importing this package loads no plugin; the manager (`plugrad.plugin.manager`) reads the entry points on first device use.
"""
from plugrad.plugin.hookspecs import API_VERSION, COMPONENT_HOOKS, PROJECT_NAME, DeviceSpec, device_name, hookimpl, hookspec, parse_device

__all__ = ["API_VERSION", "COMPONENT_HOOKS", "PROJECT_NAME", "DeviceSpec", "device_name", "hookimpl", "hookspec", "parse_device"]
