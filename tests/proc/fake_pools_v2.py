"""Fake SGLang sidecar host pools for the v2 interface (sglang-contract.md
§2 and §6), written from the behaviour read in SGLang's pool_host/ sources:

- MambaPool: page_size 1; a temporal buffer (dropped from the pointers when
  it has 0 elements) and one buffer per conv state, each its own allocation
  (kv_buffer is the list of the non-empty ones); page_first(_direct) layouts
  give per-page pointers (temporal, conv_0..n); layer_first has none
  (get_page_buffer_meta raises), only flat pages, which are uint8-packed;
- MultiBufferPool: several page_first buffers of different dtypes, one
  pointer each per page (DSA indexer: one uint8 buffer; DeepSeek-V4
  compressed pools: payload + scale);
- LogicalAnchor: the DeepSeek-V4 KV anchor, kv_buffer None;
- FlatMHAPool / FlatMLAPool: the KV pools of fake_pools.py plus their flat
  pages (get_data_page / set_from_flat_data_page), the generic path's view.
Every pool gives page_bytes(page) (its bytes in flat order) and
fill_page(page, seed) for byte comparisons, by page number like fake_pools."""
import ctypes

import torch

from fake_pools import MHAPool, MLAPool, ShmAllocator


def _zeros(shape, dtype, shm):
    n = 1
    for d in shape:
        n *= d
    if shm and n:
        return ShmAllocator(n * torch.tensor([], dtype=dtype).element_size()).tensor(shape, dtype)
    return torch.zeros(shape, dtype=dtype)


def _randomize(view, seed):
    g = torch.Generator().manual_seed(seed)
    if view.dtype == torch.uint8:
        view.copy_(torch.randint(0, 256, view.shape, generator=g, dtype=torch.uint8))
    else:
        view.copy_(torch.randn(view.shape, generator=g).to(view.dtype))


class _Sidecar:
    def page_bytes(self, page):
        """Page `page`'s bytes, flat order (temporal then conv for Mamba)."""
        return bytes(self.get_data_page(page * self.page_size, flat=True).numpy().tobytes())

    def fill_page(self, page, seed):
        for i, t in enumerate(self._page_tensors(page * self.page_size)):
            _randomize(t, seed * 31 + i)


class MambaPool(_Sidecar):
    def __init__(self, layout="page_first", size=40, layers=3, temporal=(2, 8),
                 conv=((4, 6), (3, 5)), temporal_dtype=torch.float32,
                 conv_dtype=torch.bfloat16, shm=False):
        self.layout, self.page_size, self.size = layout, 1, size
        self.layers, self.temporal_shape, self.conv_shapes = layers, tuple(temporal), list(conv)
        self.temporal_dtype, self.conv_dtype, self.dtype = temporal_dtype, conv_dtype, conv_dtype
        self.temporal_elems = 1
        for d in self.temporal_shape:
            self.temporal_elems *= d
        if layout in ("page_first", "page_first_direct"):
            self.temporal_buffer = _zeros((size, layers, 1) + self.temporal_shape,
                                          temporal_dtype, shm)
            self.conv_buffer = [_zeros((size, layers, 1) + tuple(c), conv_dtype, shm)
                                for c in self.conv_shapes]
        else:
            self.temporal_buffer = _zeros((layers, size) + self.temporal_shape,
                                          temporal_dtype, shm)
            self.conv_buffer = [_zeros((layers, size) + tuple(c), conv_dtype, shm)
                                for c in self.conv_shapes]
        self.kv_buffer = [b for b in [self.temporal_buffer] + self.conv_buffer if b.numel()]

    def _page_tensors(self, index):
        bufs = [self.temporal_buffer] + self.conv_buffer
        if self.layout in ("page_first", "page_first_direct"):
            return [b[index] for b in bufs]
        return [b[:, index:index + 1] for b in bufs]

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        if self.layout not in ("page_first", "page_first_direct"):
            raise ValueError("Mamba zero-copy needs a page_first layout, got %s" % self.layout)
        ptrs, sizes = [], []
        for i in [int(x) for x in indices]:
            for b in [self.temporal_buffer] + self.conv_buffer:
                if b is self.temporal_buffer and self.temporal_elems == 0:
                    continue
                t = b[i]
                ptrs.append(t.data_ptr())
                sizes.append(t.numel() * t.element_size())
        return ptrs, sizes

    def get_data_page(self, index, flat=True):
        return torch.cat([t.contiguous().view(torch.uint8).reshape(-1)
                          for t in self._page_tensors(index)])

    def get_dummy_flat_data_page(self):
        n = sum(t.numel() * t.element_size() for t in self._page_tensors(0))
        return torch.zeros(n, dtype=torch.uint8)

    def set_from_flat_data_page(self, index, data_page):
        flat = data_page.contiguous().view(torch.uint8).reshape(-1)
        at = 0
        for t in self._page_tensors(index):
            n = t.numel() * t.element_size()
            t.copy_(flat[at:at + n].view(t.dtype).reshape(t.shape))
            at += n


class MultiBufferPool(_Sidecar):
    """page_first buffers (size, dim) of their own dtypes; one pointer per
    buffer per page, page_size slots each."""

    def __init__(self, page_size=16, pages=40, buffers=((132, torch.uint8),),
                 layout="page_first", shm=False):
        self.layout, self.page_size = layout, page_size
        self.size = pages * page_size
        self.buffers = [_zeros((self.size, dim), dtype, shm) for dim, dtype in buffers]
        self.dtype = self.buffers[0].dtype
        self.kv_buffer = self.buffers if len(self.buffers) > 1 else self.buffers[0]

    def _page_tensors(self, index):
        return [b[index:index + self.page_size] for b in self.buffers]

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        for i in [int(x) for x in indices[::self.page_size]]:
            for t in self._page_tensors(i):
                ptrs.append(t.data_ptr())
                sizes.append(t.numel() * t.element_size())
        return ptrs, sizes

    def get_data_page(self, index, flat=True):
        return torch.cat([t.contiguous().view(torch.uint8).reshape(-1)
                          for t in self._page_tensors(index)])


class LogicalAnchor:
    """DeepSeek-V4's LogicalHostPool: pages and slots, no KV bytes."""

    def __init__(self, page_size=16, layout="page_first"):
        self.page_size, self.layout, self.dtype = page_size, layout, torch.bfloat16
        self.kv_buffer = None
        self.allocator = None


class _Flat:
    def _flat_view(self, index):
        ps = self.page_size
        if self.layout == "layer_first":  # MLA (layer, size, 1, dim)
            return self.kv_buffer[:, index:index + ps]
        if self.layout == "page_first":
            return self.kv_buffer[:, index:index + ps] if self._mha \
                else self.kv_buffer[index:index + ps]
        page = index // ps
        return self.kv_buffer[:, page] if self._mha else self.kv_buffer[page]

    def get_data_page(self, index, flat=True):
        return self._flat_view(index).contiguous().reshape(-1).clone()

    def get_dummy_flat_data_page(self):
        return torch.zeros_like(self.get_data_page(0))

    def set_from_flat_data_page(self, index, data_page):
        view = self._flat_view(index)
        view.copy_(data_page.reshape(view.shape))

    def flat_bytes(self, page):
        t = self.get_data_page(page * self.page_size)
        return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


class FlatMHAPool(_Flat, MHAPool):
    _mha = True

    def _flat_view(self, index):
        ps = self.page_size
        if self.layout == "layer_first":  # (2, layer, size, head, dim)
            return self.kv_buffer[:, :, index:index + ps]
        return super()._flat_view(index)


class FlatMLAPool(_Flat, MLAPool):
    _mha = False
