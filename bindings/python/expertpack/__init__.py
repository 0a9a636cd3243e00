"""Python bindings of libexpertpack (ctypes, no compiled extension).

The shared library is found, in order, at ``$EXPERTPACK_LIB`` (a file path), in
``$EXPERTPACK_LIB_DIR``, next to this package, in ``pkg-config --variable=libdir expertpack``, then by
the system loader (``libexpertpack.so.0``).

Errors raise :class:`ExpertPackError` (a subclass per status, e.g. :class:`NotFoundError`),
carrying ``status`` (the C ``ep_status`` value) and ``message`` (``ep_last_error()``).
Handles are freed deterministically with ``close()`` or a ``with`` block; the garbage collector
frees what was forgotten.

    with expertpack.Model("model.epk") as model, model.session() as session:
        result = session.generate([1, 2, 3], max_new_tokens=8, temperature=0.8, seed=7,
                                  on_token=lambda token, index: print(token))
"""
from __future__ import annotations

import ctypes
import json
import enum
import os
import threading
import weakref
from ctypes import (CFUNCTYPE, POINTER, Structure, byref, c_char, c_char_p, c_double, c_float, c_int, c_int32,
                    c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

__all__ = [
    "Status", "LogLevel", "Device", "Validation", "ExpertPackError", "Model", "Session", "Pack",
    "GenerateResult", "GenerateStats", "StoreStats", "ModelInfo", "PackInfo", "PackObject", "version",
    "version_number", "status_str", "last_error", "build_features", "cuda_device_count", "set_log_level",
    "set_log_callback", "read_store_stats", "library_path", "Tokenizer", "TokenizerInfo", "TextResult",
    "StopReason", "ChatTemplate", "HAVE_TEXT", "HAVE_BATCH", "TextStream", "append_many", "step_batch",
    "Grammar", "GrammarState", "HAVE_GRAMMAR", "sample_many", "HAVE_SAMPLE_MANY",
]


# ---------------------------------------------------------------------------------------------
# Library loading
# ---------------------------------------------------------------------------------------------
def _find_library() -> str:
    explicit = os.environ.get("EXPERTPACK_LIB")
    if explicit:
        return explicit
    names = ("libexpertpack.so", "libexpertpack.so.0", "libexpertpack.dylib", "expertpack.dll")
    dirs = []
    if os.environ.get("EXPERTPACK_LIB_DIR"):
        dirs.append(os.environ["EXPERTPACK_LIB_DIR"])
    dirs.append(os.path.dirname(os.path.abspath(__file__)))
    for d in dirs + _pkg_config_libdir():
        for n in names:
            p = os.path.join(d, n)
            if os.path.exists(p):
                return p
    return "libexpertpack.so.0"


def _pkg_config_libdir() -> list:
    """``pkg-config --variable=libdir expertpack`` (an installed library), or nothing."""
    import shutil
    import subprocess
    if not shutil.which("pkg-config"):
        return []
    r = subprocess.run(["pkg-config", "--variable=libdir", "expertpack"], capture_output=True, text=True)
    return [r.stdout.strip()] if r.returncode == 0 and r.stdout.strip() else []


_lib = ctypes.CDLL(_find_library())


def library_path() -> str:
    """The path (or name) the shared library was loaded from."""
    return _lib._name


# ---------------------------------------------------------------------------------------------
# Enums
# ---------------------------------------------------------------------------------------------
class Status(enum.IntEnum):
    OK = 0
    INVALID_ARGUMENT = -1
    OUT_OF_MEMORY = -2
    IO = -3
    NOT_FOUND = -4
    FORMAT = -5
    CORRUPT = -6
    UNSUPPORTED = -7
    VERSION = -8
    STRUCT_SIZE = -9
    SHAPE = -10
    CUDA = -11
    NO_DEVICE = -12
    BUDGET = -13
    CANCELLED = -14
    BUSY = -15
    STALE = -16
    INTERNAL = -17


class LogLevel(enum.IntEnum):
    TRACE = 0
    DEBUG = 1
    INFO = 2
    WARN = 3
    ERROR = 4
    OFF = 5


class Device(enum.IntEnum):
    AUTO = 0
    CPU = 1
    CUDA = 2


class Validation(enum.IntEnum):
    STRUCTURE = 0
    SAMPLED = 1
    FULL = 2


FEATURE_CUDA = 1
FEATURE_IO_URING = 2


# ---------------------------------------------------------------------------------------------
# C structs (layouts of include/expertpack/*.h; tests/capi pins them on the C side)
# ---------------------------------------------------------------------------------------------
_LOG_FN = CFUNCTYPE(None, c_int32, c_char_p, c_void_p)
_TOKEN_FN = CFUNCTYPE(c_int, c_int32, c_uint32, c_void_p)
_PROGRESS_FN = CFUNCTYPE(None, c_uint64, c_uint64, c_void_p)


def _progress_callback(progress, errors):
    """A C progress callback calling @p progress(done, total), or None without one. An exception the
    Python callback raises is kept in @p errors (the caller re-raises it after the C call) and
    stops further calls."""
    if progress is None:
        return None

    def on_progress(done, total, _payload):
        if errors:
            return
        try:
            progress(int(done), int(total))
        except BaseException as e:  # noqa: BLE001 - re-raised after the call
            errors.append(e)
    return _PROGRESS_FN(on_progress)


class _LogOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("min_level", c_int32), ("callback", _LOG_FN), ("payload", c_void_p)]


class _ModelOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("device", c_int32), ("device_index", c_int32),
                ("cache_budget_bytes", c_uint64), ("staging_slots", c_uint32), ("queue_depth", c_uint32),
                ("read_splits", c_uint32), ("direct_io", c_int32), ("pack_dir", c_char_p), ("pack_build", c_int32),
                ("resident_experts", c_int32), ("progress", _PROGRESS_FN), ("progress_payload", c_void_p),
                # appended after the first version:
                ("cpu_threads", c_int32), ("host_cache_bytes", c_uint64), ("overlap_reads", c_int32),
                ("prefetch", c_int32), ("cache_policy", c_char_p),
                # appended after 0.2.0:
                ("no_pack", c_int32),
                # appended after 0.4.0:
                ("kv_budget_bytes", c_uint64)]


class _ModelProperties(Structure):
    _fields_ = [("struct_size", c_size_t), ("architecture", c_char * 32), ("vocab_size", c_uint32),
                ("num_layers", c_uint32), ("hidden_size", c_uint32), ("num_experts", c_uint32),
                ("experts_per_token", c_uint32), ("weight_bytes", c_uint64),
                # appended after the first version:
                ("device", c_int32), ("device_index", c_int32),
                # appended after 0.4.0:
                ("context_length", c_uint64), ("kv_budget_bytes", c_uint64)]


class _GenerateOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("max_new_tokens", c_uint32), ("temperature", c_float), ("top_k", c_int32),
                ("top_p", c_float), ("seed", c_uint64), ("stop_token", c_int32),
                # appended after the first version:
                ("min_p", c_float), ("repetition_penalty", c_float), ("repetition_window", c_uint32),
                ("stop_tokens", POINTER(c_int32)), ("n_stop_tokens", c_size_t), ("stop_strings", POINTER(c_char_p)),
                ("n_stop_strings", c_size_t), ("ignore_eos", c_int32),
                ("logit_bias", c_void_p), ("n_logit_bias", c_size_t),
                # 0.5:
                ("grammar", c_void_p)]


class _LogitBias(Structure):
    _fields_ = [("token", c_int32), ("bias", c_float)]


MAX_TOP_LOGPROBS = 20
"""The most alternatives :meth:`Session.sample_logprobs` reports (EP_MAX_TOP_LOGPROBS)."""


class _TokenLogprobs(Structure):
    _fields_ = [("struct_size", c_size_t), ("token", c_int32), ("logprob", c_float), ("n_top", c_uint32),
                ("top_tokens", c_int32 * MAX_TOP_LOGPROBS), ("top_logprobs", c_float * MAX_TOP_LOGPROBS)]


class _GenerateStats(Structure):
    _fields_ = [("struct_size", c_size_t), ("prompt_tokens", c_uint32), ("generated_tokens", c_uint32),
                ("prefill_seconds", c_double), ("decode_seconds", c_double),
                # appended after the first version:
                ("stop_reason", c_int32), ("reused_tokens", c_uint32), ("prefill_tokens_per_second", c_double),
                ("decode_tokens_per_second", c_double), ("session_tokens", c_uint64),
                ("prefill_expert_bytes", c_uint64), ("decode_expert_bytes", c_uint64)]


class _TokenizerProperties(Structure):
    _fields_ = [("struct_size", c_size_t), ("vocab_size", c_uint32), ("bos_id", c_int32), ("eos_id", c_int32),
                ("end_of_turn_id", c_int32), ("chat_template", c_int32)]


class _ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p), ("reasoning_content", c_char_p)]


class _ChatOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("chat_template", c_int32), ("thinking", c_int32),
                ("add_generation_prompt", c_int32),
                # 0.4: tools
                ("tools_json", c_char_p), ("message_tools_json", POINTER(c_char_p)), ("tool_choice", c_char_p)]


_TEXT_FN = CFUNCTYPE(c_int, POINTER(c_char), c_size_t, c_void_p)


_STORE_FIELDS = ["acquires", "pack_reads", "pack_read_bytes", "pack_read_ns", "cache_hits", "cache_misses",
                 "cache_evictions", "resident_experts", "resident_bytes", "h2d_bytes", "io_errors", "fallback_count",
                 "cache_slots", "slot_bytes"]
# appended after the first version (None in StoreStats with a library older than them):
_STORE_FIELDS_V2 = ["host_hits", "host_misses", "demotions", "host_resident_bytes", "host_slots", "prefetch_issued",
                    "prefetch_used"]
_STORE_FIELDS_V3 = ["pack_read_full_ns", "pack_read_full_depth", "expert_wait_ns", "store_disk_idle_ns"]


class _StoreStats(Structure):
    _fields_ = [("struct_size", c_size_t)] + [(n, c_uint64) for n in _STORE_FIELDS + _STORE_FIELDS_V2 + _STORE_FIELDS_V3]


class _PackOpenOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("validation", c_int32)]


class _PackProperties(Structure):
    _fields_ = [("struct_size", c_size_t), ("format_version", c_uint32), ("num_layers", c_uint32),
                ("num_experts", c_uint32), ("num_roles", c_uint32), ("top_k", c_uint32), ("first_layer", c_uint32),
                ("alignment", c_uint64), ("data_start", c_uint64), ("object_stride", c_uint64),
                ("max_object_bytes", c_uint64), ("file_size", c_uint64), ("source_files_sha256", c_uint8 * 32),
                ("model_identity_sha256", c_uint8 * 32), ("config_sha256", c_uint8 * 32)]


class _PackObjectInfo(Structure):
    _fields_ = [("offset", c_uint64), ("bytes", c_uint64), ("role_offset", c_uint64 * 3), ("role_bytes", c_uint64 * 3),
                ("role_ggml_type", c_uint32 * 3), ("reserved", c_uint32)]


def _fn(name, restype, *argtypes, optional=False):
    try:
        f = getattr(_lib, name)
    except AttributeError:
        if optional:
            return None  # a library built before this function existed
        raise
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_ep_status_str = _fn("ep_status_str", c_char_p, c_int32)
_ep_last_error = _fn("ep_last_error", c_char_p)
_ep_version_number = _fn("ep_version_number", c_uint32)
_ep_version_string = _fn("ep_version_string", c_char_p)
_ep_log_options_init = _fn("ep_log_options_init", None, c_void_p)
_ep_log_configure = _fn("ep_log_configure", c_int32, POINTER(_LogOptions))
_ep_set_log_level = _fn("ep_set_log_level", c_int32, c_int32)
_ep_set_log_callback = _fn("ep_set_log_callback", None, _LOG_FN, c_void_p)
_ep_build_features = _fn("ep_build_features", c_uint32)
_ep_cuda_device_count = _fn("ep_cuda_device_count", c_int32, POINTER(c_int32))
_ep_model_options_init = _fn("ep_model_options_init", None, c_void_p)
_ep_model_open = _fn("ep_model_open", c_int32, POINTER(c_void_p), c_char_p, POINTER(_ModelOptions))
_ep_model_close = _fn("ep_model_close", None, c_void_p)
_ep_model_pack_path = _fn("ep_model_pack_path", c_char_p, c_void_p)
_ep_model_store_stats = _fn("ep_model_store_stats", c_int32, POINTER(_StoreStats), c_void_p)
_ep_model_info = _fn("ep_model_info", c_int32, POINTER(_ModelProperties), c_void_p)
_ep_session_open = _fn("ep_session_open", c_int32, POINTER(c_void_p), c_void_p)
_ep_session_close = _fn("ep_session_close", None, c_void_p)
_ep_session_reset = _fn("ep_session_reset", c_int32, c_void_p)
_ep_session_length = _fn("ep_session_length", c_int32, POINTER(c_uint64), c_void_p)
_ep_generate_options_init = _fn("ep_generate_options_init", None, c_void_p)
_ep_generate = _fn("ep_generate", c_int32, POINTER(_GenerateStats), c_void_p, POINTER(c_int32), c_size_t,
                   POINTER(_GenerateOptions), _TOKEN_FN, c_void_p)
_ep_score = _fn("ep_score", c_int32, c_void_p, POINTER(c_int32), c_size_t, c_uint32, POINTER(c_int32),
                POINTER(c_float))
_ep_store_stats_init = _fn("ep_store_stats_init", None, c_void_p)
_ep_store_stats_read_file = _fn("ep_store_stats_read_file", c_int32, POINTER(_StoreStats), c_char_p)
_ep_pack_open_options_init = _fn("ep_pack_open_options_init", None, c_void_p)
_ep_pack_open = _fn("ep_pack_open", c_int32, POINTER(c_void_p), c_char_p, POINTER(_PackOpenOptions))
_ep_pack_info = _fn("ep_pack_info", c_int32, POINTER(_PackProperties), c_void_p)
_ep_pack_object = _fn("ep_pack_object", c_int32, POINTER(_PackObjectInfo), c_void_p, c_uint32, c_uint32)
_ep_pack_close = _fn("ep_pack_close", None, c_void_p)
_ep_generate_stats_init = _fn("ep_generate_stats_init", None, c_void_p)
# text.h
_ep_tokenizer_open = _fn("ep_tokenizer_open", c_int32, POINTER(c_void_p), c_char_p, optional=True)
_ep_tokenizer_open_model = _fn("ep_tokenizer_open_model", c_int32, POINTER(c_void_p), c_void_p, optional=True)
_ep_tokenizer_close = _fn("ep_tokenizer_close", None, c_void_p, optional=True)
_ep_tokenizer_properties_init = _fn("ep_tokenizer_properties_init", None, c_void_p, optional=True)
_ep_tokenizer_info = _fn("ep_tokenizer_info", c_int32, POINTER(_TokenizerProperties), c_void_p, optional=True)
_ep_tokenizer_token_id = _fn("ep_tokenizer_token_id", c_int32, POINTER(c_int32), c_void_p, c_char_p, optional=True)
_ep_tokenize = _fn("ep_tokenize", c_int32, POINTER(c_int32), c_size_t, POINTER(c_size_t), c_void_p, c_char_p,
                   c_size_t, c_uint32, optional=True)
_ep_detokenize = _fn("ep_detokenize", c_int32, c_char_p, c_size_t, POINTER(c_size_t), c_void_p, POINTER(c_int32),
                     c_size_t, c_uint32, optional=True)
_ep_chat_options_init = _fn("ep_chat_options_init", None, c_void_p, optional=True)
_ep_chat_render = _fn("ep_chat_render", c_int32, c_char_p, c_size_t, POINTER(c_size_t), c_void_p,
                      POINTER(_ChatMessage), c_size_t, POINTER(_ChatOptions), optional=True)
_ep_generate_text = _fn("ep_generate_text", c_int32, POINTER(_GenerateStats), c_void_p, c_void_p, c_char_p,
                        POINTER(_GenerateOptions), _TEXT_FN, c_void_p, optional=True)
_ep_generate_chat = _fn("ep_generate_chat", c_int32, POINTER(_GenerateStats), c_void_p, c_void_p,
                        POINTER(_ChatMessage), c_size_t, POINTER(_ChatOptions), POINTER(_GenerateOptions), _TEXT_FN,
                        c_void_p, optional=True)
HAVE_TEXT = _ep_generate_chat is not None
"""True when the loaded library has the text API (text.h: tokenizers, chat, text generation)."""
# 0.2: stepping several sessions together, sampling, forks, incremental text
_ep_sessions_append = _fn("ep_sessions_append", c_int32, POINTER(c_void_p), POINTER(POINTER(c_int32)),
                          POINTER(c_size_t), c_size_t, optional=True)
_ep_session_sample = _fn("ep_session_sample", c_int32, POINTER(c_int32), c_void_p, POINTER(_GenerateOptions),
                         optional=True)
_ep_session_tokens = _fn("ep_session_tokens", c_int32, POINTER(c_int32), c_size_t, POINTER(c_size_t), c_void_p,
                         optional=True)
_ep_session_fork = _fn("ep_session_fork", c_int32, POINTER(c_void_p), c_void_p, optional=True)
# 0.4: logit bias (an appended ep_generate_options field) and the log-probabilities of sampled tokens
_ep_session_sample_logprobs = _fn("ep_session_sample_logprobs", c_int32, POINTER(_TokenLogprobs), c_void_p,
                                  POINTER(_GenerateOptions), c_uint32, optional=True)
_ep_session_state_bytes = _fn("ep_session_state_bytes", c_int32, POINTER(c_uint64), c_void_p, optional=True)
_ep_session_set_draw_count = _fn("ep_session_set_draw_count", c_int32, c_void_p, c_uint64, optional=True)
_ep_chat_tool_call_prefix = _fn("ep_chat_tool_call_prefix", c_int32, c_char_p, c_size_t, POINTER(c_size_t), c_void_p, c_char_p,
                                POINTER(_ChatOptions), optional=True)
# 0.5: constrained sampling (grammar.h)
_ep_grammar_json_object = _fn("ep_grammar_json_object", c_int32, POINTER(c_void_p), c_void_p, optional=True)
_ep_grammar_json_schema = _fn("ep_grammar_json_schema", c_int32, POINTER(c_void_p), c_void_p, c_char_p, c_size_t,
                              optional=True)
_ep_grammar_close = _fn("ep_grammar_close", None, c_void_p, optional=True)
_ep_grammar_state_open = _fn("ep_grammar_state_open", c_int32, POINTER(c_void_p), c_void_p, optional=True)
_ep_grammar_state_close = _fn("ep_grammar_state_close", None, c_void_p, optional=True)
_ep_grammar_state_accept = _fn("ep_grammar_state_accept", c_int32, c_void_p, c_int32, optional=True)
_ep_grammar_state_complete = _fn("ep_grammar_state_complete", c_int32, POINTER(c_int32), c_void_p, optional=True)
_ep_grammar_state_allowed = _fn("ep_grammar_state_allowed", c_int32, POINTER(ctypes.c_uint32), c_size_t, POINTER(c_size_t),
                                c_void_p, optional=True)
HAVE_GRAMMAR = _ep_grammar_state_allowed is not None
"""True when the loaded library has constrained sampling (0.5: :class:`Grammar`, the ``grammar`` generate option)."""
_ep_sessions_sample = _fn("ep_sessions_sample", c_int32, POINTER(c_int32), POINTER(POINTER(_TokenLogprobs)),
                         POINTER(c_void_p), POINTER(POINTER(_GenerateOptions)), POINTER(ctypes.c_uint32), c_size_t,
                         optional=True)
HAVE_SAMPLE_MANY = _ep_sessions_sample is not None
"""True when the loaded library samples several sessions in one call (0.6: :func:`sample_many`)."""
_ep_text_stream_open = _fn("ep_text_stream_open", c_int32, POINTER(c_void_p), c_void_p, POINTER(c_char_p), c_size_t,
                           optional=True)
_ep_text_stream_push = _fn("ep_text_stream_push", c_int32, c_void_p, c_int32, _TEXT_FN, c_void_p, POINTER(c_int32),
                           optional=True)
_ep_text_stream_finish = _fn("ep_text_stream_finish", c_int32, c_void_p, _TEXT_FN, c_void_p, POINTER(c_int32),
                             optional=True)
_ep_text_stream_close = _fn("ep_text_stream_close", None, c_void_p, optional=True)
HAVE_BATCH = _ep_sessions_append is not None and _ep_text_stream_close is not None
"""True when the loaded library has the 0.2 session API: :func:`append_many`, :meth:`Session.sample`,
:meth:`Session.fork`, :attr:`Session.tokens` and :class:`TextStream`."""


def _require_batch(function: str) -> None:
    if not HAVE_BATCH:
        raise UnsupportedError(Status.UNSUPPORTED, f"{function}: the loaded library predates it (0.2)", function)


def _defaults(struct_type, init_fn):
    """Fills a struct with the library's defaults. init() writes the *library's* sizeof, which may be
    larger or smaller than the layout known here (fields are appended), so it writes into a big
    buffer first; struct_size becomes the smaller of the two sizes, which both sides understand
    (fields past it keep their defaults). ``s._lib_size`` is the library's own size."""
    buf = ctypes.create_string_buffer(max(1024, ctypes.sizeof(struct_type)))
    init_fn(buf)
    lib_size = c_size_t.from_buffer(buf).value
    s = struct_type.from_buffer_copy(buf.raw[:ctypes.sizeof(struct_type)])
    s.struct_size = min(lib_size, ctypes.sizeof(struct_type))
    return s


def _fits(s, field_name) -> bool:
    """Whether the negotiated struct_size of ``s`` covers ``field_name``."""
    f = getattr(type(s), field_name)
    return f.offset + f.size <= s.struct_size


def _out_struct(struct_type):
    s = struct_type()
    s.struct_size = ctypes.sizeof(struct_type)
    return s


def _path(p) -> bytes:
    return os.fsencode(p)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
class ExpertPackError(Exception):
    """A failed libexpertpack call: ``status`` (:class:`Status` or int) and ``message``."""

    def __init__(self, status: int, message: str, function: str = ""):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        self.function = function
        super().__init__(f"{status_str(int(status))}: {message}" if message else status_str(int(status)))


class InvalidArgumentError(ExpertPackError, ValueError): pass
class OutOfMemoryError(ExpertPackError, MemoryError): pass
class IOError_(ExpertPackError, OSError): pass
class NotFoundError(ExpertPackError, FileNotFoundError): pass
class FormatError(ExpertPackError): pass
class CorruptError(ExpertPackError): pass
class UnsupportedError(ExpertPackError): pass
class VersionError(ExpertPackError): pass
class StructSizeError(ExpertPackError): pass
class ShapeError(ExpertPackError): pass
class CudaError(ExpertPackError): pass
class NoDeviceError(ExpertPackError): pass
class BudgetError(ExpertPackError): pass
class CancelledError(ExpertPackError): pass
class BusyError(ExpertPackError): pass
class StaleError(ExpertPackError): pass
class InternalError(ExpertPackError): pass


_ERROR_CLASSES = {
    Status.INVALID_ARGUMENT: InvalidArgumentError, Status.OUT_OF_MEMORY: OutOfMemoryError, Status.IO: IOError_,
    Status.NOT_FOUND: NotFoundError, Status.FORMAT: FormatError, Status.CORRUPT: CorruptError,
    Status.UNSUPPORTED: UnsupportedError, Status.VERSION: VersionError, Status.STRUCT_SIZE: StructSizeError,
    Status.SHAPE: ShapeError, Status.CUDA: CudaError, Status.NO_DEVICE: NoDeviceError, Status.BUDGET: BudgetError,
    Status.CANCELLED: CancelledError, Status.BUSY: BusyError, Status.STALE: StaleError,
    Status.INTERNAL: InternalError,
}
__all__ += [c.__name__ for c in _ERROR_CLASSES.values()]


def _check(status: int, function: str) -> None:
    if status == 0:
        return
    message = (_ep_last_error() or b"").decode("utf-8", "replace")
    cls = _ERROR_CLASSES.get(status, ExpertPackError)
    raise cls(status, message, function)


# ---------------------------------------------------------------------------------------------
# Core
# ---------------------------------------------------------------------------------------------
def version() -> str:
    """The loaded library's version, e.g. "0.1.0"."""
    return _ep_version_string().decode()


def version_number() -> int:
    """``major * 10000 + minor * 100 + patch`` of the loaded library."""
    return int(_ep_version_number())


def status_str(status: int) -> str:
    """The C name of a status code ("EP_ERR_NOT_FOUND"...)."""
    return _ep_status_str(int(status)).decode()


def last_error() -> str:
    """``ep_last_error()`` of the calling thread."""
    return (_ep_last_error() or b"").decode("utf-8", "replace")


def build_features() -> int:
    """Bitwise OR of FEATURE_CUDA / FEATURE_IO_URING."""
    return int(_ep_build_features())


def cuda_device_count() -> int:
    n = c_int32(0)
    _check(_ep_cuda_device_count(byref(n)), "ep_cuda_device_count")
    return n.value


def set_log_level(level: LogLevel) -> None:
    _check(_ep_set_log_level(int(level)), "ep_set_log_level")


_log_lock = threading.Lock()
_log_keepalive = None  # the ctypes callback object the library holds; replaced only after reconfiguring


def set_log_callback(callback: Optional[Callable[[LogLevel, str], None]],
                     min_level: Optional[LogLevel] = None) -> None:
    """Routes the library's log to ``callback(level, message)`` (None: back to stderr). The callback
    may run on library threads; exceptions in it are swallowed (a log sink cannot fail)."""
    global _log_keepalive
    with _log_lock:
        if callback is None:
            c_cb = _LOG_FN()
        else:
            def trampoline(level, message, _payload, _cb=callback):
                try:
                    try:
                        lvl = LogLevel(level)
                    except ValueError:
                        lvl = level
                    _cb(lvl, (message or b"").decode("utf-8", "replace"))
                except BaseException:  # noqa: BLE001 - a sink must not raise into C
                    pass
            c_cb = _LOG_FN(trampoline)
        if min_level is None:
            _ep_set_log_callback(c_cb, None)  # keeps the current level
        else:
            opts = _defaults(_LogOptions, _ep_log_options_init)
            opts.min_level = int(min_level)
            opts.callback = c_cb
            _check(_ep_log_configure(byref(opts)), "ep_log_configure")
        _log_keepalive = c_cb  # the old one stays referenced until here, after the library dropped it


# ---------------------------------------------------------------------------------------------
# Stats and info records
# ---------------------------------------------------------------------------------------------
@dataclass
class StoreStats:
    """Counters of an expert store (``ep_store_stats``)."""
    acquires: int = 0
    pack_reads: int = 0
    pack_read_bytes: int = 0
    pack_read_ns: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    cache_evictions: int = 0
    resident_experts: int = 0
    resident_bytes: int = 0
    h2d_bytes: int = 0
    io_errors: int = 0
    fallback_count: int = 0
    cache_slots: int = 0
    slot_bytes: int = 0
    # Appended after the first version: None with a library older than them.
    host_hits: Optional[int] = None
    """Cache misses served from the host-RAM tier (one copy, no pack read)."""
    host_misses: Optional[int] = None
    """Cache misses not in the host tier (read from the pack); 0 without a tier."""
    demotions: Optional[int] = None
    """Experts evicted from the cache and kept in the host tier."""
    host_resident_bytes: Optional[int] = None
    """Payload bytes held by the host tier now."""
    host_slots: Optional[int] = None
    """Slots of the host tier (0: no tier)."""
    prefetch_issued: Optional[int] = None
    """Experts loaded ahead of their layer from a prediction (``Model(prefetch=True)``)."""
    prefetch_used: Optional[int] = None
    """Prefetched experts their layer then asked for."""
    pack_read_full_ns: Optional[int] = None
    """Wall time with at least ``pack_read_full_depth`` reads in flight (the queue kept full)."""
    pack_read_full_depth: Optional[int] = None
    """Reads in flight that count as a full queue (a setting, not a count)."""
    expert_wait_ns: Optional[int] = None
    """Wall time the model's thread was blocked waiting for expert reads to land."""
    store_disk_idle_ns: Optional[int] = None
    """Wall time the expert store's own work ran with no read in flight."""

    @classmethod
    def _from_c(cls, s: _StoreStats) -> "StoreStats":
        names = _STORE_FIELDS + [n for n in _STORE_FIELDS_V2 + _STORE_FIELDS_V3 if _fits(s, n)]
        return cls(**{n: int(getattr(s, n)) for n in names})


def _store_stats_struct() -> _StoreStats:
    """An ep_store_stats whose struct_size the loaded library accepts (its own or this layout's)."""
    return _defaults(_StoreStats, _ep_store_stats_init)


def read_store_stats(path) -> StoreStats:
    """Reads a statistics JSON file written by an expert store (``ep_store_stats_read_file``)."""
    s = _store_stats_struct()
    _check(_ep_store_stats_read_file(byref(s), _path(path)), "ep_store_stats_read_file")
    return StoreStats._from_c(s)


@dataclass
class ModelInfo:
    architecture: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    num_experts: int
    experts_per_token: int
    weight_bytes: int
    device: Optional[str] = None
    """Where the model runs: "cpu" or "cuda" (what "auto" chose); None with a library older than the field."""
    device_index: Optional[int] = None
    """The CUDA device's ordinal, -1 on the CPU; None with an older library."""
    context_length: Optional[int] = None
    """Tokens one session may hold (0: the file states none); None with an older library."""
    kv_budget_bytes: Optional[int] = None
    """The KV budget in effect; None with an older library."""


class StopReason(enum.IntEnum):
    LENGTH = 0
    TOKEN = 1
    STRING = 2
    CANCELLED = 3


class ChatTemplate(enum.IntEnum):
    AUTO = 0
    DEEPSEEK_V4 = 1
    KIMI_K3 = 2
    NONE = 3


@dataclass
class GenerateStats:
    """``ep_generate_stats``. The fields after decode_seconds stay None with a library older than them."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: Optional[StopReason] = None
    reused_tokens: Optional[int] = None
    prefill_tokens_per_second: Optional[float] = None
    decode_tokens_per_second: Optional[float] = None
    session_tokens: Optional[int] = None
    prefill_expert_bytes: Optional[int] = None
    """Routed-expert bytes read from the Expert Pack during the prompt pass (0 with resident experts)."""
    decode_expert_bytes: Optional[int] = None
    """The same during the generation steps."""

    @classmethod
    def _from_c(cls, st: _GenerateStats) -> "GenerateStats":
        r = cls(st.prompt_tokens, st.generated_tokens, st.prefill_seconds, st.decode_seconds)
        if _fits(st, "session_tokens"):
            try:
                r.stop_reason = StopReason(st.stop_reason)
            except ValueError:
                r.stop_reason = st.stop_reason
            r.reused_tokens = st.reused_tokens
            r.prefill_tokens_per_second = st.prefill_tokens_per_second
            r.decode_tokens_per_second = st.decode_tokens_per_second
            r.session_tokens = st.session_tokens
        if _fits(st, "decode_expert_bytes"):
            r.prefill_expert_bytes = st.prefill_expert_bytes
            r.decode_expert_bytes = st.decode_expert_bytes
        return r


@dataclass
class GenerateResult:
    """What :meth:`Session.generate` produced. ``cancelled`` is True when ``on_token`` stopped it
    (the token it stopped at is included, and is in the session)."""
    tokens: List[int] = field(default_factory=list)
    stats: GenerateStats = field(default_factory=GenerateStats)
    cancelled: bool = False


@dataclass
class TextResult:
    """What :meth:`Session.generate_text` / :meth:`Session.generate_chat` produced: the streamed
    text joined, the statistics, and whether ``on_text`` stopped it."""
    text: str = ""
    stats: GenerateStats = field(default_factory=GenerateStats)
    cancelled: bool = False


@dataclass
class TokenizerInfo:
    vocab_size: int
    bos_id: int
    eos_id: int
    end_of_turn_id: int
    chat_template: ChatTemplate


@dataclass
class PackInfo:
    format_version: int
    num_layers: int
    num_experts: int
    num_roles: int
    top_k: int
    first_layer: int
    alignment: int
    data_start: int
    object_stride: int
    max_object_bytes: int
    file_size: int
    source_files_sha256: bytes
    model_identity_sha256: bytes
    config_sha256: bytes


@dataclass
class PackObject:
    offset: int
    bytes: int
    role_offset: List[int]
    role_bytes: List[int]
    role_ggml_type: List[int]


# ---------------------------------------------------------------------------------------------
# Handles
# ---------------------------------------------------------------------------------------------
class _Handle:
    _close_fn = None

    def __init__(self):
        self._h = c_void_p()

    @property
    def closed(self) -> bool:
        return not self._h

    def _ptr(self):
        if not self._h:
            raise ValueError(f"{type(self).__name__} is closed")
        return self._h

    def close(self) -> None:
        """Frees the handle now; further use raises ValueError. Idempotent."""
        h, self._h = self._h, c_void_p()
        if h:
            type(self)._close_fn(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class Model(_Handle):
    """An open model (``ep_model_open``). Keyword options are the fields of ``ep_model_options``:
    device, device_index, cache_budget_bytes, staging_slots, queue_depth, read_splits, direct_io,
    pack_dir, pack_build (None: the library's default, on), resident_experts, cpu_threads (0: EP_CPU_THREADS, else every core), host_cache_bytes
    (a host-RAM tier below the expert cache; 0: none), overlap_reads (None: the library's default, on),
    prefetch (None: the library's default, off), cache_policy ("decay", "decay-bypass", "lru", "sglang-lfu";
    None: "decay"), no_pack (read the routed experts from the source files themselves through a small
    source index in pack_dir instead of an Expert Pack; not with a pack as ``path`` nor with
    resident_experts), kv_budget_bytes (what all sessions' decode state may take together; 0: automatic)
    and progress (``callable(done_bytes, total_bytes)``). An option the loaded library is
    too old for raises :class:`UnsupportedError` unless it has its default value."""
    _close_fn = staticmethod(_ep_model_close)

    def __init__(self, path, *, device: Device = Device.AUTO, device_index: int = 0, cache_budget_bytes: int = 0,
                 staging_slots: int = 0, queue_depth: int = 0, read_splits: int = 0, direct_io: Optional[bool] = None,
                 pack_dir=None, pack_build: Optional[bool] = None, resident_experts: bool = False, cpu_threads: int = 0,
                 host_cache_bytes: int = 0, overlap_reads: Optional[bool] = None, prefetch: Optional[bool] = None,
                 cache_policy: Optional[str] = None, no_pack: bool = False, kv_budget_bytes: int = 0,
                 progress: Optional[Callable[[int, int], None]] = None):
        super().__init__()
        self._sessions = weakref.WeakSet()
        opts = _defaults(_ModelOptions, _ep_model_options_init)
        opts.device = int(device)
        opts.device_index = device_index
        opts.cache_budget_bytes = cache_budget_bytes
        opts.staging_slots = staging_slots
        opts.queue_depth = queue_depth
        opts.read_splits = read_splits
        opts.direct_io = -1 if direct_io is None else int(bool(direct_io))
        pack_dir_b = _path(pack_dir) if pack_dir is not None else None
        opts.pack_dir = pack_dir_b
        if pack_build is not None:
            opts.pack_build = int(bool(pack_build))
        opts.resident_experts = int(bool(resident_experts))
        policy_b = cache_policy.encode("utf-8") if cache_policy is not None else None
        appended = {"cpu_threads": (cpu_threads, 0), "host_cache_bytes": (host_cache_bytes, 0),
                    "overlap_reads": (None if overlap_reads is None else int(bool(overlap_reads)), None),
                    "prefetch": (None if prefetch is None else int(bool(prefetch)), None),
                    "cache_policy": (policy_b, None), "no_pack": (int(bool(no_pack)), 0),
                    "kv_budget_bytes": (kv_budget_bytes, 0)}
        for name, (value, default) in appended.items():
            if value == default:
                continue  # the library's default stays
            if not _fits(opts, name):
                raise UnsupportedError(Status.UNSUPPORTED, f"{name}: the loaded library "
                                       f"({opts.struct_size}-byte ep_model_options) predates it", "ep_model_open")
            setattr(opts, name, value)
        errors = []
        c_progress = _progress_callback(progress, errors)
        if c_progress is not None:
            opts.progress = c_progress
        _check(_ep_model_open(byref(self._h), _path(path), byref(opts)), "ep_model_open")
        if errors:
            self.close()
            raise errors[0]

    def close(self) -> None:
        """Closes the model, and first every session still open on it."""
        for s in list(self._sessions):
            s.close()
        super().close()

    @property
    def pack_path(self) -> Optional[str]:
        p = _ep_model_pack_path(self._ptr())
        return os.fsdecode(p) if p else None

    def info(self) -> ModelInfo:
        p = _out_struct(_ModelProperties)
        _check(_ep_model_info(byref(p), self._ptr()), "ep_model_info")
        info = ModelInfo(p.architecture.decode(), p.vocab_size, p.num_layers, p.hidden_size, p.num_experts,
                         p.experts_per_token, p.weight_bytes)
        if _fits(p, "device_index"):
            info.device = {1: "cpu", 2: "cuda"}.get(p.device, str(p.device))
            info.device_index = p.device_index
        if _fits(p, "kv_budget_bytes"):
            info.context_length = p.context_length
            info.kv_budget_bytes = p.kv_budget_bytes
        return info

    def store_stats(self) -> StoreStats:
        s = _store_stats_struct()
        _check(_ep_model_store_stats(byref(s), self._ptr()), "ep_model_store_stats")
        return StoreStats._from_c(s)

    def session(self) -> "Session":
        """A new, empty sequence on this model."""
        return Session(self)

    def tokenizer(self) -> "Tokenizer":
        """The model's own tokenizer (``ep_tokenizer_open_model``); it may outlive the model."""
        return Tokenizer(_model=self)


def _int_array(values: Sequence[int]):
    arr = (c_int32 * len(values))(*values)
    return arr


_GEN_DEFAULTS_V1 = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop_token")


def _generate_options(options: dict):
    """An ep_generate_options from keyword options; returns it and the buffers it points into."""
    opts = _defaults(_GenerateOptions, _ep_generate_options_init)
    keep = []
    for name, value in options.items():
        if name == "stop_tokens":
            arr = _int_array(list(value or ()))
            keep.append(arr)
            value, name2 = arr, "n_stop_tokens"
            if not _fits(opts, name2) and len(arr):
                raise UnsupportedError(Status.UNSUPPORTED, "stop_tokens: the loaded library is older than it")
            if _fits(opts, name2):
                opts.stop_tokens = arr
                opts.n_stop_tokens = len(arr)
            continue
        if name == "stop_strings":
            strs = [x.encode("utf-8") for x in (value or ())]
            arr = (c_char_p * len(strs))(*strs)
            keep += [strs, arr]
            if not _fits(opts, "n_stop_strings"):
                if strs:
                    raise UnsupportedError(Status.UNSUPPORTED, "stop_strings: the loaded library is older than it")
                continue
            opts.stop_strings = arr
            opts.n_stop_strings = len(strs)
            continue
        if name == "grammar":
            if value is None:
                continue
            if not isinstance(value, GrammarState):
                raise TypeError("grammar: expected a GrammarState (Grammar.state())")
            if not _fits(opts, "grammar"):
                raise UnsupportedError(Status.UNSUPPORTED, "grammar: the loaded library is older than it (0.5)")
            opts.grammar = value._ptr()
            keep.append(value)
            continue
        if name == "logit_bias":
            entries = sorted((value or {}).items())
            arr = (_LogitBias * len(entries))(*[_LogitBias(int(t), float(b)) for t, b in entries])
            keep.append(arr)
            if not _fits(opts, "n_logit_bias"):
                if entries:
                    raise UnsupportedError(Status.UNSUPPORTED, "logit_bias: the loaded library is older than it (0.4)")
                continue
            opts.logit_bias = ctypes.cast(arr, c_void_p)
            opts.n_logit_bias = len(entries)
            continue
        if name not in dict(_GenerateOptions._fields_) or name == "struct_size" or name.startswith("n_"):
            raise TypeError(f"unknown generate option {name!r}")
        if name == "ignore_eos":
            value = int(bool(value))
        if not _fits(opts, name):
            if name not in _GEN_DEFAULTS_V1 and value != getattr(opts, name):
                raise UnsupportedError(Status.UNSUPPORTED, f"{name}: the loaded library is older than this option")
            continue
        setattr(opts, name, value)
    return opts, keep


def _chat_messages(messages):
    keep = []
    arr = (_ChatMessage * len(messages))()
    for i, m in enumerate(messages):
        if isinstance(m, dict):
            role, content, reasoning = m["role"], m.get("content"), m.get("reasoning_content")
        else:
            role, content = m[0], m[1]
            reasoning = m[2] if len(m) > 2 else None
        fields = [x.encode("utf-8") if x is not None else None for x in (role, content, reasoning)]
        keep.append(fields)
        arr[i].role, arr[i].content, arr[i].reasoning_content = fields
    return arr, keep


def _chat_messages_tools(messages):
    """The messages' tool fields (tool_calls, tool_call_id, name) as ep_chat_options::message_tools_json
    wants them: one JSON object text per message (None without any), or None when no message has one."""
    texts = []
    for m in messages:
        fields = {k: m[k] for k in ("tool_calls", "tool_call_id", "name") if isinstance(m, dict) and m.get(k) is not None}
        texts.append(json.dumps(fields).encode("utf-8") if fields else None)
    return texts if any(t is not None for t in texts) else None


def _chat_options(template, thinking, add_generation_prompt, tools=None, tool_choice=None, messages=None):
    """The chat options; with ``tools`` (OpenAI's tools array, or its JSON text), ``tool_choice``
    ("auto", "none", "required") or messages carrying tool fields, the 0.4 tool fields. Returns
    (options, objects to keep alive)."""
    if _ep_chat_options_init is None:
        raise UnsupportedError(Status.UNSUPPORTED, "chat: the loaded library has no text API")
    o = _defaults(_ChatOptions, _ep_chat_options_init)
    o.chat_template = int(template)
    o.thinking = -1 if thinking is None else int(bool(thinking))
    o.add_generation_prompt = int(bool(add_generation_prompt))
    keep = []
    per_message = _chat_messages_tools(messages or [])
    if tools is not None or tool_choice is not None or per_message is not None:
        if not _fits(o, "tool_choice"):
            raise UnsupportedError(Status.UNSUPPORTED, "tools: the loaded library is older than the chat tool fields (0.4)")
        if tools is not None:
            text = (tools if isinstance(tools, str) else json.dumps(tools)).encode("utf-8")
            keep.append(text)
            o.tools_json = text
        if tool_choice is not None:
            choice = tool_choice.encode("utf-8")
            keep.append(choice)
            o.tool_choice = choice
        if per_message is not None:
            arr = (c_char_p * len(per_message))(*per_message)
            keep += [per_message, arr]
            o.message_tools_json = arr
    return o, keep


class Tokenizer(_Handle):
    """A tokenizer (``ep_tokenizer_open``): a .gguf, a tokenizer.json (or its folder), or a tiktoken
    file. :meth:`Model.tokenizer` opens a model's own. Needs the text API (:data:`HAVE_TEXT`)."""
    _close_fn = staticmethod(lambda h: _ep_tokenizer_close(h))

    def __init__(self, path=None, *, _model: Optional["Model"] = None):
        super().__init__()
        if _ep_tokenizer_open is None:
            raise UnsupportedError(Status.UNSUPPORTED, "ep_tokenizer_open: the loaded library has no text API")
        if _model is not None:
            _check(_ep_tokenizer_open_model(byref(self._h), _model._ptr()), "ep_tokenizer_open_model")
        else:
            _check(_ep_tokenizer_open(byref(self._h), _path(path)), "ep_tokenizer_open")

    def info(self) -> TokenizerInfo:
        p = _defaults(_TokenizerProperties, _ep_tokenizer_properties_init)
        _check(_ep_tokenizer_info(byref(p), self._ptr()), "ep_tokenizer_info")
        try:
            tmpl = ChatTemplate(p.chat_template)
        except ValueError:
            tmpl = p.chat_template
        return TokenizerInfo(p.vocab_size, p.bos_id, p.eos_id, p.end_of_turn_id, tmpl)

    def token_id(self, token: str) -> int:
        out = c_int32(0)
        _check(_ep_tokenizer_token_id(byref(out), self._ptr(), token.encode("utf-8")), "ep_tokenizer_token_id")
        return out.value

    def encode(self, text: str, *, add_special: bool = False, special_as_text: bool = False) -> List[int]:
        data = text.encode("utf-8")
        flags = (1 if add_special else 0) | (2 if special_as_text else 0)
        count = c_size_t(0)
        _check(_ep_tokenize(None, 0, byref(count), self._ptr(), data, len(data), flags), "ep_tokenize")
        while True:
            cap = count.value
            buf = (c_int32 * max(cap, 1))()
            _check(_ep_tokenize(buf, cap, byref(count), self._ptr(), data, len(data), flags), "ep_tokenize")
            if count.value <= cap:
                return list(buf[:count.value])

    def tool_call_prefix(self, name: Optional[str] = None, *, template: ChatTemplate = ChatTemplate.AUTO,
                         thinking: Optional[bool] = None) -> str:
        """The text that, appended to a generation prompt, begins the assistant's turn with a tool
        call in the template's format (of function ``name``, or any) (``ep_chat_tool_call_prefix``)."""
        if _ep_chat_tool_call_prefix is None:
            raise UnsupportedError(Status.UNSUPPORTED, "ep_chat_tool_call_prefix: the loaded library predates it (0.4)")
        opts, keep = _chat_options(template, thinking, True)
        n = name.encode("utf-8") if name else None
        length = c_size_t(0)
        _check(_ep_chat_tool_call_prefix(None, 0, byref(length), self._ptr(), n, byref(opts)), "ep_chat_tool_call_prefix")
        cap = length.value + 1
        buf = ctypes.create_string_buffer(cap)
        _check(_ep_chat_tool_call_prefix(buf, cap, byref(length), self._ptr(), n, byref(opts)), "ep_chat_tool_call_prefix")
        return buf.raw[:length.value].decode("utf-8", "replace")

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        arr = _int_array(list(ids))
        flags = 1 if skip_special else 0
        length = c_size_t(0)
        _check(_ep_detokenize(None, 0, byref(length), self._ptr(), arr, len(arr), flags), "ep_detokenize")
        while True:
            cap = length.value + 1
            buf = ctypes.create_string_buffer(cap)
            _check(_ep_detokenize(buf, cap, byref(length), self._ptr(), arr, len(arr), flags), "ep_detokenize")
            if length.value < cap:
                return buf.raw[:length.value].decode("utf-8", "replace")

    def render_chat(self, messages, *, template: ChatTemplate = ChatTemplate.AUTO, thinking: Optional[bool] = None,
                    add_generation_prompt: bool = True, tools=None, tool_choice: Optional[str] = None) -> str:
        """The conversation rendered with a chat template (``ep_chat_render``). ``tools``: OpenAI's
        tools array (or its JSON text), rendered in the template's tool format; ``tool_choice``:
        "auto", "none" or "required"; a message dict's ``tool_calls``, ``tool_call_id`` and ``name``
        are passed as its tool fields."""
        c_msgs, keep = _chat_messages(messages)
        opts, keep_opts = _chat_options(template, thinking, add_generation_prompt, tools, tool_choice, messages)
        length = c_size_t(0)
        _check(_ep_chat_render(None, 0, byref(length), self._ptr(), c_msgs, len(messages), byref(opts)),
               "ep_chat_render")
        while True:
            cap = length.value + 1
            buf = ctypes.create_string_buffer(cap)
            _check(_ep_chat_render(buf, cap, byref(length), self._ptr(), c_msgs, len(messages), byref(opts)),
                   "ep_chat_render")
            if length.value < cap:
                return buf.raw[:length.value].decode("utf-8", "replace")


class Grammar(_Handle):
    """A JSON grammar over a tokenizer's vocabulary (``ep_grammar``, grammar.h): any JSON object
    (:meth:`json_object`) or the values of a JSON Schema (:meth:`json_schema`). Sample with a
    :class:`GrammarState` per sequence (``grammar=`` generate option). Needs :data:`HAVE_GRAMMAR`."""
    _close_fn = staticmethod(lambda h: _ep_grammar_close(h))

    def __init__(self):
        super().__init__()
        if not HAVE_GRAMMAR:
            raise UnsupportedError(Status.UNSUPPORTED, "ep_grammar: the loaded library predates it (0.5)")

    @classmethod
    def json_object(cls, tokenizer: "Tokenizer") -> "Grammar":
        g = cls()
        _check(_ep_grammar_json_object(byref(g._h), tokenizer._ptr()), "ep_grammar_json_object")
        return g

    @classmethod
    def json_schema(cls, tokenizer: "Tokenizer", schema) -> "Grammar":
        """``schema``: a JSON Schema as a dict or as JSON text. A keyword outside the supported
        subset raises :class:`InvalidArgumentError` naming it and its JSON pointer."""
        g = cls()
        text = (schema if isinstance(schema, str) else json.dumps(schema)).encode("utf-8")
        _check(_ep_grammar_json_schema(byref(g._h), tokenizer._ptr(), text, len(text)), "ep_grammar_json_schema")
        return g

    def state(self) -> "GrammarState":
        """A state at the grammar's start, for one generated sequence."""
        return GrammarState(self)


class GrammarState(_Handle):
    """One sequence's position in a :class:`Grammar` (``ep_grammar_state``); pass it as the
    ``grammar`` option of :meth:`Session.sample`, :meth:`Session.generate`,
    :meth:`Session.generate_text` or :meth:`Session.generate_chat`: each drawn token is from its
    allowed set and advances it."""
    _close_fn = staticmethod(lambda h: _ep_grammar_state_close(h))

    def __init__(self, grammar: Grammar):
        super().__init__()
        _check(_ep_grammar_state_open(byref(self._h), grammar._ptr()), "ep_grammar_state_open")

    def accept(self, token: int) -> None:
        """Advances the state by ``token`` (:class:`InvalidArgumentError` naming it when not allowed)."""
        _check(_ep_grammar_state_accept(self._ptr(), int(token)), "ep_grammar_state_accept")

    @property
    def complete(self) -> bool:
        """True when the text so far is one complete value."""
        out = c_int32(0)
        _check(_ep_grammar_state_complete(byref(out), self._ptr()), "ep_grammar_state_complete")
        return bool(out.value)

    def allowed(self) -> List[int]:
        """The token ids allowed next, ascending."""
        words = c_size_t(0)
        _check(_ep_grammar_state_allowed(None, 0, byref(words), self._ptr()), "ep_grammar_state_allowed")
        buf = (ctypes.c_uint32 * max(words.value, 1))()
        _check(_ep_grammar_state_allowed(buf, words.value, byref(words), self._ptr()), "ep_grammar_state_allowed")
        return [w * 32 + b for w in range(words.value) if buf[w] for b in range(32) if buf[w] >> b & 1]


class Session(_Handle):
    """One sequence's decode state (``ep_session``). Closed with the model at the latest."""
    _close_fn = staticmethod(_ep_session_close)

    def __init__(self, model: Model, *, _fork_of: Optional["Session"] = None):
        super().__init__()
        if _fork_of is None:
            _check(_ep_session_open(byref(self._h), model._ptr()), "ep_session_open")
        else:
            _check(_ep_session_fork(byref(self._h), _fork_of._ptr()), "ep_session_fork")
        self.model = model  # keeps the model alive as long as the session
        model._sessions.add(self)

    def fork(self) -> "Session":
        """A copy of this session (``ep_session_fork``): the same tokens, decode state, last logits
        and sampler position. Appending to either leaves the other as it is, so a prompt's state
        can be kept and continued later without running the prompt again."""
        _require_batch("ep_session_fork")
        return Session(self.model, _fork_of=self)

    @property
    def tokens(self) -> List[int]:
        """The token ids the session holds, in order (``ep_session_tokens``)."""
        _require_batch("ep_session_tokens")
        count = c_size_t(0)
        _check(_ep_session_tokens(None, 0, byref(count), self._ptr()), "ep_session_tokens")
        while True:
            cap = count.value
            buf = (c_int32 * max(cap, 1))()
            _check(_ep_session_tokens(buf, cap, byref(count), self._ptr()), "ep_session_tokens")
            if count.value <= cap:
                return list(buf[:count.value])

    def append(self, tokens: Sequence[int]) -> None:
        """Appends token ids to the session without generating (``ep_sessions_append`` of this one
        session); :meth:`sample` then draws the token after them."""
        append_many([self], [tokens])

    def sample(self, **options) -> int:
        """The next token after the session's last one, drawn from its logits where they were
        computed (``ep_session_sample``); the token is not appended. ``options`` as
        :meth:`generate` (temperature, top_k, top_p, min_p, seed, repetition_penalty and
        repetition_window apply; the default is greedy). The session's draw counter advances, so
        sample-and-append with a seed repeats what :meth:`generate` gives for that seed."""
        _require_batch("ep_session_sample")
        opts, keep = _generate_options(options)
        out = c_int32(-1)
        _check(_ep_session_sample(byref(out), self._ptr(), byref(opts)), "ep_session_sample")
        del keep
        return int(out.value)

    @property
    def state_bytes(self) -> int:
        """The bytes of the model's device memory this session holds: its decode state as
        allocated, its last logits and its chat snapshot (``ep_session_state_bytes``)."""
        if _ep_session_state_bytes is None:
            raise UnsupportedError(Status.UNSUPPORTED, "ep_session_state_bytes: the loaded library predates it (0.4)")
        out = c_uint64(0)
        _check(_ep_session_state_bytes(byref(out), self._ptr()), "ep_session_state_bytes")
        return int(out.value)

    def set_draw_count(self, draw_count: int) -> None:
        """Sets the sampler's draw counter (``ep_session_set_draw_count``): the next :meth:`sample`
        makes draw ``draw_count`` of its seed's sequence (0: as a fresh session would)."""
        if _ep_session_set_draw_count is None:
            raise UnsupportedError(Status.UNSUPPORTED, "ep_session_set_draw_count: the loaded library predates it (0.4)")
        _check(_ep_session_set_draw_count(self._ptr(), int(draw_count)), "ep_session_set_draw_count")

    def sample_logprobs(self, top_logprobs: int = 0, **options):
        """:meth:`sample` with log-probabilities (``ep_session_sample_logprobs``): returns
        ``(token, logprob, [(token, logprob), ...])``, the alternatives the ``top_logprobs``
        (0 .. MAX_TOP_LOGPROBS) most likely tokens, most likely first. The log-probabilities are
        the model's own: log-softmax of the raw logits, before the repetition penalty, the logit
        bias, the temperature and the top_k / top_p / min_p cuts."""
        if _ep_session_sample_logprobs is None:
            raise UnsupportedError(Status.UNSUPPORTED, "ep_session_sample_logprobs: the loaded library predates it (0.4)",
                                   "ep_session_sample_logprobs")
        opts, keep = _generate_options(options)
        out = _TokenLogprobs()
        out.struct_size = ctypes.sizeof(_TokenLogprobs)
        _check(_ep_session_sample_logprobs(byref(out), self._ptr(), byref(opts), int(top_logprobs)),
               "ep_session_sample_logprobs")
        del keep
        top = [(int(out.top_tokens[i]), float(out.top_logprobs[i])) for i in range(out.n_top)]
        return int(out.token), float(out.logprob), top

    def reset(self) -> None:
        _check(_ep_session_reset(self._ptr()), "ep_session_reset")

    def __len__(self) -> int:
        n = c_uint64(0)
        _check(_ep_session_length(byref(n), self._ptr()), "ep_session_length")
        return int(n.value)

    def generate(self, prompt: Sequence[int] = (), *, on_token: Optional[Callable[[int, int], object]] = None,
                 **options) -> GenerateResult:
        """Appends ``prompt`` and generates tokens after it (``ep_generate``).

        ``options`` are the fields of ``ep_generate_options``: max_new_tokens (16), temperature (0:
        greedy), top_k, top_p, seed, stop_token, min_p, repetition_penalty, repetition_window,
        stop_tokens (a list), ignore_eos, logit_bias (a dict of token id to -100..100). ``on_token(token, index)`` is called as each token is
        produced; returning a true value (e.g. ``True``) stops the generation
        (``result.cancelled``). An exception raised by it also stops the generation and is
        re-raised here."""
        opts, keep = _generate_options(options)
        stats = _defaults(_GenerateStats, _ep_generate_stats_init)
        result = GenerateResult()
        errors = []

        def on_c_token(token, index, _payload):
            result.tokens.append(int(token))
            if on_token is None:
                return 0
            try:
                return 1 if on_token(int(token), int(index)) else 0
            except BaseException as e:  # noqa: BLE001 - re-raised after the call
                errors.append(e)
                return 1

        c_cb = _TOKEN_FN(on_c_token)
        arr = _int_array(list(prompt))
        st = _ep_generate(byref(stats), self._ptr(), arr if len(arr) else None, len(arr), byref(opts), c_cb, None)
        del keep
        if errors:
            raise errors[0]
        if st == Status.CANCELLED:
            result.cancelled = True
        else:
            _check(st, "ep_generate")
        result.stats = GenerateStats._from_c(stats)
        return result

    def _text_call(self, fn_name, call, on_text) -> TextResult:
        if not HAVE_TEXT:
            raise UnsupportedError(Status.UNSUPPORTED, f"{fn_name}: the loaded library has no text API", fn_name)
        stats = _defaults(_GenerateStats, _ep_generate_stats_init)
        pieces: List[str] = []
        errors = []

        def on_c_text(piece, length, _payload):
            text = ctypes.string_at(piece, length).decode("utf-8", "replace")
            pieces.append(text)
            if on_text is None:
                return 0
            try:
                return 1 if on_text(text) else 0
            except BaseException as e:  # noqa: BLE001 - re-raised after the call
                errors.append(e)
                return 1

        st = call(byref(stats), _TEXT_FN(on_c_text))
        if errors:
            raise errors[0]
        result = TextResult("".join(pieces), GenerateStats._from_c(stats), st == Status.CANCELLED)
        if not result.cancelled:
            _check(st, fn_name)
        return result

    def generate_text(self, tokenizer: "Tokenizer", prompt: str, *, on_text: Optional[Callable[[str], object]] = None,
                      **options) -> TextResult:
        """Appends a text prompt and generates text (``ep_generate_text``). ``on_text(piece)`` gets
        each piece of complete UTF-8; a true return value stops. ``options`` as :meth:`generate`,
        plus stop_strings (a list of str)."""
        opts, keep = _generate_options(options)
        p = prompt.encode("utf-8")
        return self._text_call("ep_generate_text", lambda stats, cb: _ep_generate_text(
            stats, self._ptr(), tokenizer._ptr(), p, byref(opts), cb, None), on_text)

    def generate_chat(self, tokenizer: "Tokenizer", messages, *, template: ChatTemplate = ChatTemplate.AUTO,
                      thinking: Optional[bool] = None, on_text: Optional[Callable[[str], object]] = None,
                      tools=None, tool_choice: Optional[str] = None, **options) -> TextResult:
        """Renders the conversation with its chat template and generates the assistant's answer
        (``ep_generate_chat``). ``messages``: dicts with role, content and optionally
        reasoning_content and the tool fields (or (role, content) pairs); ``tools`` and
        ``tool_choice`` as :meth:`Tokenizer.render_chat`. Keep using the same session for the next
        turn: the common prefix is reused."""
        opts, keep = _generate_options(options)
        c_msgs, keep_msgs = _chat_messages(messages)
        chat, keep_chat = _chat_options(template, thinking, True, tools, tool_choice, messages)
        return self._text_call("ep_generate_chat", lambda stats, cb: _ep_generate_chat(
            stats, self._ptr(), tokenizer._ptr(), c_msgs, len(messages), byref(chat), byref(opts), cb, None), on_text)

    def score(self, tokens: Sequence[int], top_k: int = 0):
        """Teacher-forced scoring (``ep_score``). ``top_k`` 0: a list of full logit rows (one list of
        vocab_size floats per token); otherwise a list of ``(ids, logits)`` pairs, k each, descending."""
        n = len(tokens)
        arr = _int_array(list(tokens))
        if top_k:
            ids = (c_int32 * (n * top_k))()
            logits = (c_float * (n * top_k))()
            _check(_ep_score(self._ptr(), arr, n, top_k, ids, logits), "ep_score")
            return [(list(ids[i * top_k:(i + 1) * top_k]), list(logits[i * top_k:(i + 1) * top_k])) for i in range(n)]
        vocab = self.model.info().vocab_size
        logits = (c_float * (n * vocab))()
        _check(_ep_score(self._ptr(), arr, n, 0, None, logits), "ep_score")
        return [list(logits[i * vocab:(i + 1) * vocab]) for i in range(n)]


def append_many(sessions: Sequence[Session], tokens: Sequence[Sequence[int]]) -> None:
    """Appends ``tokens[i]`` (at least one id each: a prefill chunk or one decode token) to
    ``sessions[i]`` for every i in one forward pass (``ep_sessions_append``): the routed experts
    of all of them are read once. The sessions must be distinct and of one model. Each session's
    logits are those of appending its tokens alone. After an error other than
    :class:`InvalidArgumentError`, every session of the call must be reset."""
    _require_batch("ep_sessions_append")
    if len(sessions) != len(tokens):
        raise ValueError(f"append_many: {len(sessions)} sessions but {len(tokens)} token lists")
    n = len(sessions)
    arrays = [_int_array(list(t)) for t in tokens]
    c_sessions = (c_void_p * n)(*[s._ptr().value for s in sessions])
    c_tokens = (POINTER(c_int32) * n)(*[ctypes.cast(a, POINTER(c_int32)) for a in arrays])
    c_counts = (c_size_t * n)(*[len(a) for a in arrays])
    _check(_ep_sessions_append(c_sessions, c_tokens, c_counts, n), "ep_sessions_append")


def sample_many(sessions: Sequence[Session], options=None, logprobs=None):
    """The next token of every session of ``sessions`` (distinct, of one model, each holding a
    token) in one call (``ep_sessions_sample``: one sampling launch and one download for all of
    them); each is what :meth:`Session.sample` (or :meth:`Session.sample_logprobs`) gives for it
    alone, and each draw counter and grammar state advances the same way. ``options``: None (greedy
    defaults), one dict of :meth:`Session.generate` options for every session, or a sequence of
    per-session dicts (None entries: the defaults). ``logprobs``: None returns the tokens; an int
    (the alternatives wanted, 0 .. MAX_TOP_LOGPROBS) or a sequence of ints or None per session
    returns ``(token, logprob, [(token, logprob), ...])`` per session (``(token, None, [])`` where
    the entry is None). A refused call (:class:`InvalidArgumentError` naming the session's index)
    changes no session."""
    if _ep_sessions_sample is None:
        raise UnsupportedError(Status.UNSUPPORTED, "ep_sessions_sample: the loaded library predates it (0.5)",
                               "ep_sessions_sample")
    n = len(sessions)
    if options is None or isinstance(options, dict):
        per_options = [options or {}] * n
    else:
        per_options = [o or {} for o in options]
        if len(per_options) != n:
            raise ValueError(f"sample_many: {n} sessions but {len(per_options)} option dicts")
    if logprobs is None:
        per_top = [None] * n
    elif isinstance(logprobs, int):
        per_top = [logprobs] * n
    else:
        per_top = list(logprobs)
        if len(per_top) != n:
            raise ValueError(f"sample_many: {n} sessions but {len(per_top)} logprobs entries")
    built = [_generate_options(o) for o in per_options]
    c_sessions = (c_void_p * n)(*[s._ptr().value for s in sessions])
    c_options = (POINTER(_GenerateOptions) * n)(*[ctypes.pointer(opts) for opts, _ in built])
    outs = [None] * n
    c_logprobs = None
    c_top = None
    if logprobs is not None:
        for i, top in enumerate(per_top):
            if top is not None:
                outs[i] = _TokenLogprobs()
                outs[i].struct_size = ctypes.sizeof(_TokenLogprobs)
        c_logprobs = (POINTER(_TokenLogprobs) * n)(*[ctypes.pointer(o) if o is not None else None for o in outs])
        c_top = (ctypes.c_uint32 * n)(*[int(t or 0) for t in per_top])
    tokens = (c_int32 * n)()
    _check(_ep_sessions_sample(tokens, c_logprobs, c_sessions, c_options, c_top, n), "ep_sessions_sample")
    del built
    if logprobs is None:
        return [int(t) for t in tokens]
    result = []
    for i in range(n):
        o = outs[i]
        if o is None:
            result.append((int(tokens[i]), None, []))
        else:
            result.append((int(o.token), float(o.logprob),
                           [(int(o.top_tokens[j]), float(o.top_logprobs[j])) for j in range(o.n_top)]))
    return result


def step_batch(sessions: Sequence[Session], **options) -> List[int]:
    """One decode step of a continuous batch: samples every session's next token with
    ``options`` (:func:`sample_many`: one call for all of them; :meth:`Session.sample` per
    session with a library before 0.6), appends all of them in one :func:`append_many` call, and
    returns them in the order of ``sessions``."""
    if HAVE_SAMPLE_MANY:
        next_tokens = sample_many(sessions, options)
    else:
        next_tokens = [s.sample(**options) for s in sessions]
    append_many(sessions, [[t] for t in next_tokens])
    return next_tokens


class TextStream(_Handle):
    """Incremental text of generated tokens for hosts that sample themselves
    (``ep_text_stream_*``): :meth:`push` each token and get the text it completes, as
    :meth:`Session.generate_text` would stream it (complete UTF-8 only, special tokens left out,
    text that may begin a stop string held back until it is known not to). :attr:`stopped` turns
    true when a stop string appears: the text before it was delivered, later tokens add nothing.
    :meth:`finish` delivers what was held back. One stream per generation; not thread-safe.

        with expertpack.TextStream(tokenizer, stop_strings=["\\n\\n"]) as ts:
            while not ts.stopped:
                token = session.sample()
                print(ts.push(token), end="")
                session.append([token])
            print(ts.finish())
    """
    _close_fn = staticmethod(lambda h: _ep_text_stream_close(h))

    def __init__(self, tokenizer: "Tokenizer", stop_strings: Sequence[str] = ()):
        super().__init__()
        _require_batch("ep_text_stream_open")
        strs = [x.encode("utf-8") for x in stop_strings]
        arr = (c_char_p * len(strs))(*strs)
        _check(_ep_text_stream_open(byref(self._h), tokenizer._ptr(), arr if strs else None, len(strs)),
               "ep_text_stream_open")
        self.tokenizer = tokenizer  # the C stream reads it: it must outlive the stream
        self.stopped = False
        """True once a stop string appeared in the text."""
        self.text = ""
        """Everything delivered so far."""

    def _step(self, fn_name, call) -> str:
        pieces: List[str] = []

        def on_c_text(piece, length, _payload):
            pieces.append(ctypes.string_at(piece, length).decode("utf-8", "replace"))
            return 0

        stopped = c_int32(0)
        _check(call(_TEXT_FN(on_c_text), byref(stopped)), fn_name)
        self.stopped = bool(stopped.value)
        text = "".join(pieces)
        self.text += text
        return text

    def push(self, token: int) -> str:
        """Adds one generated token; returns the text it completes (often "", at times several
        tokens' worth)."""
        return self._step("ep_text_stream_push",
                          lambda cb, stopped: _ep_text_stream_push(self._ptr(), int(token), cb, None, stopped))

    def finish(self) -> str:
        """Ends the text: returns what was held back (an incomplete UTF-8 sequence is dropped)."""
        return self._step("ep_text_stream_finish",
                          lambda cb, stopped: _ep_text_stream_finish(self._ptr(), cb, None, stopped))


class Pack(_Handle):
    """An open, validated Expert Pack (``ep_pack_open``), read-only."""
    _close_fn = staticmethod(_ep_pack_close)

    def __init__(self, path, validation: Validation = Validation.SAMPLED):
        super().__init__()
        opts = _defaults(_PackOpenOptions, _ep_pack_open_options_init)
        opts.validation = int(validation)
        _check(_ep_pack_open(byref(self._h), _path(path), byref(opts)), "ep_pack_open")

    def info(self) -> PackInfo:
        p = _out_struct(_PackProperties)
        _check(_ep_pack_info(byref(p), self._ptr()), "ep_pack_info")
        return PackInfo(p.format_version, p.num_layers, p.num_experts, p.num_roles, p.top_k, p.first_layer,
                        p.alignment, p.data_start, p.object_stride, p.max_object_bytes, p.file_size,
                        bytes(p.source_files_sha256), bytes(p.model_identity_sha256), bytes(p.config_sha256))

    def object(self, layer: int, expert: int) -> PackObject:
        o = _PackObjectInfo()
        _check(_ep_pack_object(byref(o), self._ptr(), layer, expert), "ep_pack_object")
        return PackObject(o.offset, o.bytes, list(o.role_offset), list(o.role_bytes), list(o.role_ggml_type))


# experts.h (0.3): the expert store alone, for engines with their own kernels (expertpack/experts.py)
from .experts import (HAVE_EXPERTS, Experts, ExpertsInfo, LayerLayout, Lease, Role, RoleLayout)  # noqa: E402

__all__ += ["Experts", "Lease", "Role", "ExpertsInfo", "RoleLayout", "LayerLayout", "HAVE_EXPERTS"]
