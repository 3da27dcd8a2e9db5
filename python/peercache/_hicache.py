"""SGLang's HiCacheStorage interface: the real one when SGLang is importable,
otherwise a faithful local stand-in of the contract (same names, signatures
and semantics), so the shim can be used and tested without SGLang.

Every name is looked up where each SGLang release keeps it (docs/sglang.md,
"Compatibility"):
  - HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo:
    sglang.srt.mem_cache.hicache_storage (every release);
  - the v2 pool types (PoolName, PoolHitPolicy, PoolTransfer,
    PoolTransferResult): sglang.srt.mem_cache.pool_transfer (proposed move),
    else hicache_storage (hybrid releases), else the stand-ins below (older
    releases, which never call the v2 methods);
  - StorageMetrics: sglang.srt.observability.metrics_collector (newer),
    else sglang.srt.metrics.collector (older). SGLang asserts
    isinstance(stats, StorageMetrics) against its own class, so the shim
    must return that one whenever SGLang has it.
"""
import abc
import dataclasses
import importlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional


def _first(modules, name):
    """The attribute name of the first importable module that has it."""
    for mod in modules:
        try:
            value = getattr(importlib.import_module(mod), name)
        except Exception:  # ImportError, or a broken SGLang install
            continue
        return value, mod
    return None, None


_HS = "sglang.srt.mem_cache.hicache_storage"
HiCacheStorage, _base_from = _first([_HS], "HiCacheStorage")
SGLANG = HiCacheStorage is not None
if SGLANG:  # pragma: no cover - depends on the environment
    HiCacheStorageConfig, _ = _first([_HS], "HiCacheStorageConfig")
    HiCacheStorageExtraInfo, _ = _first([_HS], "HiCacheStorageExtraInfo")
else:
    @dataclass
    class HiCacheStorageConfig:  # type: ignore[no-redef]
        tp_rank: int = 0
        tp_size: int = 1
        pp_rank: int = 0
        pp_size: int = 1
        attn_cp_rank: int = 0
        attn_cp_size: int = 1
        is_mla_model: bool = False
        enable_storage_metrics: bool = False
        is_page_first_layout: bool = True
        model_name: Optional[str] = None
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:  # type: ignore[no-redef]
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(abc.ABC):  # type: ignore[no-redef]
        """The abstract base of an SGLang L3 storage backend (newest shape:
        the v1 and v2 methods raise until a backend implements them)."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name):
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
            raise NotImplementedError()

        def batch_get_v2(self, transfers, extra_info=None):
            raise NotImplementedError()

        def batch_set_v2(self, transfers, extra_info=None):
            raise NotImplementedError()

        def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
            raise NotImplementedError()

        @abc.abstractmethod
        def get(self, key, target_location=None, target_sizes=None) -> Any:
            ...

        @abc.abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None):
            ...

        @abc.abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
            ...

        @abc.abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
            ...

        @abc.abstractmethod
        def exists(self, key) -> bool:
            ...

        def batch_exists(self, keys, extra_info=None) -> int:
            for i, key in enumerate(keys):
                if not self.exists(key):
                    return i
            return len(keys)

        def clear(self):
            pass

        def get_stats(self):
            return None


# ------------------------------------------------------------ v2 pool types

_V2_MODULES = ["sglang.srt.mem_cache.pool_transfer", _HS]
PoolName, _ = _first(_V2_MODULES, "PoolName")
PoolHitPolicy, _ = _first(_V2_MODULES, "PoolHitPolicy")
PoolTransfer, _ = _first(_V2_MODULES, "PoolTransfer")
PoolTransferResult, _ = _first(_V2_MODULES, "PoolTransferResult")

if PoolName is None:
    class PoolName(str, Enum):  # type: ignore[no-redef]
        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DEEPSEEK_V4_C4 = "deepseek_v4_c4"
        DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
        DEEPSEEK_V4_C4_INDEXER_SCALE = "deepseek_v4_c4_indexer_scale"
        DEEPSEEK_V4_C128 = "deepseek_v4_c128"
        DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
        DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
        DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self):
            return self.value

if PoolHitPolicy is None:
    class PoolHitPolicy(str, Enum):  # type: ignore[no-redef]
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

if PoolTransfer is None:
    @dataclass
    class PoolTransfer:  # type: ignore[no-redef]
        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[List[str]] = None
        hit_policy: Any = "all_pages"
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Any = None

if PoolTransferResult is None:
    @dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        kv_hit_pages: int
        extra_pool_hit_pages: dict
        restorable_prefix_pages: Optional[List[int]] = None


def _has_field(cls, name):
    try:
        return any(f.name == name for f in dataclasses.fields(cls))
    except TypeError:  # not a dataclass: trust the constructor to say
        return True


def make_transfer_result(kv_hit_pages, extra_pool_hit_pages, restorable):
    """A PoolTransferResult of this SGLang: with restorable_prefix_pages
    where the class has that field, without it on releases before it."""
    if _has_field(PoolTransferResult, "restorable_prefix_pages"):
        return PoolTransferResult(kv_hit_pages, extra_pool_hit_pages, restorable)
    return PoolTransferResult(kv_hit_pages, extra_pool_hit_pages)


# ------------------------------------------------------------------ metrics

METRICS_MODULES = ["sglang.srt.observability.metrics_collector",
                   "sglang.srt.metrics.collector"]
StorageMetrics, METRICS_FROM = _first(METRICS_MODULES, "StorageMetrics")
if StorageMetrics is None:
    @dataclass
    class StorageMetrics:  # type: ignore[no-redef]
        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)
