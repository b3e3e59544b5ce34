"""The Metal Shading Language version the renderer writes and the compiler takes: `METAL_LANGUAGE`, else the running
macOS's, else OFFLINE_LANGUAGE (read by the registration, the renderer's hook and the runtime alike)."""
from __future__ import annotations

import platform
import sys

from plugrad.backend import getenv

LANGUAGES = ("3.0", "3.1", "3.2")
OFFLINE_LANGUAGE = "3.1"  # off macOS, without METAL_LANGUAGE: the version of macOS 14, the oldest with `bfloat`


def macos_language(version: str) -> str:
  """The newest MSL version a macOS release compiles (`platform.mac_ver()[0]`, e.g. "14.5"): 13 → 3.0, 14 → 3.1, 15+ → 3.2."""
  try: major = int(version.split(".")[0])
  except ValueError: return "3.0"
  return "3.2" if major >= 15 else "3.1" if major == 14 else "3.0"


def language() -> str:
  """METAL_LANGUAGE, else the running macOS's version, else OFFLINE_LANGUAGE (a bad value is a SettingsError)."""
  default = macos_language(platform.mac_ver()[0]) if sys.platform == "darwin" else OFFLINE_LANGUAGE
  return str(getenv("METAL_LANGUAGE", default, choices=LANGUAGES))
