/* Pins the layout of every public struct and the width of every public enum: a change here
   breaks FFI users (Rust, Go, C#, Python ctypes) and must be a deliberate ABI decision.
   Sizes and offsets are those of LP64 (Linux x86-64, aarch64). */
#include <expertpack/expertpack.h>

#include <stddef.h>

_Static_assert(sizeof(ep_status) == 4, "ep_status is 32 bits");
_Static_assert(sizeof(ep_log_level) == 4, "ep_log_level is 32 bits");
_Static_assert(sizeof(ep_feature) == 4, "ep_feature is 32 bits");

_Static_assert(offsetof(ep_log_options, struct_size) == 0, "struct_size first");
_Static_assert(offsetof(ep_log_options, min_level) == 8, "ep_log_options.min_level");
_Static_assert(offsetof(ep_log_options, callback) == 16, "ep_log_options.callback");
_Static_assert(offsetof(ep_log_options, payload) == 24, "ep_log_options.payload");
_Static_assert(sizeof(ep_log_options) == 32, "ep_log_options size");

_Static_assert(EP_OK == 0 && EP_ERR_INVALID_ARGUMENT == -1 && EP_ERR_INTERNAL == -17,
               "status numbers are stable");

_Static_assert(sizeof(ep_pack_validation) == 4, "ep_pack_validation is 32 bits");
_Static_assert(offsetof(ep_pack_open_options, validation) == 8, "ep_pack_open_options.validation");
_Static_assert(sizeof(ep_pack_open_options) == 16, "ep_pack_open_options size");
_Static_assert(offsetof(ep_pack_properties, format_version) == 8, "ep_pack_properties.format_version");
_Static_assert(offsetof(ep_pack_properties, alignment) == 32, "ep_pack_properties.alignment");
_Static_assert(offsetof(ep_pack_properties, source_files_sha256) == 72, "ep_pack_properties.source_files_sha256");
_Static_assert(sizeof(ep_pack_properties) == 168, "ep_pack_properties size");
_Static_assert(offsetof(ep_pack_object_info, role_offset) == 16, "ep_pack_object_info.role_offset");
_Static_assert(offsetof(ep_pack_object_info, role_ggml_type) == 64, "ep_pack_object_info.role_ggml_type");
_Static_assert(sizeof(ep_pack_object_info) == 80, "ep_pack_object_info size");

_Static_assert(sizeof(ep_device_kind) == 4, "ep_device_kind is 32 bits");
_Static_assert(offsetof(ep_model_options, device) == 8, "ep_model_options.device");
_Static_assert(offsetof(ep_model_options, cache_budget_bytes) == 16, "ep_model_options.cache_budget_bytes");
_Static_assert(offsetof(ep_model_options, direct_io) == 36, "ep_model_options.direct_io");
_Static_assert(offsetof(ep_model_options, pack_dir) == 40, "ep_model_options.pack_dir (first appended field)");
_Static_assert(offsetof(ep_model_options, pack_build) == 48, "ep_model_options.pack_build");
_Static_assert(offsetof(ep_model_options, resident_experts) == 52, "ep_model_options.resident_experts");
_Static_assert(offsetof(ep_model_options, progress) == 56, "ep_model_options.progress");
_Static_assert(offsetof(ep_model_options, cpu_threads) == 72, "ep_model_options.cpu_threads");
_Static_assert(offsetof(ep_model_options, host_cache_bytes) == 80, "ep_model_options.host_cache_bytes");
_Static_assert(offsetof(ep_model_options, overlap_reads) == 88, "ep_model_options.overlap_reads");
_Static_assert(offsetof(ep_model_options, prefetch) == 92, "ep_model_options.prefetch");
_Static_assert(offsetof(ep_model_options, cache_policy) == 96, "ep_model_options.cache_policy");
_Static_assert(offsetof(ep_model_options, no_pack) == 104, "ep_model_options.no_pack");
_Static_assert(offsetof(ep_model_options, kv_budget_bytes) == 112, "ep_model_options.kv_budget_bytes");
_Static_assert(offsetof(ep_model_options, devices) == 120, "ep_model_options.devices");
_Static_assert(sizeof(ep_model_options) == 128, "ep_model_options size");
_Static_assert(offsetof(ep_model_properties, architecture) == 8, "ep_model_properties.architecture");
_Static_assert(offsetof(ep_model_properties, vocab_size) == 40, "ep_model_properties.vocab_size");
_Static_assert(offsetof(ep_model_properties, weight_bytes) == 64, "ep_model_properties.weight_bytes");
_Static_assert(offsetof(ep_model_properties, device) == 72, "ep_model_properties.device");
_Static_assert(offsetof(ep_model_properties, device_index) == 76, "ep_model_properties.device_index");
_Static_assert(offsetof(ep_model_properties, context_length) == 80, "ep_model_properties.context_length");
_Static_assert(offsetof(ep_model_properties, kv_budget_bytes) == 88, "ep_model_properties.kv_budget_bytes");
_Static_assert(sizeof(ep_model_properties) == 96, "ep_model_properties size");
_Static_assert(offsetof(ep_generate_options, max_new_tokens) == 8, "ep_generate_options.max_new_tokens");
_Static_assert(offsetof(ep_generate_options, seed) == 24, "ep_generate_options.seed");
_Static_assert(offsetof(ep_generate_options, stop_token) == 32, "ep_generate_options.stop_token");
_Static_assert(offsetof(ep_generate_options, min_p) == 36, "ep_generate_options.min_p (first appended field, in v1's padding)");
_Static_assert(offsetof(ep_generate_options, repetition_window) == 44, "ep_generate_options.repetition_window");
_Static_assert(offsetof(ep_generate_options, stop_tokens) == 48, "ep_generate_options.stop_tokens");
_Static_assert(offsetof(ep_generate_options, stop_strings) == 64, "ep_generate_options.stop_strings");
_Static_assert(offsetof(ep_generate_options, ignore_eos) == 80, "ep_generate_options.ignore_eos");
_Static_assert(offsetof(ep_generate_options, logit_bias) == 88, "ep_generate_options.logit_bias");
_Static_assert(offsetof(ep_generate_options, n_logit_bias) == 96, "ep_generate_options.n_logit_bias");
_Static_assert(offsetof(ep_generate_options, grammar) == 104, "ep_generate_options.grammar (0.5)");
_Static_assert(sizeof(ep_generate_options) == 112, "ep_generate_options size");
_Static_assert(sizeof(ep_logit_bias) == 8, "ep_logit_bias size");
_Static_assert(offsetof(ep_token_logprobs, token) == 8, "ep_token_logprobs.token");
_Static_assert(offsetof(ep_token_logprobs, n_top) == 16, "ep_token_logprobs.n_top");
_Static_assert(offsetof(ep_token_logprobs, top_tokens) == 20, "ep_token_logprobs.top_tokens");
_Static_assert(offsetof(ep_token_logprobs, top_logprobs) == 100, "ep_token_logprobs.top_logprobs");
_Static_assert(sizeof(ep_token_logprobs) == 184, "ep_token_logprobs size");
_Static_assert(offsetof(ep_generate_stats, prefill_seconds) == 16, "ep_generate_stats.prefill_seconds");
_Static_assert(offsetof(ep_generate_stats, stop_reason) == 32, "ep_generate_stats.stop_reason (first appended field)");
_Static_assert(offsetof(ep_generate_stats, prefill_tokens_per_second) == 40, "ep_generate_stats.prefill_tokens_per_second");
_Static_assert(offsetof(ep_generate_stats, session_tokens) == 56, "ep_generate_stats.session_tokens");
_Static_assert(offsetof(ep_generate_stats, prefill_expert_bytes) == 64, "ep_generate_stats.prefill_expert_bytes");
_Static_assert(offsetof(ep_generate_stats, decode_expert_bytes) == 72, "ep_generate_stats.decode_expert_bytes");
_Static_assert(offsetof(ep_generate_stats, decode_read_busy_seconds) == 80, "ep_generate_stats.decode_read_busy_seconds");
_Static_assert(offsetof(ep_generate_stats, decode_store_idle_seconds) == 104, "ep_generate_stats.decode_store_idle_seconds");
_Static_assert(sizeof(ep_generate_stats) == 112, "ep_generate_stats size");
_Static_assert(sizeof(ep_stop_reason) == 4, "ep_stop_reason is 32 bits");
_Static_assert(sizeof(ep_chat_template) == 4, "ep_chat_template is 32 bits");
_Static_assert(offsetof(ep_tokenizer_properties, vocab_size) == 8, "ep_tokenizer_properties.vocab_size");
_Static_assert(offsetof(ep_tokenizer_properties, chat_template) == 24, "ep_tokenizer_properties.chat_template");
_Static_assert(sizeof(ep_tokenizer_properties) == 32, "ep_tokenizer_properties size");
_Static_assert(offsetof(ep_chat_message, content) == 8, "ep_chat_message.content");
_Static_assert(sizeof(ep_chat_message) == 24, "ep_chat_message size");
_Static_assert(offsetof(ep_chat_options, thinking) == 12, "ep_chat_options.thinking");
_Static_assert(offsetof(ep_chat_options, tools_json) == 24, "ep_chat_options.tools_json (appended in 0.4)");
_Static_assert(offsetof(ep_chat_options, message_tools_json) == 32, "ep_chat_options.message_tools_json");
_Static_assert(offsetof(ep_chat_options, tool_choice) == 40, "ep_chat_options.tool_choice");
_Static_assert(sizeof(ep_chat_options) == 48, "ep_chat_options size");
_Static_assert(offsetof(ep_store_stats, acquires) == 8, "ep_store_stats.acquires");
_Static_assert(offsetof(ep_store_stats, slot_bytes) == 112, "ep_store_stats.slot_bytes");
_Static_assert(offsetof(ep_store_stats, host_hits) == 120, "ep_store_stats.host_hits (first appended field)");
_Static_assert(offsetof(ep_store_stats, prefetch_used) == 168, "ep_store_stats.prefetch_used");
_Static_assert(offsetof(ep_store_stats, pack_read_full_ns) == 176, "ep_store_stats.pack_read_full_ns (second appended block)");
_Static_assert(offsetof(ep_store_stats, store_disk_idle_ns) == 200, "ep_store_stats.store_disk_idle_ns");
_Static_assert(sizeof(ep_store_stats) == 208, "ep_store_stats size");

/* experts.h */
_Static_assert(sizeof(ep_expert_role) == 4, "ep_expert_role is 32 bits");
_Static_assert(offsetof(ep_experts_options, device) == 8, "ep_experts_options.device");
_Static_assert(offsetof(ep_experts_options, cache_budget_bytes) == 16, "ep_experts_options.cache_budget_bytes");
_Static_assert(offsetof(ep_experts_options, direct_io) == 36, "ep_experts_options.direct_io");
_Static_assert(offsetof(ep_experts_options, pack_dir) == 40, "ep_experts_options.pack_dir");
_Static_assert(offsetof(ep_experts_options, progress) == 56, "ep_experts_options.progress");
_Static_assert(offsetof(ep_experts_options, host_cache_bytes) == 72, "ep_experts_options.host_cache_bytes");
_Static_assert(offsetof(ep_experts_options, cache_policy) == 88, "ep_experts_options.cache_policy");
_Static_assert(offsetof(ep_experts_options, tokens_per_acquire) == 96, "ep_experts_options.tokens_per_acquire");
_Static_assert(offsetof(ep_experts_options, stats_path) == 104, "ep_experts_options.stats_path");
_Static_assert(offsetof(ep_experts_options, stats_every) == 112, "ep_experts_options.stats_every");
_Static_assert(offsetof(ep_experts_options, top_k) == 116, "ep_experts_options.top_k");
_Static_assert(sizeof(ep_experts_options) == 120, "ep_experts_options size");
_Static_assert(offsetof(ep_experts_properties, num_layers) == 8, "ep_experts_properties.num_layers");
_Static_assert(offsetof(ep_experts_properties, slot_bytes) == 40, "ep_experts_properties.slot_bytes");
_Static_assert(offsetof(ep_experts_properties, device) == 64, "ep_experts_properties.device");
_Static_assert(offsetof(ep_experts_properties, slots_address) == 72, "ep_experts_properties.slots_address");
_Static_assert(sizeof(ep_experts_properties) == 80, "ep_experts_properties size");
_Static_assert(offsetof(ep_expert_role_layout, ne) == 8, "ep_expert_role_layout.ne");
_Static_assert(offsetof(ep_expert_role_layout, offset) == 24, "ep_expert_role_layout.offset");
_Static_assert(offsetof(ep_expert_role_layout, bytes) == 40, "ep_expert_role_layout.bytes");
_Static_assert(sizeof(ep_expert_role_layout) == 48, "ep_expert_role_layout size");
_Static_assert(offsetof(ep_experts_layer_layout, object_bytes) == 24, "ep_experts_layer_layout.object_bytes");
_Static_assert(offsetof(ep_experts_layer_layout, roles) == 32, "ep_experts_layer_layout.roles");
_Static_assert(sizeof(ep_experts_layer_layout) == 176, "ep_experts_layer_layout size");
_Static_assert(offsetof(ep_experts_lease_properties, layer) == 8, "ep_experts_lease_properties.layer");
_Static_assert(offsetof(ep_experts_lease_properties, ids) == 16, "ep_experts_lease_properties.ids");
_Static_assert(offsetof(ep_experts_lease_properties, objects) == 24, "ep_experts_lease_properties.objects");
_Static_assert(offsetof(ep_experts_lease_properties, roles) == 32, "ep_experts_lease_properties.roles");
_Static_assert(offsetof(ep_experts_lease_properties, device_table) == 40, "ep_experts_lease_properties.device_table");
_Static_assert(offsetof(ep_experts_lease_properties, hits) == 48, "ep_experts_lease_properties.hits");
_Static_assert(offsetof(ep_experts_lease_properties, slots) == 64, "ep_experts_lease_properties.slots");
_Static_assert(sizeof(ep_experts_lease_properties) == 72, "ep_experts_lease_properties size");

int main(void) { return 0; }
