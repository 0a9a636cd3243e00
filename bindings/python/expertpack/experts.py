"""The expert store alone (``include/expertpack/experts.h``): routed expert weights made resident on
request for an engine that runs its own kernels, here PyTorch or NumPy code.

    with expertpack.Experts("model.epk", device=expertpack.Device.CUDA,
                            cache_budget_bytes=8 << 30) as store:
        lay = store.layout(layer)                       # per role: ggml type, shape, offset
        with store.acquire(layer, ids) as lease:        # on torch's current stream
            gate = lease.tensor(0, expertpack.Role.GATE)    # torch tensor over the slot, no copy
            ...                                          # dequantize / matmul on the same stream
        # leaving the block released the experts on that stream

Device memory (``Device.CUDA``): the addresses are device addresses, ready in the order of the
stream the lease was acquired on; :meth:`Lease.tensor` hands them to PyTorch through DLPack
without a copy. Host memory (``Device.CPU``): :meth:`Lease.view` gives a ``memoryview`` of a role's
bytes and :meth:`Lease.array` a NumPy array over them (no copy either).

A view, array or tensor of a lease is valid until the lease is released: the store may put
another expert's bytes in that memory afterwards. Copy what must outlive it.
"""
from __future__ import annotations

import ctypes
import enum
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, byref, c_char_p, c_int32, c_int64, c_size_t, c_uint8, c_uint16,
                    c_uint32, c_uint64, c_void_p)
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from . import (_PROGRESS_FN, _progress_callback, Device, Status, StoreStats, UnsupportedError, _check, _defaults, _fn, _Handle,
               _out_struct, _path, _store_stats_struct, _StoreStats)

__all__ = ["Experts", "Lease", "Role", "ExpertsInfo", "RoleLayout", "LayerLayout", "HAVE_EXPERTS", "GGML_TYPE_NAMES"]


class Role(enum.IntEnum):
    """The matrices of an expert, in the order they lie in its object (``ep_expert_role``)."""
    GATE = 0
    UP = 1
    DOWN = 2


# ggml type ids of the types a plain dtype can view (the rest are quantized blocks: raw bytes).
GGML_TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_k", 11: "q3_k",
                   12: "q4_k", 13: "q5_k", 14: "q6_k", 15: "q8_k", 16: "iq2_xxs", 30: "bf16", 39: "mxfp4"}


class _ExpertsOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("device", c_int32), ("device_index", c_int32),
                ("cache_budget_bytes", c_uint64), ("staging_slots", c_uint32), ("queue_depth", c_uint32),
                ("read_splits", c_uint32), ("direct_io", c_int32), ("pack_dir", c_char_p), ("pack_build", c_int32),
                ("no_pack", c_int32), ("progress", _PROGRESS_FN), ("progress_payload", c_void_p),
                ("host_cache_bytes", c_uint64), ("prefetch", c_int32), ("cache_policy", c_char_p),
                ("tokens_per_acquire", c_uint32), ("stats_path", c_char_p), ("stats_every", c_uint32),
                ("top_k", c_uint32)]


class _ExpertsProperties(Structure):
    _fields_ = [("struct_size", c_size_t), ("num_layers", c_uint32), ("first_layer", c_uint32),
                ("num_experts", c_uint32), ("num_roles", c_uint32), ("top_k", c_uint32),
                ("max_experts_per_acquire", c_uint32), ("max_table_ids", c_uint32), ("tokens_per_acquire", c_uint32),
                ("slot_bytes", c_uint64), ("cache_slots", c_uint64), ("host_slots", c_uint64), ("device", c_int32),
                ("device_index", c_int32), ("slots_address", c_uint64)]


class _RoleLayout(Structure):
    _fields_ = [("ggml_type", c_uint32), ("n_dims", c_uint32), ("ne", c_uint64 * 2), ("offset", c_uint64),
                ("row_bytes", c_uint64), ("bytes", c_uint64)]


class _LayerLayout(Structure):
    _fields_ = [("struct_size", c_size_t), ("layer", c_uint32), ("model_layer", c_uint32), ("num_experts", c_uint32),
                ("num_roles", c_uint32), ("object_bytes", c_uint64), ("roles", _RoleLayout * 3)]


class _LeaseProperties(Structure):
    _fields_ = [("struct_size", c_size_t), ("layer", c_uint32), ("n_ids", c_uint32), ("ids", POINTER(c_int32)),
                ("objects", POINTER(c_void_p)), ("roles", POINTER(c_void_p)), ("device_table", c_void_p),
                ("hits", c_uint32), ("misses", c_uint32), ("host_hits", c_uint32), ("reserved", c_uint32),
                ("slots", POINTER(c_uint32))]


_ep_experts_options_init = _fn("ep_experts_options_init", None, c_void_p, optional=True)
_ep_experts_open = _fn("ep_experts_open", c_int32, POINTER(c_void_p), c_char_p, POINTER(_ExpertsOptions), optional=True)
_ep_experts_close = _fn("ep_experts_close", None, c_void_p, optional=True)
_ep_experts_pack_path = _fn("ep_experts_pack_path", c_char_p, c_void_p, optional=True)
_ep_experts_info = _fn("ep_experts_info", c_int32, POINTER(_ExpertsProperties), c_void_p, optional=True)
_ep_experts_layout = _fn("ep_experts_layout", c_int32, POINTER(_LayerLayout), c_void_p, c_uint32, optional=True)
_ep_experts_acquire = _fn("ep_experts_acquire", c_int32, POINTER(c_void_p), c_void_p, c_uint32, POINTER(c_int32),
                          c_size_t, c_void_p, optional=True)
_ep_experts_lease_info = _fn("ep_experts_lease_info", c_int32, POINTER(_LeaseProperties), c_void_p, optional=True)
_ep_experts_release = _fn("ep_experts_release", c_int32, c_void_p, c_void_p, optional=True)
_ep_experts_hint = _fn("ep_experts_hint", c_int32, c_void_p, c_uint32, POINTER(c_int32), c_size_t, optional=True)
_ep_experts_stats = _fn("ep_experts_stats", c_int32, POINTER(_StoreStats), c_void_p, optional=True)
HAVE_EXPERTS = _ep_experts_release is not None
"""True when the loaded library has the expert-store API (experts.h, 0.3)."""


@dataclass
class ExpertsInfo:
    """What a store holds and how it was sized (``ep_experts_properties``)."""
    num_layers: int
    first_layer: int
    num_experts: int
    num_roles: int
    top_k: int
    max_experts_per_acquire: int
    max_table_ids: int
    tokens_per_acquire: int
    slot_bytes: int
    cache_slots: int
    host_slots: int
    device: str  # "cpu" (host memory) or "cuda"
    device_index: int
    slots_address: int  # slot s of the cache lies at slots_address + s * slot_bytes


@dataclass
class RoleLayout:
    """One role of a layer's expert objects: ggml type, shape in ggml order ``ne = [row elements, rows]``,
    byte offset inside the object, bytes of one row and of the role."""
    ggml_type: int
    ne: List[int]
    offset: int
    row_bytes: int
    bytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.ggml_type, f"ggml type {self.ggml_type}")


@dataclass
class LayerLayout:
    layer: int
    model_layer: int
    num_experts: int
    object_bytes: int
    roles: List[RoleLayout]  # indexed by Role


def _ids(values) -> "ctypes.Array":
    if hasattr(values, "tolist"):  # numpy arrays, torch tensors (a CUDA tensor is copied to the host here)
        values = values.tolist()
    values = [int(v) for v in values]
    return (c_int32 * len(values))(*values)


def _stream_handle(stream, on_cuda: bool):
    """The cudaStream_t to pass: an int, an object with ``cuda_stream`` (torch.cuda.Stream), or None
    (on CUDA: torch's current stream when torch is imported, else the legacy default stream)."""
    if not on_cuda:
        if stream is not None:
            raise ValueError("the experts live in host memory: no stream (pass None)")
        return None
    if stream is None:
        import sys
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_stream().cuda_stream or None
        return None
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream) or None
    return int(stream) or None


class Experts(_Handle):
    """An open expert store (``ep_experts_open``) on an Expert Pack, a source index, or a source (a GGUF, a
    safetensors checkpoint), whose pack or index is found or built in ``pack_dir`` as :class:`Model` does.

    Keyword options are the fields of ``ep_experts_options``: device (``Device.CUDA``: device memory of
    device_index; ``Device.CPU``: host memory; ``Device.AUTO``: CUDA when there is one), device_index,
    cache_budget_bytes (0: every expert, within limits), staging_slots, queue_depth, read_splits, direct_io,
    pack_dir, pack_build, no_pack (read the experts from the source files through a source index),
    progress (``callable(done_bytes, total_bytes)`` while a pack or index is built), host_cache_bytes (a
    host-RAM tier below the cache), prefetch (accept :meth:`hint`), cache_policy, tokens_per_acquire (an
    acquire may ask for top_k x this many distinct experts; 0: as many as the cache holds), stats_path and
    stats_every (a JSON counters file), top_k (0: the source's).

    Thread safety: a store may be used from several threads; a lease by one at a time."""
    _close_fn = staticmethod(_ep_experts_close)

    def __init__(self, path, *, device: Device = Device.AUTO, device_index: int = 0, cache_budget_bytes: int = 0,
                 staging_slots: int = 0, queue_depth: int = 0, read_splits: int = 0, direct_io: Optional[bool] = None,
                 pack_dir=None, pack_build: bool = True, no_pack: bool = False,
                 progress: Optional[Callable[[int, int], None]] = None, host_cache_bytes: int = 0,
                 prefetch: bool = False, cache_policy: Optional[str] = None, tokens_per_acquire: int = 1,
                 stats_path=None, stats_every: int = 0, top_k: int = 0):
        super().__init__()
        if not HAVE_EXPERTS:
            raise UnsupportedError(Status.UNSUPPORTED, "Experts: the loaded library predates the expert-store API (0.3)",
                                   "ep_experts_open")
        opts = _defaults(_ExpertsOptions, _ep_experts_options_init)
        opts.device = int(device)
        opts.device_index = device_index
        opts.cache_budget_bytes = cache_budget_bytes
        opts.staging_slots = staging_slots
        opts.queue_depth = queue_depth
        opts.read_splits = read_splits
        opts.direct_io = -1 if direct_io is None else int(bool(direct_io))
        keep = []  # the bytes the C strings point into, alive through the call
        if pack_dir is not None:
            keep.append(_path(pack_dir))
            opts.pack_dir = keep[-1]
        opts.pack_build = int(bool(pack_build))
        opts.no_pack = int(bool(no_pack))
        opts.host_cache_bytes = host_cache_bytes
        opts.prefetch = int(bool(prefetch))
        if cache_policy is not None:
            keep.append(cache_policy.encode("utf-8"))
            opts.cache_policy = keep[-1]
        opts.tokens_per_acquire = tokens_per_acquire
        if stats_path is not None:
            keep.append(_path(stats_path))
            opts.stats_path = keep[-1]
        opts.stats_every = stats_every
        opts.top_k = top_k
        errors = []
        c_progress = _progress_callback(progress, errors)
        if c_progress is not None:
            opts.progress = c_progress
        _check(_ep_experts_open(byref(self._h), _path(path), byref(opts)), "ep_experts_open")
        if errors:
            self.close()
            raise errors[0]
        self._info = self.info()

    @property
    def pack_path(self) -> str:
        """The Expert Pack (or source index) the store reads."""
        return os.fsdecode(_ep_experts_pack_path(self._ptr()))

    def info(self) -> ExpertsInfo:
        p = _out_struct(_ExpertsProperties)
        _check(_ep_experts_info(byref(p), self._ptr()), "ep_experts_info")
        return ExpertsInfo(p.num_layers, p.first_layer, p.num_experts, p.num_roles, p.top_k, p.max_experts_per_acquire,
                           p.max_table_ids, p.tokens_per_acquire, p.slot_bytes, p.cache_slots, p.host_slots,
                           {1: "cpu", 2: "cuda"}.get(p.device, str(p.device)), p.device_index, p.slots_address)

    def layout(self, layer: int) -> LayerLayout:
        """Where each role of layer ``layer``'s expert objects lies, and what it is."""
        lay = _out_struct(_LayerLayout)
        _check(_ep_experts_layout(byref(lay), self._ptr(), layer), "ep_experts_layout")
        roles = [RoleLayout(r.ggml_type, [int(r.ne[0]), int(r.ne[1])], r.offset, r.row_bytes, r.bytes) for r in lay.roles]
        return LayerLayout(lay.layer, lay.model_layer, lay.num_experts, lay.object_bytes, roles)

    def acquire(self, layer: int, ids, stream=None) -> "Lease":
        """Makes experts ``ids`` of ``layer`` resident and pins them (``ep_experts_acquire``). ``ids``: any
        sequence of ints (repeats welcome: every token's picks as they are). ``stream`` (CUDA only): an int
        ``cudaStream_t``, a ``torch.cuda.Stream``, or None for torch's current stream (the legacy default
        stream without torch). Use the lease as a context manager, or call :meth:`Lease.release`."""
        on_cuda = self._info.device == "cuda"
        handle = _stream_handle(stream, on_cuda)
        arr = _ids(ids)
        h = c_void_p()
        _check(_ep_experts_acquire(byref(h), self._ptr(), layer, arr, len(arr), handle), "ep_experts_acquire")
        return Lease(self, h, handle, self.layout(layer))

    def hint(self, layer: int, ids) -> None:
        """Experts of ``layer`` a later acquire will likely ask for (needs ``prefetch=True``)."""
        arr = _ids(ids)
        _check(_ep_experts_hint(self._ptr(), layer, arr, len(arr)), "ep_experts_hint")

    def stats(self) -> StoreStats:
        s = _store_stats_struct()
        _check(_ep_experts_stats(byref(s), self._ptr()), "ep_experts_stats")
        return StoreStats._from_c(s)


# DLPack (dlpack.h v0.8: DLManagedTensor), built with ctypes so that no compiled extension is needed.
class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32), ("dtype", _DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    pass


_DL_DELETER = CFUNCTYPE(None, POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", _DL_DELETER)]
_kDLCPU, _kDLCUDA = 1, 2
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat = 0, 1, 2, 4
_exported = {}  # id -> what a DLManagedTensor keeps alive until its consumer calls the deleter


@_DL_DELETER
def _dl_deleter(managed):
    _exported.pop(ctypes.addressof(managed.contents), None)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]
# The capsule destructor gets the capsule while it is being freed: it must not take a reference to it,
# so these two see it as a plain pointer.
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
_CAPSULE_DESTRUCTOR = CFUNCTYPE(None, c_void_p)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # A capsule never consumed still owns its tensor (a consumer renames it "used_dltensor").
    if _PyCapsule_IsValid(capsule, b"dltensor"):
        _exported.pop(_PyCapsule_GetPointer(capsule, b"dltensor"), None)


def _role_view_spec(role: RoleLayout):
    """(DLPack dtype (code, bits), shape) of a role: a plain matrix for F32 / F16 / BF16, else the raw
    bytes of its quantized rows, [rows, row_bytes] uint8 (dequantize them with the ggml type's rule)."""
    plain = {0: (_kDLFloat, 32), 1: (_kDLFloat, 16), 30: (_kDLBfloat, 16)}
    if role.ggml_type in plain:
        return plain[role.ggml_type], (role.ne[1], role.ne[0])
    return (_kDLUInt, 8), (role.ne[1], role.row_bytes)


class _DLPackView:
    """One role of one id as a DLPack producer (``__dlpack__`` / ``__dlpack_device__``)."""

    def __init__(self, lease: "Lease", address: int, role: RoleLayout):
        self._lease, self._address, self._role = lease, address, role

    def __dlpack_device__(self):
        info = self._lease._store._info
        return (_kDLCUDA, info.device_index) if info.device == "cuda" else (_kDLCPU, 0)

    def __dlpack__(self, stream=None, **_kwargs):
        lease = self._lease
        lease._require_held()
        if lease._store._info.device == "cuda" and stream is not None and stream != -1:
            # DLPack's stream numbers: 1 is the legacy default stream, 2 the per-thread default one.
            mine = lease._stream or 1
            if stream != mine:
                raise BufferError(f"the experts were acquired on stream {mine:#x}, the consumer reads on {stream:#x}: "
                                  "acquire them on the stream that uses them (Experts.acquire(stream=...))")
        (code, bits), shape = _role_view_spec(self._role)
        managed = _DLManagedTensor()
        shape_arr = (c_int64 * 2)(*shape)
        t = managed.dl_tensor
        t.data = self._address
        t.device = _DLDevice(*self.__dlpack_device__())
        t.ndim = 2
        t.dtype = _DLDataType(code, bits, 1)
        t.shape = ctypes.cast(shape_arr, POINTER(c_int64))
        t.strides = None  # row-major, compact
        t.byte_offset = 0
        managed.deleter = _dl_deleter
        address = ctypes.addressof(managed)
        _exported[address] = (managed, shape_arr, lease)
        return _PyCapsule_New(address, b"dltensor", ctypes.cast(_capsule_destructor, c_void_p))


class Lease:
    """One acquire's experts, pinned until :meth:`release` (``ep_experts_lease``). ``objects[i]`` is id i's
    expert object's address, ``roles[r][i]`` its role r's; ``device_table`` the store's role-major table of
    those addresses (device memory on CUDA), or None past ``max_table_ids``."""

    def __init__(self, store: Experts, handle: c_void_p, stream, layout: LayerLayout):
        self._store, self._h, self._stream, self.layout = store, handle, stream, layout
        p = _out_struct(_LeaseProperties)
        _check(_ep_experts_lease_info(byref(p), handle), "ep_experts_lease_info")
        n = p.n_ids
        self.layer = p.layer
        self.ids = [p.ids[i] for i in range(n)]
        self.objects = [p.objects[i] or 0 for i in range(n)]
        self.slots = [p.slots[i] for i in range(n)]  # id i's object is slot slots[i] of the cache
        self.roles = [[p.roles[r * n + i] or 0 for i in range(n)] for r in range(3)]
        self.device_table = p.device_table or None
        self.hits, self.misses, self.host_hits = p.hits, p.misses, p.host_hits

    def _require_held(self):
        if not self._h:
            raise ValueError("the lease was released: its addresses may hold other experts now")

    def address(self, index: int, role: Role) -> int:
        """The address of role ``role`` of the ``index``-th id."""
        self._require_held()
        return self.roles[int(role)][index]

    def view(self, index: int, role: Role) -> memoryview:
        """Host memory only: the bytes of role ``role`` of the ``index``-th id (no copy; valid until release)."""
        self._require_held()
        if self._store._info.device != "cpu":
            raise ValueError("view() reads host memory; the experts are on CUDA (use tensor())")
        r = self.layout.roles[int(role)]
        return memoryview((ctypes.c_char * r.bytes).from_address(self.address(index, role))).cast("B")

    def array(self, index: int, role: Role):
        """Host memory only, with NumPy: the role as an array over the slot (no copy; valid until release):
        float32 / float16 [rows, row elements] for F32 / F16, uint16 bit patterns for BF16, and for a
        quantized type its blocks as uint8 [rows, row_bytes]."""
        import numpy as np
        r = self.layout.roles[int(role)]
        raw = np.frombuffer(self.view(index, role), dtype=np.uint8)
        plain = {0: np.float32, 1: np.float16, 30: np.uint16}
        if r.ggml_type in plain:
            return raw.view(plain[r.ggml_type]).reshape(r.ne[1], r.ne[0])
        return raw.reshape(r.ne[1], r.row_bytes)

    def tensor(self, index: int, role: Role):
        """With PyTorch: the role as a tensor over the slot through DLPack (no copy; valid until release;
        on CUDA, use it on the stream the lease was acquired on): float32 / float16 / bfloat16
        [rows, row elements] for F32 / F16 / BF16, else the quantized blocks as uint8 [rows, row_bytes]."""
        import torch.utils.dlpack
        self._require_held()
        return torch.utils.dlpack.from_dlpack(_DLPackView(self, self.address(index, role), self.layout.roles[int(role)]))

    def release(self, stream=None) -> None:
        """Gives the experts back; on CUDA the work queued on ``stream`` (default: the acquire's stream)
        before this call is their last use. Idempotent."""
        h, self._h = self._h, None
        if not h:
            return
        if stream is None:
            handle = self._stream
        else:
            handle = _stream_handle(stream, self._store._info.device == "cuda")
        _check(_ep_experts_release(h, handle), "ep_experts_release")

    @property
    def released(self) -> bool:
        return not self._h

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown, closed store
            pass
