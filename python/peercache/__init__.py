"""PeerCache client package.

`peercache.store.PeerCacheStore` is the SGLang HiCacheStorage backend; load it
with --hicache-storage-backend dynamic (see the project README, "Use with
SGLang"). `peercache.client.Client` is a thin Python wrapper of the C client
library (libpeercache) for other uses.
"""
__version__ = "0.1.0"
