"""SGLang's HiCacheStorage interface: the real one when SGLang is importable,
otherwise a faithful local stand-in of the contract (same names, signatures
and semantics), so the shim can be used and tested without SGLang."""
import abc
from dataclasses import dataclass, field
from typing import Any, List, Optional

try:  # pragma: no cover - depends on the environment
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )

    SGLANG = True
except Exception:  # ImportError, or a broken SGLang install
    SGLANG = False

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
        """The abstract base of an SGLang L3 storage backend."""

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name):
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

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

try:  # pragma: no cover
    from sglang.srt.observability.metrics_collector import StorageMetrics  # type: ignore
except Exception:
    @dataclass
    class StorageMetrics:  # type: ignore[no-redef]
        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)
