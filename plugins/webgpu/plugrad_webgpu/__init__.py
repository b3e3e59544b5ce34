"""plugrad-webgpu: the WEBGPU device of plugrad (WGSL compute shaders through wgpu-native).

Kept free of imports: the plugin entry point (`plugrad_webgpu.plugin`) is loaded on first device use and must stay cheap.
"""
__version__ = "0.1.0"
