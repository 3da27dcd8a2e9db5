"""Fake SGLang host KV pools that mirror the contract exactly
(sglang-contract.md §2): MHA layer_first / page_first / page_first_direct,
MLA page_first / layer_first, the asymmetric MHA pool (K and V head dims
differ: two allocations); kv_buffer shapes, get_page_buffer_meta
pointer order and sizes, and the "shm" allocator (a memfd kept on
allocator.fd / allocator.fds, the buffer a view of its MAP_SHARED mapping)."""
import ctypes
import mmap
import os

import torch


class ShmAllocator:
    """Like SGLang's ShmHostTensorAllocator: a memfd, mapped MAP_SHARED."""

    def __init__(self, nbytes):
        self.fd = os.memfd_create("sglang_host_pool_test", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, nbytes)
        self.fds = [self.fd]
        self.mm = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)

    def tensor(self, shape, dtype):
        return torch.frombuffer(self.mm, dtype=dtype).view(shape)


class DefaultAllocator:
    """The non-shared default: no descriptor."""

    def tensor(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype)


def _alloc(shape, dtype, shm):
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.tensor([], dtype=dtype).element_size()
    allocator = ShmAllocator(nbytes) if shm else DefaultAllocator()
    return allocator, allocator.tensor(shape, dtype)


class _Pool:
    """What both pool kinds share: reading and filling one page."""

    def _page_view(self, buf, page):
        """Page `page` of a per-kind buffer (K, V, or MLA's kv_buffer)."""
        span = slice(page * self.page_size, (page + 1) * self.page_size)
        if self.layout == "layer_first":
            return buf[:, span]
        if self.layout == "page_first":
            return buf[span]
        return buf[page]

    def _buffers(self):
        raise NotImplementedError

    def page_bytes(self, page):
        """The bytes of one page, in the order get_page_buffer_meta gives."""
        idx = torch.arange(page * self.page_size, (page + 1) * self.page_size)
        ptrs, sizes = self.get_page_buffer_meta(idx)
        return b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs, sizes))

    def fill_page(self, page, seed):
        g = torch.Generator().manual_seed(seed)
        for buf in self._buffers():
            view = self._page_view(buf, page)
            view.copy_(torch.randn(view.shape, generator=g).to(self.dtype))


class MHAPool(_Pool):
    """MHATokenToKVPoolHost: kv_buffer (2, ...) with K = [0], V = [1]."""

    def __init__(self, layout="page_first", page_size=16, pages=64, layer_num=4,
                 head_num=2, head_dim=64, dtype=torch.float16, shm=True):
        self.layout, self.page_size, self.dtype = layout, page_size, dtype
        self.page_num, self.size = pages, pages * page_size
        self.layer_num, self.head_num, self.head_dim = layer_num, head_num, head_dim
        shapes = {
            "layer_first": (2, layer_num, self.size, head_num, head_dim),
            "page_first": (2, self.size, layer_num, head_num, head_dim),
            "page_first_direct": (2, pages, layer_num, page_size, head_num, head_dim),
        }
        self.allocator, self.kv_buffer = _alloc(shapes[layout], dtype, shm)
        self.k_buffer, self.v_buffer = self.kv_buffer[0], self.kv_buffer[1]
        self.itemsize = self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        per_token = self.head_num * self.head_dim * self.itemsize
        for idx in [int(i) for i in indices[::self.page_size]]:
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    for buf in (self.k_buffer, self.v_buffer):
                        ptrs.append(buf[layer, idx].data_ptr())
                        sizes.append(self.page_size * per_token)
                continue
            if self.layout == "page_first":
                k, v = self.k_buffer[idx], self.v_buffer[idx]
            else:
                page = idx // self.page_size
                k, v = self.k_buffer[page], self.v_buffer[page]
            for t in (k, v):
                ptrs.append(t.data_ptr())
                sizes.append(self.layer_num * self.page_size * per_token)
        return ptrs, sizes

    def _buffers(self):
        return (self.k_buffer, self.v_buffer)


class MLAPool(_Pool):
    """MLATokenToKVPoolHost: one buffer, no V."""

    def __init__(self, layout="page_first", page_size=16, pages=64, layer_num=4,
                 kv_cache_dim=576, dtype=torch.float16, shm=True):
        self.layout, self.page_size, self.dtype = layout, page_size, dtype
        self.page_num, self.size = pages, pages * page_size
        self.layer_num, self.kv_cache_dim = layer_num, kv_cache_dim
        shapes = {
            "layer_first": (layer_num, self.size, 1, kv_cache_dim),
            "page_first": (self.size, layer_num, 1, kv_cache_dim),
            "page_first_direct": (pages, layer_num, page_size, 1, kv_cache_dim),
        }
        self.allocator, self.kv_buffer = _alloc(shapes[layout], dtype, shm)
        self.itemsize = self.kv_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        per_token = self.kv_cache_dim * self.itemsize
        for idx in [int(i) for i in indices[::self.page_size]]:
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    ptrs.append(self.kv_buffer[layer, idx].data_ptr())
                    sizes.append(self.page_size * per_token)
                continue
            t = self.kv_buffer[idx] if self.layout == "page_first" else \
                self.kv_buffer[idx // self.page_size]
            ptrs.append(t.data_ptr())
            sizes.append(self.layer_num * self.page_size * per_token)
        return ptrs, sizes

    def _buffers(self):
        return (self.kv_buffer,)


def indices(pages, page_size):
    """host_indices for pages [0, pages): token slots, page_size per page."""
    return torch.arange(0, pages * page_size, dtype=torch.int64)


class AsymmetricMHAPool:
    """AsymmetricMHATokenToKVPoolHost (models whose K and V head dims
    differ): K and V in two allocations (two memfds with the shm allocator,
    on allocator.fds in allocation order), kv_buffer the pair (K, V), and
    get_page_buffer_meta K then V per page, of different sizes. alloc(shape,
    dtype) -> (tensor, fd or None) may replace the allocation (the SGLang
    check script passes SGLang's alloc_shm)."""

    def __init__(self, layout="page_first", page_size=16, pages=8, layer_num=2,
                 head_num=2, head_dim=64, v_head_dim=32, dtype=torch.float16,
                 shm=True, alloc=None):
        self.layout, self.page_size, self.dtype = layout, page_size, dtype
        self.layer_num, self.head_num = layer_num, head_num
        self.head_dim, self.v_head_dim = head_dim, v_head_dim
        self.allocator = ShmAllocatorSet()
        bufs = []
        for dim in (head_dim, v_head_dim):
            shape = ((pages * page_size, layer_num, head_num, dim) if layout == "page_first"
                     else (pages, layer_num, page_size, head_num, dim))
            if alloc is not None:
                tensor, fd = alloc(shape, dtype)
            elif shm:
                a = ShmAllocator(_numel(shape) * torch.tensor([], dtype=dtype).element_size())
                tensor, fd = a.tensor(shape, dtype), a.fd
                self.allocator.keep.append(a)
            else:
                tensor, fd = torch.zeros(shape, dtype=dtype), None
            if fd is not None:
                self.allocator.fds.append(fd)
            bufs.append(tensor)
        self.k_buffer, self.v_buffer = bufs
        self.kv_buffer = (self.k_buffer, self.v_buffer)
        self.itemsize = self.k_buffer.element_size()

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        for idx in [int(i) for i in indices[::self.page_size]]:
            row = idx // self.page_size if self.layout == "page_first_direct" else idx
            for buf, dim in ((self.k_buffer, self.head_dim), (self.v_buffer, self.v_head_dim)):
                ptrs.append(buf[row].data_ptr())
                sizes.append(self.layer_num * self.page_size * self.head_num * dim
                             * self.itemsize)
        return ptrs, sizes

    def page_bytes(self, page):
        return _Pool.page_bytes(self, page)

    def fill_page(self, page, seed):
        g = torch.Generator().manual_seed(seed)
        for buf in (self.k_buffer, self.v_buffer):
            span = slice(page * self.page_size, (page + 1) * self.page_size)
            view = buf[span] if self.layout == "page_first" else buf[page]
            view.copy_(torch.randn(view.shape, generator=g).to(self.dtype))


class ShmAllocatorSet:
    """ShmHostTensorAllocator after several allocate() calls: fds in order."""

    def __init__(self):
        self.fds, self.keep = [], []


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n
