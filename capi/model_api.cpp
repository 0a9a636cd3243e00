// C API: models, sessions, generation and scoring (include/expertpack/model.h).
#include <expertpack/expertpack.h>

#include "backend/cpu_backend.hpp"
#include "capi/guard.hpp"
#include "capi/model_internal.hpp"
#ifdef EP_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#include "gpu/device.hpp"
#endif
#include "core/log.hpp"
#include "model/causal_lm.hpp"
#include "model/expert_provider.hpp"
#include "model/model_source.hpp"
#include "store/stats.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <string>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <vector>

struct ep_model {
  std::unique_ptr<ep::backend::Backend> backend;
  std::unique_ptr<ep::model::CausalLm> lm;     // DeepSeek-V4 or Kimi (model/causal_lm.hpp)
  ep::model::PackedExperts *packed = nullptr;  // owned by lm; null with resident experts
  std::string pack_path;
  std::string source_path;  // the dense weights' (and the tokenizer's) file
  int32_t device_index = -1;  // the CUDA device's ordinal; -1 on the CPU
  /// Serialises forward passes, sampling and state allocation: sessions on several threads
  /// share the backend and the expert store (see the thread-safety rule in model.h).
  mutable std::mutex mutex;
};

struct ep_session {
  ep_model *model = nullptr;
  std::unique_ptr<ep::model::LmState> state;
  std::vector<float> last_logits;  // logits after the last token (empty when the session is empty)
  uint64_t sample_counter = 0;
  std::vector<int32_t> tokens;     // every token appended, in order
};

namespace {
// The first published sizes: fields are only appended after these.
constexpr size_t kModelOptionsV1 = offsetof(ep_model_options, pack_dir);
constexpr size_t kModelPropertiesV1 = offsetof(ep_model_properties, device);
// ep_generate_options v1 ended with stop_token; its sizeof (padding included) covers the
// offset min_p now has, so a v1 struct_size copies only the v1 fields.
struct GenerateOptionsV1 {
  size_t struct_size;
  uint32_t max_new_tokens;
  float temperature;
  int32_t top_k;
  float top_p;
  uint64_t seed;
  int32_t stop_token;
};
constexpr size_t kGenerateOptionsV1 = sizeof(GenerateOptionsV1);
constexpr size_t kGenerateStatsV1 = offsetof(ep_generate_stats, stop_reason);

void check_tokens(const ep_session &s, const int32_t *tokens, size_t n, const char *fn) {
  const int64_t vocab = s.model->lm->info().vocab;
  for (size_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab)
      ep::fail(ep::Status::invalid_argument, "{}: token {} at index {} is outside 0..{}", fn, tokens[i], i, vocab - 1);
}

/// Runs tokens through the session; keeps the last row of logits; returns all rows if asked.
void append(ep_session &s, const int32_t *tokens, size_t n, std::vector<float> *all) {
  const size_t vocab = static_cast<size_t>(s.model->lm->info().vocab);
  std::vector<float> local;
  std::vector<float> &rows = all ? *all : local;
  rows.resize(n * vocab);
  {
    std::lock_guard<std::mutex> lock(s.model->mutex);
    s.model->lm->forward(tokens, static_cast<int64_t>(n), *s.state, rows.data());
  }
  s.last_logits.assign(rows.end() - static_cast<std::ptrdiff_t>(vocab), rows.end());
  s.tokens.insert(s.tokens.end(), tokens, tokens + n);
}

void check_device_kind(ep_device_kind kind, const char *fn) {
  if (kind != EP_DEVICE_AUTO && kind != EP_DEVICE_CPU && kind != EP_DEVICE_CUDA)
    ep::fail(ep::Status::invalid_argument, "{}: device {} is not an ep_device_kind", fn, static_cast<int>(kind));
}

/// The device ep_model_open() runs a model of @p arch (from @p source) on: true for CUDA. AUTO
/// takes the GPU when one exists and the architecture runs there (else the CPU, logged); CUDA is
/// EP_ERR_UNSUPPORTED for an architecture without CUDA support and EP_ERR_NO_DEVICE without a GPU.
bool choose_cuda(ep_device_kind kind, int32_t index, const std::string &arch, const std::string &source, const char *fn) {
  check_device_kind(kind, fn);
  if (kind == EP_DEVICE_CPU) return false;
  const bool arch_cuda = ep::model::architecture_runs_on(arch, ep::backend::Device::cuda);
  if (kind == EP_DEVICE_CUDA && !arch_cuda)
    ep::fail(ep::Status::unsupported, "{}: EP_DEVICE_CUDA: {} is a {} model, which has no CUDA implementation (use EP_DEVICE_CPU or EP_DEVICE_AUTO)",
             fn, source, arch);
  std::string why = "this build has no CUDA backend (EP_WITH_CUDA=OFF)";
  int count = 0;
#ifdef EP_HAVE_CUDA
  count = ep::gpu::device_count(&why);
#endif
  if (kind == EP_DEVICE_AUTO) {
    if (count > index && !arch_cuda)
      ep::log::info("{}: {} is a {} model, which has no CUDA implementation: using the CPU, not CUDA device {}", fn, source,
                    arch, index);
    return count > index && arch_cuda;
  }
  if (count == 0) ep::fail(ep::Status::no_device, "{}: EP_DEVICE_CUDA: no CUDA device ({})", fn, why);
  if (index >= count) ep::fail(ep::Status::no_device, "{}: EP_DEVICE_CUDA: device {} of {}", fn, index, count);
  return true;
}

/// Draws the next token from host logits on the model's backend (uploaded when it is a GPU).
int32_t sample_logits(ep::backend::Backend &be, const std::vector<float> &logits, const ep::backend::SamplingParams &sp,
                      uint64_t counter) {
  const int64_t n = static_cast<int64_t>(logits.size());
  if (be.device() == ep::backend::Device::cpu)
    return be.sample(ep::backend::Tensor::make(logits.data(), ep::backend::GgmlType::f32, be.device(), {n}), sp, counter);
  ep::model::DeviceBuffer buf(be, logits.size() * sizeof(float));
  be.upload(buf.get(), logits.data(), logits.size() * sizeof(float));
  return be.sample(ep::backend::Tensor::make(buf.get(), ep::backend::GgmlType::f32, be.device(), {n}), sp, counter);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

namespace ep::capi {

ep_generate_options read_generate_options(const ep_generate_options *options, bool allow_stop_strings, const char *fn) {
  ep_generate_options opts;
  ep_generate_options_init(&opts);
  if (options) {
    check_struct_size(options->struct_size, kGenerateOptionsV1, sizeof(ep_generate_options), "ep_generate_options");
    const size_t n = options->struct_size <= kGenerateOptionsV1 ? offsetof(ep_generate_options, min_p)
                                                                : std::min(options->struct_size, sizeof(ep_generate_options));
    std::memcpy(&opts, options, n);
    opts.struct_size = sizeof(ep_generate_options);
  }
  if (opts.top_k < 0 || !(opts.top_p > 0.0f && opts.top_p <= 1.0f))
    ep::fail(ep::Status::invalid_argument, "{}: top_k {} / top_p {} out of range", fn, opts.top_k, opts.top_p);
  if (!(opts.min_p >= 0.0f && opts.min_p <= 1.0f))
    ep::fail(ep::Status::invalid_argument, "{}: min_p {} out of range (expected 0..1)", fn, opts.min_p);
  if (!(opts.repetition_penalty > 0.0f) || !std::isfinite(opts.repetition_penalty))
    ep::fail(ep::Status::invalid_argument, "{}: repetition_penalty {} (expected > 0; 1 = off)", fn, opts.repetition_penalty);
  if (!(opts.temperature == opts.temperature))
    ep::fail(ep::Status::invalid_argument, "{}: temperature is NaN", fn);
  if (opts.n_stop_tokens && !opts.stop_tokens)
    ep::fail(ep::Status::invalid_argument, "{}: n_stop_tokens {} with stop_tokens NULL", fn, opts.n_stop_tokens);
  if (opts.n_stop_strings && !opts.stop_strings)
    ep::fail(ep::Status::invalid_argument, "{}: n_stop_strings {} with stop_strings NULL", fn, opts.n_stop_strings);
  if (opts.n_stop_strings && !allow_stop_strings)
    ep::fail(ep::Status::invalid_argument, "{}: stop_strings need a tokenizer: use ep_generate_text() or ep_generate_chat()", fn);
  for (size_t i = 0; i < opts.n_stop_strings; ++i)
    if (!opts.stop_strings[i] || !*opts.stop_strings[i])
      ep::fail(ep::Status::invalid_argument, "{}: stop_strings[{}] is NULL or empty", fn, i);
  if (opts.ignore_eos < 0 || opts.ignore_eos > 1)
    ep::fail(ep::Status::invalid_argument, "{}: ignore_eos {} (expected 0 or 1)", fn, opts.ignore_eos);
  return opts;
}

/// Bytes the model's expert store has read from its pack so far (0 with resident experts).
uint64_t expert_read_bytes(ep_model &model) {
  if (!model.packed) return 0;
  std::lock_guard<std::mutex> lock(model.mutex);
  return model.packed->stats().pack_read_bytes;
}

void generate(ep_session &session, std::span<const int32_t> prompt, const ep_generate_options &opts, const TokenHook &hook,
              ep_generate_stats &st, const char *fn) {
  if (prompt.empty() && session.last_logits.empty())
    ep::fail(ep::Status::invalid_argument, "{}: empty prompt on an empty session", fn);
  check_tokens(session, prompt.data(), prompt.size(), fn);
  for (size_t i = 0; i < opts.n_stop_tokens; ++i)
    if (opts.stop_tokens[i] < 0)
      ep::fail(ep::Status::invalid_argument, "{}: stop_tokens[{}] is {}", fn, i, opts.stop_tokens[i]);
  st.stop_reason = EP_STOP_LENGTH;
  auto t0 = std::chrono::steady_clock::now();
  const uint64_t read0 = expert_read_bytes(*session.model);
  if (!prompt.empty()) append(session, prompt.data(), prompt.size(), nullptr);
  st.prompt_tokens = static_cast<uint32_t>(prompt.size());
  st.prefill_seconds = seconds_since(t0);
  const uint64_t read1 = expert_read_bytes(*session.model);
  st.prefill_expert_bytes = read1 - read0;
  t0 = std::chrono::steady_clock::now();
  ep::backend::SamplingParams sp;
  sp.temperature = opts.temperature;
  sp.top_k = opts.top_k;
  sp.top_p = opts.top_p;
  sp.seed = opts.seed;
  sp.min_p = opts.min_p;
  sp.repetition_penalty = opts.repetition_penalty;
  ep::backend::Backend &be = *session.model->backend;
  bool cancelled = false;
  auto finish = [&] {
    st.decode_seconds = seconds_since(t0);
    st.prefill_tokens_per_second = st.prefill_seconds > 0 ? st.prompt_tokens / st.prefill_seconds : 0.0;
    st.decode_tokens_per_second = st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0.0;
    st.session_tokens = session.tokens.size();
    st.decode_expert_bytes = expert_read_bytes(*session.model) - read1;
  };
  for (uint32_t i = 0; i < opts.max_new_tokens; ++i) {
    if (opts.repetition_penalty != 1.0f) {
      const size_t n = session.tokens.size();
      const size_t w = opts.repetition_window && opts.repetition_window < n ? opts.repetition_window : n;
      sp.penalty_tokens = std::span<const int32_t>(session.tokens.data() + (n - w), w);
    }
    int32_t tok;
    {
      std::lock_guard<std::mutex> lock(session.model->mutex);
      tok = sample_logits(be, session.last_logits, sp, session.sample_counter++);
    }
    append(session, &tok, 1, nullptr);
    ++st.generated_tokens;
    ep_stop_reason reason = EP_STOP_LENGTH;
    const int h = hook ? hook(tok, i, reason) : 0;
    if (h < 0) {
      st.stop_reason = EP_STOP_CANCELLED;
      cancelled = true;
      break;
    }
    if (h > 0) {
      st.stop_reason = reason;
      break;
    }
    bool stop = tok == opts.stop_token;
    for (size_t k = 0; k < opts.n_stop_tokens && !stop; ++k) stop = tok == opts.stop_tokens[k];
    if (stop) {
      st.stop_reason = EP_STOP_TOKEN;
      break;
    }
  }
  finish();
  if (cancelled) ep::fail(ep::Status::cancelled, "{}: the callback stopped generation after {} tokens", fn, st.generated_tokens);
}

void check_generate_stats(const ep_generate_stats *out) {
  if (out) check_struct_size(out->struct_size, kGenerateStatsV1, sizeof(ep_generate_stats), "ep_generate_stats");
}

void write_generate_stats(ep_generate_stats *out, const ep_generate_stats &stats) {
  if (!out) return;
  ep_generate_stats st = stats;
  st.struct_size = out->struct_size;
  std::memcpy(out, &st, std::min(out->struct_size, sizeof(st)));
}

const std::string &model_source_path(const ep_model &model) { return model.source_path; }
int64_t model_vocab_size(const ep_model &model) { return model.lm->info().vocab; }
const std::string &model_architecture(const ep_model &model) { return model.lm->info().architecture; }
const ep_model &session_model(const ep_session &session) { return *session.model; }
std::span<const int32_t> session_tokens(const ep_session &session) { return session.tokens; }

void session_reset(ep_session &session) {
  {
    std::lock_guard<std::mutex> lock(session.model->mutex);
    session.state = session.model->lm->new_state();
  }
  session.last_logits.clear();
  session.sample_counter = 0;
  session.tokens.clear();
}

}  // namespace ep::capi

extern "C" {

EP_API void ep_model_options_init(ep_model_options *options) {
  if (!options) return;
  *options = ep_model_options{};
  options->struct_size = sizeof(ep_model_options);
  options->device = EP_DEVICE_AUTO;
  options->direct_io = -1;
  options->pack_build = 1;
}

EP_API ep_status ep_model_open(ep_model **out_model, const char *path, const ep_model_options *options) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_model, fn, "out_model");
    *out_model = nullptr;
    ep::capi::require_arg(path, fn, "path");
    ep_model_options opts;
    ep_model_options_init(&opts);
    if (options) {
      ep::capi::check_struct_size(options->struct_size, kModelOptionsV1, sizeof(ep_model_options), "ep_model_options");
      std::memcpy(&opts, options, std::min(options->struct_size, sizeof(ep_model_options)));
      opts.struct_size = sizeof(ep_model_options);
    }
    if (opts.direct_io < -1 || opts.direct_io > 1)
      ep::fail(ep::Status::invalid_argument, "{}: direct_io {} (expected -1, 0 or 1)", fn, opts.direct_io);
    if (opts.device_index < 0) ep::fail(ep::Status::invalid_argument, "{}: device_index {}", fn, opts.device_index);
    check_device_kind(opts.device, fn);
    if (opts.pack_build < 0 || opts.pack_build > 1)
      ep::fail(ep::Status::invalid_argument, "{}: pack_build {} (expected 0 or 1)", fn, opts.pack_build);
    if (opts.resident_experts < 0 || opts.resident_experts > 1)
      ep::fail(ep::Status::invalid_argument, "{}: resident_experts {} (expected 0 or 1)", fn, opts.resident_experts);
    if (opts.cpu_threads < 0 || opts.cpu_threads > 4096)
      ep::fail(ep::Status::invalid_argument, "{}: cpu_threads {} (expected 0 .. 4096)", fn, opts.cpu_threads);
    ep::model::PackPlacement place;
    if (opts.pack_dir) place.pack_dir = opts.pack_dir;
    place.build = opts.pack_build != 0;
    if (opts.progress) {
      const ep_model_progress_fn cb = opts.progress;
      void *payload = opts.progress_payload;
      place.progress = [cb, payload](uint64_t done, uint64_t total) { cb(done, total, payload); };
    }
    // The architecture decides the device and the model class; it is read before a pack is
    // built (a pack given explicitly is checked first: its manifest names the source).
    const bool given_pack = ep::model::is_pack_file(path);
    if (opts.resident_experts && given_pack)
      ep::fail(ep::Status::invalid_argument, "{}: {} is an Expert Pack; resident_experts needs the source", fn, path);
    ep::model::ResolvedModel rm;
    if (given_pack) rm = ep::model::resolve_model(path, place);
    const std::string source = given_pack ? rm.source : std::string(path);
    const std::string arch = ep::model::source_architecture(source);
    if (!ep::model::architecture_known(arch))
      ep::fail(ep::Status::unsupported, "{}: {}: architecture '{}' is not supported (supported: deepseek4, kimi-linear, kimi-k3)",
               fn, source, arch);
    [[maybe_unused]] const bool use_cuda = choose_cuda(opts.device, opts.device_index, arch, source, fn);
    auto m = std::make_unique<ep_model>();
    void *cuda_stream = nullptr;
#ifdef EP_HAVE_CUDA
    if (use_cuda) {
      auto cuda = std::make_unique<ep::backend::cuda::CudaBackend>(opts.device_index);
      m->device_index = opts.device_index;
      cuda_stream = cuda->stream();
      m->backend = std::move(cuda);
    }
#endif
    if (!m->backend) m->backend = std::make_unique<ep::backend::CpuBackend>(static_cast<unsigned>(opts.cpu_threads));
    if (opts.resident_experts) {
      m->lm = ep::model::open_causal_lm(source, *m->backend);
      m->source_path = source;
    } else {
      if (!given_pack) rm = ep::model::resolve_model(path, place);
      ep::model::CausalLmOptions lo;
      lo.resident_experts = false;
      m->lm = ep::model::open_causal_lm(rm.source, *m->backend, lo);
      ep::model::PackedExpertsOptions po;
      po.cache_bytes = opts.cache_budget_bytes ? opts.cache_budget_bytes : UINT64_MAX;
      po.staging_slots = opts.staging_slots;
      po.queue_depth = opts.queue_depth;
      po.read_splits = opts.read_splits;
      po.direct_io = opts.direct_io;
      po.cuda_device = m->device_index;
      po.cuda_stream = cuda_stream;
      po.first_layer = m->lm->first_expert_layer();
      auto packed = std::make_unique<ep::model::PackedExperts>(rm.pack, m->lm->expert_shapes(),
                                                               m->lm->info().n_experts_used, po);
      m->packed = packed.get();
      m->lm->set_experts(std::move(packed));
      m->pack_path = rm.pack;
      m->source_path = rm.source;
    }
    *out_model = m.release();
  });
}

EP_API void ep_model_close(ep_model *model) { delete model; }

EP_API const char *ep_model_pack_path(const ep_model *model) {
  if (!model || model->pack_path.empty()) return nullptr;
  return model->pack_path.c_str();
}

EP_API ep_status ep_model_store_stats(ep_store_stats *out_stats, const ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_stats, fn, "out_stats");
    ep::capi::require_arg(model, fn, "model");
    ep::capi::check_struct_size(out_stats->struct_size, sizeof(ep_store_stats), sizeof(ep_store_stats), "ep_store_stats");
    ep_store_stats s;
    ep_store_stats_init(&s);
    if (model->packed) {
      std::unique_lock<std::mutex> lock(model->mutex);
      const ep::store::StoreStats t = model->packed->stats();
      lock.unlock();
      s.acquires = t.acquires;
      s.pack_reads = t.pack_reads;
      s.pack_read_bytes = t.pack_read_bytes;
      s.pack_read_ns = t.pack_read_ns;
      s.cache_hits = t.cache_hits;
      s.cache_misses = t.cache_misses;
      s.cache_evictions = t.cache_evictions;
      s.resident_experts = t.resident_experts;
      s.resident_bytes = t.resident_bytes;
      s.h2d_bytes = t.h2d_bytes;
      s.io_errors = t.io_errors;
      s.fallback_count = t.fallback_count;
      s.cache_slots = t.cache_slots;
      s.slot_bytes = t.slot_bytes;
    }
    s.struct_size = out_stats->struct_size;
    std::memcpy(out_stats, &s, std::min(out_stats->struct_size, sizeof(s)));
  });
}

EP_API void ep_model_properties_init(ep_model_properties *properties) {
  if (!properties) return;
  *properties = ep_model_properties{};
  properties->struct_size = sizeof(ep_model_properties);
}

EP_API ep_status ep_model_info(ep_model_properties *out_properties, const ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_properties, fn, "out_properties");
    ep::capi::require_arg(model, fn, "model");
    ep::capi::check_struct_size(out_properties->struct_size, kModelPropertiesV1, sizeof(ep_model_properties),
                                "ep_model_properties");
    const ep::model::CausalLmInfo &c = model->lm->info();
    ep_model_properties p{};
    p.struct_size = out_properties->struct_size;
    std::strncpy(p.architecture, c.architecture.c_str(), sizeof(p.architecture) - 1);
    p.vocab_size = static_cast<uint32_t>(c.vocab);
    p.num_layers = static_cast<uint32_t>(c.n_layers);
    p.hidden_size = static_cast<uint32_t>(c.hidden);
    p.num_experts = static_cast<uint32_t>(c.n_experts);
    p.experts_per_token = static_cast<uint32_t>(c.n_experts_used);
    p.weight_bytes = model->lm->weight_bytes();
    p.device = model->backend->device() == ep::backend::Device::cuda ? EP_DEVICE_CUDA : EP_DEVICE_CPU;
    p.device_index = model->device_index;
    std::memcpy(out_properties, &p, std::min(out_properties->struct_size, sizeof(p)));
  });
}

EP_API ep_status ep_session_open(ep_session **out_session, ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_session, fn, "out_session");
    *out_session = nullptr;
    ep::capi::require_arg(model, fn, "model");
    auto s = std::make_unique<ep_session>();
    s->model = model;
    std::lock_guard<std::mutex> lock(model->mutex);
    s->state = model->lm->new_state();
    *out_session = s.release();
  });
}

EP_API void ep_session_close(ep_session *session) {
  if (!session) return;
  std::lock_guard<std::mutex> lock(session->model->mutex);  // the state may hold backend memory
  delete session;
}

EP_API ep_status ep_session_reset(ep_session *session) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(session, fn, "session");
    ep::capi::session_reset(*session);
  });
}

EP_API ep_status ep_session_length(uint64_t *out_length, const ep_session *session) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_length, fn, "out_length");
    ep::capi::require_arg(session, fn, "session");
    *out_length = static_cast<uint64_t>(session->state->n_past());
  });
}

EP_API void ep_generate_options_init(ep_generate_options *options) {
  if (!options) return;
  *options = ep_generate_options{};
  options->struct_size = sizeof(ep_generate_options);
  options->max_new_tokens = 16;
  options->top_p = 1.0f;
  options->stop_token = -1;
  options->repetition_penalty = 1.0f;
  options->repetition_window = 64;
}

EP_API void ep_generate_stats_init(ep_generate_stats *stats) {
  if (!stats) return;
  *stats = ep_generate_stats{};
  stats->struct_size = sizeof(ep_generate_stats);
}

EP_API ep_status ep_generate(ep_generate_stats *out_stats, ep_session *session, const int32_t *prompt, size_t n_prompt,
                             const ep_generate_options *options, ep_token_fn callback, void *payload) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(session, fn, "session");
    ep::capi::check_generate_stats(out_stats);
    const ep_generate_options opts = ep::capi::read_generate_options(options, false, fn);
    if (n_prompt) ep::capi::require_arg(prompt, fn, "prompt");
    ep_generate_stats st{};
    const ep::capi::TokenHook hook = [&](int32_t tok, uint32_t i, ep_stop_reason &) {
      return callback && callback(tok, i, payload) != 0 ? -1 : 0;
    };
    try {
      ep::capi::generate(*session, std::span<const int32_t>(prompt, n_prompt), opts, hook, st, fn);
    } catch (...) {
      ep::capi::write_generate_stats(out_stats, st);
      throw;
    }
    ep::capi::write_generate_stats(out_stats, st);
  });
}

EP_API ep_status ep_score(ep_session *session, const int32_t *tokens, size_t n_tokens, uint32_t top_k, int32_t *out_ids,
                          float *out_logits) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(session, fn, "session");
    ep::capi::require_arg(tokens, fn, "tokens");
    ep::capi::require_arg(out_logits, fn, "out_logits");
    if (!n_tokens) ep::fail(ep::Status::invalid_argument, "{}: no tokens", fn);
    const size_t vocab = static_cast<size_t>(session->model->lm->info().vocab);
    if (top_k > vocab) ep::fail(ep::Status::invalid_argument, "{}: top_k {} > vocabulary {}", fn, top_k, vocab);
    if (top_k) ep::capi::require_arg(out_ids, fn, "out_ids");
    check_tokens(*session, tokens, n_tokens, fn);
    std::vector<float> rows;
    append(*session, tokens, n_tokens, &rows);
    if (!top_k) {
      std::memcpy(out_logits, rows.data(), rows.size() * sizeof(float));
      return;
    }
    std::vector<int32_t> idx(vocab);
    for (size_t t = 0; t < n_tokens; ++t) {
      const float *r = rows.data() + t * vocab;
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                        [&](int32_t a, int32_t b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
      for (uint32_t j = 0; j < top_k; ++j) {
        out_ids[t * top_k + j] = idx[j];
        out_logits[t * top_k + j] = r[idx[j]];
      }
    }
  });
}

}  // extern "C"
