"""The peercache Python package: the SGLang HiCacheStorage shim.

Pure Python (it drives libpeercache through ctypes), so `pip install ./python`
works offline with Debian's pip:

    /usr/bin/python3 -m pip install --break-system-packages ./python
    # or, without touching the system: --target DIR
"""
from setuptools import setup

setup(
    name="peercache",
    version="0.1.0",
    description="PeerCache: the L3 KV-cache store for SGLang HiCache (client shim)",
    packages=["peercache"],
    python_requires=">=3.9",
)
