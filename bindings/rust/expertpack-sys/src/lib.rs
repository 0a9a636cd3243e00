//! Raw declarations of libexpertpack's C API, written by hand from `include/expertpack/*.h`
//! (expertpack.h, pack.h, store.h, model.h). Layouts are `#[repr(C)]` copies of the C structs;
//! the tests at the end pin their sizes and offsets to the values `tests/capi/layout_c11.c` pins
//! on the C side (x86-64 / aarch64 Linux, LP64).
//!
//! C enums pinned to 32 bits are `i32` aliases with constants, so an unknown value from a newer
//! library is representable. Use the safe `expertpack` crate unless you need the raw calls.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

/// `ep_status`: `EP_OK` (0) or a negative error code.
pub type ep_status = i32;
pub const EP_OK: ep_status = 0;
pub const EP_ERR_INVALID_ARGUMENT: ep_status = -1;
pub const EP_ERR_OUT_OF_MEMORY: ep_status = -2;
pub const EP_ERR_IO: ep_status = -3;
pub const EP_ERR_NOT_FOUND: ep_status = -4;
pub const EP_ERR_FORMAT: ep_status = -5;
pub const EP_ERR_CORRUPT: ep_status = -6;
pub const EP_ERR_UNSUPPORTED: ep_status = -7;
pub const EP_ERR_VERSION: ep_status = -8;
pub const EP_ERR_STRUCT_SIZE: ep_status = -9;
pub const EP_ERR_SHAPE: ep_status = -10;
pub const EP_ERR_CUDA: ep_status = -11;
pub const EP_ERR_NO_DEVICE: ep_status = -12;
pub const EP_ERR_BUDGET: ep_status = -13;
pub const EP_ERR_CANCELLED: ep_status = -14;
pub const EP_ERR_BUSY: ep_status = -15;
pub const EP_ERR_STALE: ep_status = -16;
pub const EP_ERR_INTERNAL: ep_status = -17;

pub const EP_VERSION_MAJOR: u32 = 0;
pub const EP_VERSION_MINOR: u32 = 1;
pub const EP_VERSION_PATCH: u32 = 0;
pub const EP_VERSION_NUMBER: u32 = EP_VERSION_MAJOR * 10000 + EP_VERSION_MINOR * 100 + EP_VERSION_PATCH;

/// `ep_log_level`.
pub type ep_log_level = i32;
pub const EP_LOG_TRACE: ep_log_level = 0;
pub const EP_LOG_DEBUG: ep_log_level = 1;
pub const EP_LOG_INFO: ep_log_level = 2;
pub const EP_LOG_WARN: ep_log_level = 3;
pub const EP_LOG_ERROR: ep_log_level = 4;
pub const EP_LOG_OFF: ep_log_level = 5;

/// `ep_feature` bits of `ep_build_features()`.
pub const EP_FEATURE_CUDA: u32 = 1;
pub const EP_FEATURE_IO_URING: u32 = 2;

/// `ep_device_kind`.
pub type ep_device_kind = i32;
pub const EP_DEVICE_AUTO: ep_device_kind = 0;
pub const EP_DEVICE_CPU: ep_device_kind = 1;
pub const EP_DEVICE_CUDA: ep_device_kind = 2;

/// `ep_pack_validation`.
pub type ep_pack_validation = i32;
pub const EP_PACK_VALIDATE_STRUCTURE: ep_pack_validation = 0;
pub const EP_PACK_VALIDATE_SAMPLED: ep_pack_validation = 1;
pub const EP_PACK_VALIDATE_FULL: ep_pack_validation = 2;

pub type ep_log_fn = Option<unsafe extern "C" fn(level: ep_log_level, message: *const c_char, payload: *mut c_void)>;
pub type ep_model_progress_fn = Option<unsafe extern "C" fn(done_bytes: u64, total_bytes: u64, payload: *mut c_void)>;
pub type ep_token_fn = Option<unsafe extern "C" fn(token: i32, index: u32, payload: *mut c_void) -> c_int>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_log_options {
    pub struct_size: usize,
    pub min_level: ep_log_level,
    pub callback: ep_log_fn,
    pub payload: *mut c_void,
}

/// Opaque `ep_pack`.
#[repr(C)]
pub struct ep_pack {
    _private: [u8; 0],
}
/// Opaque `ep_model`.
#[repr(C)]
pub struct ep_model {
    _private: [u8; 0],
}
/// Opaque `ep_session`.
#[repr(C)]
pub struct ep_session {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_pack_open_options {
    pub struct_size: usize,
    pub validation: ep_pack_validation,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_pack_properties {
    pub struct_size: usize,
    pub format_version: u32,
    pub num_layers: u32,
    pub num_experts: u32,
    pub num_roles: u32,
    pub top_k: u32,
    pub first_layer: u32,
    pub alignment: u64,
    pub data_start: u64,
    pub object_stride: u64,
    pub max_object_bytes: u64,
    pub file_size: u64,
    pub source_files_sha256: [u8; 32],
    pub model_identity_sha256: [u8; 32],
    pub config_sha256: [u8; 32],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ep_pack_object_info {
    pub offset: u64,
    pub bytes: u64,
    pub role_offset: [u64; 3],
    pub role_bytes: [u64; 3],
    pub role_ggml_type: [u32; 3],
    pub reserved: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ep_store_stats {
    pub struct_size: usize,
    pub acquires: u64,
    pub pack_reads: u64,
    pub pack_read_bytes: u64,
    pub pack_read_ns: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub resident_experts: u64,
    pub resident_bytes: u64,
    pub h2d_bytes: u64,
    pub io_errors: u64,
    pub fallback_count: u64,
    pub cache_slots: u64,
    pub slot_bytes: u64,
    // Appended after the first version (see EP_STORE_STATS_V1_SIZE):
    pub host_hits: u64,
    pub host_misses: u64,
    pub demotions: u64,
    pub host_resident_bytes: u64,
    pub host_slots: u64,
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
}

/// The first published size of `ep_store_stats` (up to `slot_bytes`): what a library from before
/// the appended counters accepts.
pub const EP_STORE_STATS_V1_SIZE: usize = 120;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_model_options {
    pub struct_size: usize,
    pub device: ep_device_kind,
    pub device_index: i32,
    pub cache_budget_bytes: u64,
    pub staging_slots: u32,
    pub queue_depth: u32,
    pub read_splits: u32,
    pub direct_io: i32,
    pub pack_dir: *const c_char,
    pub pack_build: i32,
    pub resident_experts: i32,
    pub progress: ep_model_progress_fn,
    pub progress_payload: *mut c_void,
    pub cpu_threads: i32,
    pub host_cache_bytes: u64,
    pub overlap_reads: i32,
    pub prefetch: i32,
    pub cache_policy: *const c_char,
    // Appended after 0.2.0 (see EP_MODEL_OPTIONS_V2_SIZE):
    pub no_pack: i32,
    // Appended after 0.4.0 (see EP_MODEL_OPTIONS_V3_SIZE):
    pub kv_budget_bytes: u64,
}

/// The size of `ep_model_options` in 0.2.0 (up to `cache_policy`): what a library from before
/// `no_pack` accepts.
pub const EP_MODEL_OPTIONS_V2_SIZE: usize = 104;

/// The size of `ep_model_options` in 0.3.0 and 0.4.0 (up to `no_pack`, padded): what a library from before
/// `kv_budget_bytes` accepts.
pub const EP_MODEL_OPTIONS_V3_SIZE: usize = 112;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_model_properties {
    pub struct_size: usize,
    pub architecture: [c_char; 32],
    pub vocab_size: u32,
    pub num_layers: u32,
    pub hidden_size: u32,
    pub num_experts: u32,
    pub experts_per_token: u32,
    pub weight_bytes: u64,
    pub device: i32,
    pub device_index: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_generate_options {
    pub struct_size: usize,
    pub max_new_tokens: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u64,
    pub stop_token: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ep_generate_stats {
    pub struct_size: usize,
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

extern "C" {
    // expertpack.h
    pub fn ep_status_str(status: ep_status) -> *const c_char;
    pub fn ep_last_error() -> *const c_char;
    pub fn ep_version_number() -> u32;
    pub fn ep_version_string() -> *const c_char;
    pub fn ep_log_options_init(options: *mut ep_log_options);
    pub fn ep_log_configure(options: *const ep_log_options) -> ep_status;
    pub fn ep_set_log_callback(callback: ep_log_fn, payload: *mut c_void);
    pub fn ep_set_log_level(min_level: ep_log_level) -> ep_status;
    pub fn ep_build_features() -> u32;
    pub fn ep_cuda_device_count(out_count: *mut i32) -> ep_status;

    // pack.h
    pub fn ep_pack_open_options_init(options: *mut ep_pack_open_options);
    pub fn ep_pack_open(out_pack: *mut *mut ep_pack, path: *const c_char, options: *const ep_pack_open_options)
        -> ep_status;
    pub fn ep_pack_properties_init(properties: *mut ep_pack_properties);
    pub fn ep_pack_info(out_properties: *mut ep_pack_properties, pack: *const ep_pack) -> ep_status;
    pub fn ep_pack_object(out_object: *mut ep_pack_object_info, pack: *const ep_pack, layer: u32, expert: u32)
        -> ep_status;
    pub fn ep_pack_close(pack: *mut ep_pack);

    // store.h
    pub fn ep_store_stats_init(stats: *mut ep_store_stats);
    pub fn ep_store_stats_read_file(out_stats: *mut ep_store_stats, path: *const c_char) -> ep_status;

    // model.h
    pub fn ep_model_options_init(options: *mut ep_model_options);
    pub fn ep_model_open(out_model: *mut *mut ep_model, path: *const c_char, options: *const ep_model_options)
        -> ep_status;
    pub fn ep_model_close(model: *mut ep_model);
    pub fn ep_model_pack_path(model: *const ep_model) -> *const c_char;
    pub fn ep_model_store_stats(out_stats: *mut ep_store_stats, model: *const ep_model) -> ep_status;
    pub fn ep_model_properties_init(properties: *mut ep_model_properties);
    pub fn ep_model_info(out_properties: *mut ep_model_properties, model: *const ep_model) -> ep_status;
    pub fn ep_session_open(out_session: *mut *mut ep_session, model: *mut ep_model) -> ep_status;
    pub fn ep_session_close(session: *mut ep_session);
    pub fn ep_session_reset(session: *mut ep_session) -> ep_status;
    pub fn ep_session_length(out_length: *mut u64, session: *const ep_session) -> ep_status;
    pub fn ep_generate_options_init(options: *mut ep_generate_options);
    pub fn ep_generate_stats_init(stats: *mut ep_generate_stats);
    pub fn ep_generate(out_stats: *mut ep_generate_stats, session: *mut ep_session, prompt: *const i32,
                       n_prompt: usize, options: *const ep_generate_options, callback: ep_token_fn,
                       payload: *mut c_void) -> ep_status;
    pub fn ep_score(session: *mut ep_session, tokens: *const i32, n_tokens: usize, top_k: u32, out_ids: *mut i32,
                    out_logits: *mut f32) -> ep_status;
}

// model.h, 0.2 (feature "batch": a library built before 0.2 lacks these symbols)
#[cfg(feature = "batch")]
extern "C" {
    pub fn ep_sessions_append(sessions: *const *mut ep_session, tokens: *const *const i32, n_tokens: *const usize,
                              n_sessions: usize) -> ep_status;
    pub fn ep_session_sample(out_token: *mut i32, session: *mut ep_session, options: *const ep_generate_options)
        -> ep_status;
    pub fn ep_session_fork(out_session: *mut *mut ep_session, session: *const ep_session) -> ep_status;
    pub fn ep_session_tokens(out_tokens: *mut i32, capacity: usize, out_count: *mut usize, session: *const ep_session)
        -> ep_status;
}

#[cfg(all(test, target_pointer_width = "64"))]
mod layout {
    use super::*;
    use std::mem::size_of;

    macro_rules! offset_of {
        ($t:ty, $f:ident) => {{
            let v = std::mem::MaybeUninit::<$t>::uninit();
            let base = v.as_ptr();
            // SAFETY: only the address of the field is taken, nothing is read.
            unsafe { std::ptr::addr_of!((*base).$f) as usize - base as usize }
        }};
    }

    #[test]
    fn sizes_and_offsets_match_the_c_headers() {
        assert_eq!(size_of::<ep_log_options>(), 32);
        assert_eq!(size_of::<ep_pack_open_options>(), 16);
        assert_eq!(size_of::<ep_pack_properties>(), 168);
        assert_eq!(offset_of!(ep_pack_properties, alignment), 32);
        assert_eq!(offset_of!(ep_pack_properties, source_files_sha256), 72);
        assert_eq!(size_of::<ep_pack_object_info>(), 80);
        assert_eq!(size_of::<ep_store_stats>(), 176);
        assert_eq!(offset_of!(ep_store_stats, host_hits), EP_STORE_STATS_V1_SIZE);
        assert_eq!(offset_of!(ep_store_stats, prefetch_used), 168);
        assert_eq!(size_of::<ep_model_options>(), 120);
        assert_eq!(offset_of!(ep_model_options, kv_budget_bytes), EP_MODEL_OPTIONS_V3_SIZE);
        assert_eq!(offset_of!(ep_model_options, no_pack), EP_MODEL_OPTIONS_V2_SIZE);
        assert_eq!(offset_of!(ep_model_options, pack_dir), 40);
        assert_eq!(offset_of!(ep_model_options, progress), 56);
        assert_eq!(offset_of!(ep_model_options, cpu_threads), 72);
        assert_eq!(offset_of!(ep_model_options, host_cache_bytes), 80);
        assert_eq!(offset_of!(ep_model_options, overlap_reads), 88);
        assert_eq!(offset_of!(ep_model_options, prefetch), 92);
        assert_eq!(offset_of!(ep_model_options, cache_policy), 96);
        assert_eq!(size_of::<ep_model_properties>(), 80);
        assert_eq!(offset_of!(ep_model_properties, weight_bytes), 64);
        assert_eq!(offset_of!(ep_model_properties, device), 72);
        assert_eq!(offset_of!(ep_model_properties, device_index), 76);
        assert_eq!(size_of::<ep_generate_options>(), 40);
        assert_eq!(offset_of!(ep_generate_options, seed), 24);
        assert_eq!(offset_of!(ep_generate_options, stop_token), 32);
        assert_eq!(size_of::<ep_generate_stats>(), 32);
    }
}

// ---------------------------------------------------------------------------------------------
// text.h (feature "text": a library built before the text API lacks these symbols)
// ---------------------------------------------------------------------------------------------

/// Opaque `ep_tokenizer`.
#[repr(C)]
pub struct ep_tokenizer {
    _private: [u8; 0],
}

/// `ep_chat_template`.
pub type ep_chat_template = i32;
pub const EP_CHAT_TEMPLATE_AUTO: ep_chat_template = 0;
pub const EP_CHAT_TEMPLATE_DEEPSEEK_V4: ep_chat_template = 1;
pub const EP_CHAT_TEMPLATE_KIMI_K3: ep_chat_template = 2;
pub const EP_CHAT_TEMPLATE_NONE: ep_chat_template = 3;

/// `ep_stop_reason`.
pub type ep_stop_reason = i32;
pub const EP_STOP_LENGTH: ep_stop_reason = 0;
pub const EP_STOP_TOKEN: ep_stop_reason = 1;
pub const EP_STOP_STRING: ep_stop_reason = 2;
pub const EP_STOP_CANCELLED: ep_stop_reason = 3;

pub const EP_TOKENIZE_ADD_SPECIAL: u32 = 1;
pub const EP_TOKENIZE_SPECIAL_AS_TEXT: u32 = 2;
pub const EP_DETOKENIZE_SKIP_SPECIAL: u32 = 1;

/// `ep_generate_options` with every field of the current header (the fields after
/// `stop_token` were appended; see [`EP_GENERATE_OPTIONS_V1_SIZE`]). Its prefix is
/// layout-compatible with [`ep_generate_options`]: pass a pointer cast.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_generate_options_v2 {
    pub struct_size: usize,
    pub max_new_tokens: u32,
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u64,
    pub stop_token: i32,
    // Appended after the first version (min_p sits in ep_generate_options's tail padding):
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub repetition_window: u32,
    pub stop_tokens: *const i32,
    pub n_stop_tokens: usize,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: usize,
    pub ignore_eos: i32,
    // 0.4:
    pub logit_bias: *const ep_logit_bias,
    pub n_logit_bias: usize,
}

/// One entry of `ep_generate_options::logit_bias` (0.4).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ep_logit_bias {
    pub token: i32,
    pub bias: f32,
}

/// The most alternatives `ep_session_sample_logprobs` reports.
pub const EP_MAX_TOP_LOGPROBS: usize = 20;

/// A sampled token with its log-probability and the most likely alternatives (0.4).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_token_logprobs {
    pub struct_size: usize,
    pub token: i32,
    pub logprob: f32,
    pub n_top: u32,
    pub top_tokens: [i32; EP_MAX_TOP_LOGPROBS],
    pub top_logprobs: [f32; EP_MAX_TOP_LOGPROBS],
}

// model.h, 0.4 (feature "logprobs": a library built before 0.4 lacks these symbols)
#[cfg(feature = "logprobs")]
extern "C" {
    pub fn ep_token_logprobs_init(logprobs: *mut ep_token_logprobs);
    pub fn ep_session_sample_logprobs(out_logprobs: *mut ep_token_logprobs, session: *mut ep_session,
                                      options: *const ep_generate_options, top_logprobs: u32) -> ep_status;
}

// model.h, 0.6 (feature "sample_many": a library built before 0.6 lacks it)
#[cfg(feature = "sample_many")]
extern "C" {
    pub fn ep_sessions_sample(out_tokens: *mut i32, out_logprobs: *const *mut ep_token_logprobs,
                              sessions: *const *mut ep_session, options: *const *const ep_generate_options,
                              top_logprobs: *const u32, n_sessions: usize) -> ep_status;
}

/// `ep_generate_stats` with every field of the current header.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ep_generate_stats_v2 {
    pub v1: ep_generate_stats,
    pub stop_reason: ep_stop_reason,
    pub reused_tokens: u32,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    pub session_tokens: u64,
    pub prefill_expert_bytes: u64,
    pub decode_expert_bytes: u64,
}

/// The first published sizes (what a library from before the appended fields accepts).
pub const EP_GENERATE_OPTIONS_V1_SIZE: usize = std::mem::size_of::<ep_generate_options>();
pub const EP_GENERATE_STATS_V1_SIZE: usize = std::mem::size_of::<ep_generate_stats>();

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ep_tokenizer_properties {
    pub struct_size: usize,
    pub vocab_size: u32,
    pub bos_id: i32,
    pub eos_id: i32,
    pub end_of_turn_id: i32,
    pub chat_template: ep_chat_template,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_chat_message {
    pub role: *const c_char,
    pub content: *const c_char,
    pub reasoning_content: *const c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ep_chat_options {
    pub struct_size: usize,
    pub chat_template: ep_chat_template,
    pub thinking: i32,
    pub add_generation_prompt: i32,
}

pub type ep_text_fn = Option<unsafe extern "C" fn(piece: *const c_char, length: usize, payload: *mut c_void) -> c_int>;

#[cfg(feature = "text")]
extern "C" {
    pub fn ep_tokenizer_open(out_tokenizer: *mut *mut ep_tokenizer, path: *const c_char) -> ep_status;
    pub fn ep_tokenizer_open_model(out_tokenizer: *mut *mut ep_tokenizer, model: *const ep_model) -> ep_status;
    pub fn ep_tokenizer_close(tokenizer: *mut ep_tokenizer);
    pub fn ep_tokenizer_properties_init(properties: *mut ep_tokenizer_properties);
    pub fn ep_tokenizer_info(out_properties: *mut ep_tokenizer_properties, tokenizer: *const ep_tokenizer)
        -> ep_status;
    pub fn ep_tokenizer_token_id(out_id: *mut i32, tokenizer: *const ep_tokenizer, token: *const c_char)
        -> ep_status;
    pub fn ep_tokenize(out_ids: *mut i32, capacity: usize, out_count: *mut usize, tokenizer: *const ep_tokenizer,
                       text: *const c_char, length: usize, flags: u32) -> ep_status;
    pub fn ep_detokenize(out_text: *mut c_char, capacity: usize, out_length: *mut usize,
                         tokenizer: *const ep_tokenizer, ids: *const i32, n_ids: usize, flags: u32) -> ep_status;
    pub fn ep_chat_options_init(options: *mut ep_chat_options);
    pub fn ep_chat_render(out_text: *mut c_char, capacity: usize, out_length: *mut usize,
                          tokenizer: *const ep_tokenizer, messages: *const ep_chat_message, n_messages: usize,
                          options: *const ep_chat_options) -> ep_status;
    pub fn ep_generate_text(out_stats: *mut ep_generate_stats, session: *mut ep_session,
                            tokenizer: *const ep_tokenizer, prompt: *const c_char,
                            options: *const ep_generate_options, callback: ep_text_fn, payload: *mut c_void)
        -> ep_status;
    pub fn ep_generate_chat(out_stats: *mut ep_generate_stats, session: *mut ep_session,
                            tokenizer: *const ep_tokenizer, messages: *const ep_chat_message, n_messages: usize,
                            chat_options: *const ep_chat_options, options: *const ep_generate_options,
                            callback: ep_text_fn, payload: *mut c_void) -> ep_status;
}

/// Opaque `ep_text_stream` (text.h, 0.2).
#[repr(C)]
pub struct ep_text_stream {
    _private: [u8; 0],
}

#[cfg(all(feature = "text", feature = "batch"))]
extern "C" {
    pub fn ep_text_stream_open(out_stream: *mut *mut ep_text_stream, tokenizer: *const ep_tokenizer,
                               stop_strings: *const *const c_char, n_stop_strings: usize) -> ep_status;
    pub fn ep_text_stream_push(stream: *mut ep_text_stream, token: i32, callback: ep_text_fn, payload: *mut c_void,
                               out_stopped: *mut i32) -> ep_status;
    pub fn ep_text_stream_finish(stream: *mut ep_text_stream, callback: ep_text_fn, payload: *mut c_void,
                                 out_stopped: *mut i32) -> ep_status;
    pub fn ep_text_stream_close(stream: *mut ep_text_stream);
}

#[cfg(all(test, target_pointer_width = "64"))]
mod layout_v2 {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn appended_structs_match_the_c_headers() {
        assert_eq!(size_of::<ep_generate_options_v2>(), 104);
        assert_eq!(std::mem::offset_of!(ep_generate_options_v2, logit_bias), 88);
        assert_eq!(size_of::<ep_logit_bias>(), 8);
        assert_eq!(size_of::<ep_token_logprobs>(), 184);
        assert_eq!(std::mem::offset_of!(ep_token_logprobs, top_logprobs), 100);
        let v = std::mem::MaybeUninit::<ep_generate_options_v2>::uninit();
        let base = v.as_ptr();
        // SAFETY: only field addresses are taken.
        let (min_p, stop_tokens, ignore_eos) = unsafe {
            (std::ptr::addr_of!((*base).min_p) as usize - base as usize,
             std::ptr::addr_of!((*base).stop_tokens) as usize - base as usize,
             std::ptr::addr_of!((*base).ignore_eos) as usize - base as usize)
        };
        assert_eq!((min_p, stop_tokens, ignore_eos), (36, 48, 80));
        assert_eq!(size_of::<ep_generate_stats_v2>(), 80);
        assert_eq!(std::mem::offset_of!(ep_generate_stats_v2, prefill_expert_bytes), 64);
        assert_eq!(size_of::<ep_tokenizer_properties>(), 32);
        assert_eq!(size_of::<ep_chat_message>(), 24);
        assert_eq!(size_of::<ep_chat_options>(), 24);
    }
}
