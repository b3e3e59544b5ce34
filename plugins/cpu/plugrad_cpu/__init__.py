"""plugrad-cpu: the CPU device of plugrad (C through the system compiler, run on host threads).

Kept free of imports: the plugin entry point (`plugrad_cpu.plugin`) is loaded on first device use and must stay cheap.
"""
__version__ = "0.1.0"
