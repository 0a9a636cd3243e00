// C API: models, sessions, generation and scoring (include/expertpack/model.h): handles over
// the engine's objects, struct-size copies and the exception barrier; the work is the engine's.
#include <expertpack/expertpack.h>

#include "capi/guard.hpp"
#include "capi/store_stats.hpp"
#include "capi/model_internal.hpp"
#include "engine/engine.hpp"
#include "engine/generate.hpp"
#include "engine/session.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

struct ep_model {
  std::unique_ptr<ep::engine::Engine> engine;
};

struct ep_session {
  ep_model *model = nullptr;
  std::unique_ptr<ep::engine::Session> session;
};

namespace {
// The first published sizes: fields are only appended after these.
constexpr size_t kModelOptionsV1 = offsetof(ep_model_options, pack_dir);
constexpr size_t kModelPropertiesV1 = offsetof(ep_model_properties, device);
constexpr size_t kStoreStatsV1 = offsetof(ep_store_stats, host_hits);
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

// ep_model_options <-> engine::ModelOptions, field by field from EP_MODEL_OPTION_FIELDS: the
// defaults are ModelOptions' (ep_model_options_init writes them), the checks of each value are
// validate_model_options' (Engine::open); here only what the C types add: a flag is 0 or 1, a
// device is an ep_device_kind, a NULL string is the default.
template <typename T>
void from_c(const T &c, T &out, const char *, const char *) {
  out = c;
}
void from_c(int32_t c, bool &out, const char *fn, const char *field) {
  if (c != 0 && c != 1) ep::fail(ep::Status::invalid_argument, "{}: {} {} (expected 0 or 1)", fn, field, c);
  out = c != 0;
}
void from_c(const char *c, std::string &out, const char *, const char *) {
  if (c) out = c;
}
void from_c(ep_device_kind c, ep::engine::DeviceChoice &out, const char *fn, const char *field) {
  switch (c) {
    case EP_DEVICE_AUTO: out = ep::engine::DeviceChoice::automatic; return;
    case EP_DEVICE_CPU: out = ep::engine::DeviceChoice::cpu; return;
    case EP_DEVICE_CUDA: out = ep::engine::DeviceChoice::cuda; return;
    default: ep::fail(ep::Status::invalid_argument, "{}: {} {} is not an ep_device_kind", fn, field, static_cast<int>(c));
  }
}

template <typename T>
void to_c(const T &v, T &out) {
  out = v;
}
void to_c(bool v, int32_t &out) { out = v ? 1 : 0; }
void to_c(const std::string &, const char *&out) { out = nullptr; }  // NULL: the default
void to_c(ep::engine::DeviceChoice v, ep_device_kind &out) {
  out = v == ep::engine::DeviceChoice::cpu ? EP_DEVICE_CPU : v == ep::engine::DeviceChoice::cuda ? EP_DEVICE_CUDA : EP_DEVICE_AUTO;
}

ep::engine::ModelOptions model_options(const ep_model_options &c, const char *fn) {
  ep::engine::ModelOptions o;
#define EP_FROM_C(c_field, member) from_c(c.c_field, o.member, fn, #c_field);
  EP_MODEL_OPTION_FIELDS(EP_FROM_C)
#undef EP_FROM_C
  if (c.progress) {
    const ep_model_progress_fn cb = c.progress;
    void *payload = c.progress_payload;
    o.progress = [cb, payload](uint64_t done, uint64_t total) { cb(done, total, payload); };
  }
  return o;
}

}  // namespace

namespace ep::capi {

ep_generate_options read_generate_options(const ep_generate_options *options, const char *fn) {
  ep_generate_options opts;
  ep_generate_options_init(&opts);
  if (options) {
    check_struct_size(options->struct_size, kGenerateOptionsV1, sizeof(ep_generate_options), "ep_generate_options");
    const size_t n = options->struct_size <= kGenerateOptionsV1 ? offsetof(ep_generate_options, min_p)
                                                                : std::min(options->struct_size, sizeof(ep_generate_options));
    std::memcpy(&opts, options, n);
    opts.struct_size = sizeof(ep_generate_options);
  }
  if (opts.n_stop_tokens && !opts.stop_tokens)
    ep::fail(ep::Status::invalid_argument, "{}: n_stop_tokens {} with stop_tokens NULL", fn, opts.n_stop_tokens);
  if (opts.n_stop_strings && !opts.stop_strings)
    ep::fail(ep::Status::invalid_argument, "{}: n_stop_strings {} with stop_strings NULL", fn, opts.n_stop_strings);
  for (size_t i = 0; i < opts.n_stop_strings; ++i)
    if (!opts.stop_strings[i]) ep::fail(ep::Status::invalid_argument, "{}: stop_strings[{}] is NULL or empty", fn, i);
  if (opts.n_logit_bias && !opts.logit_bias)
    ep::fail(ep::Status::invalid_argument, "{}: n_logit_bias {} with logit_bias NULL", fn, opts.n_logit_bias);
  if (opts.ignore_eos < 0 || opts.ignore_eos > 1)
    ep::fail(ep::Status::invalid_argument, "{}: ignore_eos {} (expected 0 or 1)", fn, opts.ignore_eos);
  return opts;
}

ep::engine::GenerateParams generate_params(const ep_generate_options &o) {
  ep::engine::GenerateParams p;
  p.max_new_tokens = o.max_new_tokens;
  p.sampling.temperature = o.temperature;
  p.sampling.top_k = o.top_k;
  p.sampling.top_p = o.top_p;
  p.sampling.seed = o.seed;
  p.sampling.min_p = o.min_p;
  p.sampling.repetition_penalty = o.repetition_penalty;
  p.repetition_window = o.repetition_window;
  for (size_t i = 0; i < o.n_logit_bias; ++i) p.sampling.logit_bias.push_back({o.logit_bias[i].token, o.logit_bias[i].bias});
  if (o.stop_token >= 0) p.stop_tokens.push_back(o.stop_token);
  p.stop_tokens.insert(p.stop_tokens.end(), o.stop_tokens, o.stop_tokens + o.n_stop_tokens);
  for (size_t i = 0; i < o.n_stop_strings; ++i) p.stop_strings.emplace_back(o.stop_strings[i]);
  p.ignore_eos = o.ignore_eos != 0;
  if (o.grammar) p.grammar = &matcher_of(*o.grammar);
  return p;
}

void check_generate_stats(const ep_generate_stats *out) {
  if (out) check_struct_size(out->struct_size, kGenerateStatsV1, sizeof(ep_generate_stats), "ep_generate_stats");
}

void write_generate_stats(ep_generate_stats *out, const ep::engine::GenerateStats &s) {
  if (!out) return;
  ep_generate_stats st{};
  st.struct_size = out->struct_size;
  st.prompt_tokens = s.prompt_tokens;
  st.generated_tokens = s.generated_tokens;
  st.prefill_seconds = s.prefill_seconds;
  st.decode_seconds = s.decode_seconds;
  st.stop_reason = static_cast<ep_stop_reason>(s.stop_reason);
  st.reused_tokens = s.reused_tokens;
  st.prefill_tokens_per_second = s.prefill_tokens_per_second;
  st.decode_tokens_per_second = s.decode_tokens_per_second;
  st.session_tokens = s.session_tokens;
  st.prefill_expert_bytes = s.prefill_expert_bytes;
  st.decode_expert_bytes = s.decode_expert_bytes;
  st.decode_read_busy_seconds = static_cast<double>(s.decode_read_busy_ns) * 1e-9;
  st.decode_read_full_seconds = static_cast<double>(s.decode_read_full_ns) * 1e-9;
  st.decode_expert_wait_seconds = static_cast<double>(s.decode_expert_wait_ns) * 1e-9;
  st.decode_store_idle_seconds = static_cast<double>(s.decode_store_idle_ns) * 1e-9;
  std::memcpy(out, &st, std::min(out->struct_size, sizeof(st)));
}

ep::engine::Engine &model_engine(const ep_model &model) { return *model.engine; }
ep::engine::Session &session_of(ep_session &session) { return *session.session; }

}  // namespace ep::capi

extern "C" {

EP_API void ep_model_options_init(ep_model_options *options) {
  if (!options) return;
  *options = ep_model_options{};
  options->struct_size = sizeof(ep_model_options);
  const ep::engine::ModelOptions defaults;
#define EP_TO_C(c_field, member) to_c(defaults.member, options->c_field);
  EP_MODEL_OPTION_FIELDS(EP_TO_C)
#undef EP_TO_C
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
    auto m = std::make_unique<ep_model>();
    m->engine = ep::engine::Engine::open(path, model_options(opts, fn));
    *out_model = m.release();
  });
}

EP_API void ep_model_close(ep_model *model) { delete model; }

EP_API const char *ep_model_pack_path(const ep_model *model) {
  if (!model || model->engine->pack_path().empty()) return nullptr;
  return model->engine->pack_path().c_str();
}

EP_API ep_status ep_model_store_stats(ep_store_stats *out_stats, const ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_stats, fn, "out_stats");
    ep::capi::require_arg(model, fn, "model");
    ep::capi::check_struct_size(out_stats->struct_size, kStoreStatsV1, sizeof(ep_store_stats), "ep_store_stats");
    ep_store_stats s = ep::capi::to_c_store_stats(model->engine->store_stats());
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
    const ep::engine::Engine &e = *model->engine;
    const ep::model::CausalLmInfo &c = e.info();
    ep_model_properties p{};
    p.struct_size = out_properties->struct_size;
    std::strncpy(p.architecture, c.architecture.c_str(), sizeof(p.architecture) - 1);
    p.vocab_size = static_cast<uint32_t>(c.vocab);
    p.num_layers = static_cast<uint32_t>(c.n_layers);
    p.hidden_size = static_cast<uint32_t>(c.hidden);
    p.num_experts = static_cast<uint32_t>(c.n_experts);
    p.experts_per_token = static_cast<uint32_t>(c.n_experts_used);
    p.weight_bytes = e.weight_bytes();
    p.device = e.device() == ep::backend::Device::cuda ? EP_DEVICE_CUDA : EP_DEVICE_CPU;
    p.device_index = e.device_index();
    p.context_length = static_cast<uint64_t>(std::max<int64_t>(e.context_length(), 0));
    p.kv_budget_bytes = e.kv_budget_bytes();
    std::memcpy(out_properties, &p, std::min(out_properties->struct_size, sizeof(p)));
  });
}

EP_API ep_status ep_model_state_bytes(uint64_t *out_bytes, const ep_model *model, uint64_t tokens) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_bytes, fn, "out_bytes");
    ep::capi::require_arg(model, fn, "model");
    if (tokens > (uint64_t{1} << 40)) ep::fail(ep::Status::invalid_argument, "{}: tokens {} (expected at most 2^40)", fn, tokens);
    *out_bytes = model->engine->session_bytes(static_cast<int64_t>(tokens));
  });
}

EP_API ep_status ep_model_kv_in_use(uint64_t *out_bytes, const ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_bytes, fn, "out_bytes");
    ep::capi::require_arg(model, fn, "model");
    *out_bytes = model->engine->kv_in_use_bytes();
  });
}

EP_API ep_status ep_session_open(ep_session **out_session, ep_model *model) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_session, fn, "out_session");
    *out_session = nullptr;
    ep::capi::require_arg(model, fn, "model");
    auto s = std::make_unique<ep_session>();
    s->model = model;
    s->session = std::make_unique<ep::engine::Session>(*model->engine);
    *out_session = s.release();
  });
}

EP_API void ep_session_close(ep_session *session) { delete session; }

EP_API ep_status ep_session_reset(ep_session *session) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(session, fn, "session");
    session->session->reset();
  });
}

EP_API ep_status ep_session_length(uint64_t *out_length, const ep_session *session) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_length, fn, "out_length");
    ep::capi::require_arg(session, fn, "session");
    *out_length = static_cast<uint64_t>(session->session->length());
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
    const ep_generate_options opts = ep::capi::read_generate_options(options, fn);
    if (opts.n_stop_strings)
      ep::fail(ep::Status::invalid_argument, "{}: stop_strings need a tokenizer: use ep_generate_text() or ep_generate_chat()", fn);
    if (n_prompt) ep::capi::require_arg(prompt, fn, "prompt");
    ep::engine::GenerateStats st;
    const ep::engine::TokenHook hook = [&](int32_t tok, uint32_t i, ep::engine::StopReason &) {
      return callback && callback(tok, i, payload) != 0 ? -1 : 0;
    };
    try {
      ep::engine::generate(*session->session, std::span<const int32_t>(prompt, n_prompt), ep::capi::generate_params(opts), hook,
                           st);
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
    ep::engine::Session &s = *session->session;
    const size_t vocab = static_cast<size_t>(s.engine().info().vocab);
    if (top_k > vocab) ep::fail(ep::Status::invalid_argument, "{}: top_k {} > vocabulary {}", fn, top_k, vocab);
    if (top_k) ep::capi::require_arg(out_ids, fn, "out_ids");
    const std::span<const int32_t> in(tokens, n_tokens);
    s.check_tokens(in, fn);
    const std::vector<float> rows = s.append_scored(in);
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

EP_API ep_status ep_sessions_append(ep_session *const *sessions, const int32_t *const *tokens, const size_t *n_tokens,
                                    size_t n_sessions) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(sessions, fn, "sessions");
    ep::capi::require_arg(tokens, fn, "tokens");
    ep::capi::require_arg(n_tokens, fn, "n_tokens");
    if (!n_sessions) ep::fail(ep::Status::invalid_argument, "{}: no sessions", fn);
    std::vector<ep::engine::Session *> ss(n_sessions);
    std::vector<std::span<const int32_t>> ts(n_sessions);
    for (size_t i = 0; i < n_sessions; ++i) {
      if (!sessions[i]) ep::fail(ep::Status::invalid_argument, "{}: sessions[{}] is NULL", fn, i);
      if (n_tokens[i] && !tokens[i]) ep::fail(ep::Status::invalid_argument, "{}: tokens[{}] is NULL", fn, i);
      ss[i] = sessions[i]->session.get();
      ts[i] = std::span<const int32_t>(tokens[i], n_tokens[i]);
    }
    ep::engine::append_batch(ss, ts);
  });
}

EP_API ep_status ep_session_sample(int32_t *out_token, ep_session *session, const ep_generate_options *options) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_token, fn, "out_token");
    ep::capi::require_arg(session, fn, "session");
    const ep::engine::GenerateParams p = ep::capi::generate_params(ep::capi::read_generate_options(options, fn));
    ep::engine::check_generate_params(p);
    *out_token = ep::engine::sample_next(*session->session, p);
  });
}

static_assert(EP_MAX_TOP_LOGPROBS == ep::backend::kMaxTopLogprobs, "one limit of the alternatives");

EP_API void ep_token_logprobs_init(ep_token_logprobs *logprobs) {
  if (!logprobs) return;
  *logprobs = ep_token_logprobs{};
  logprobs->struct_size = sizeof(ep_token_logprobs);
}

EP_API ep_status ep_session_sample_logprobs(ep_token_logprobs *out_logprobs, ep_session *session,
                                            const ep_generate_options *options, uint32_t top_logprobs) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_logprobs, fn, "out_logprobs");
    ep::capi::require_arg(session, fn, "session");
    ep::capi::check_struct_size(out_logprobs->struct_size, sizeof(ep_token_logprobs), sizeof(ep_token_logprobs),
                                "ep_token_logprobs");
    if (top_logprobs > EP_MAX_TOP_LOGPROBS)
      ep::fail(ep::Status::invalid_argument, "{}: top_logprobs {} (expected 0..{})", fn, top_logprobs, EP_MAX_TOP_LOGPROBS);
    const ep::engine::GenerateParams p = ep::capi::generate_params(ep::capi::read_generate_options(options, fn));
    ep::engine::check_generate_params(p);
    ep::backend::TokenLogprobs lp;
    lp.top_n = static_cast<int32_t>(top_logprobs);
    const int32_t token = ep::engine::sample_next(*session->session, p, &lp);
    ep_token_logprobs out;
    ep_token_logprobs_init(&out);
    out.token = token;
    out.logprob = lp.logprob;
    out.n_top = static_cast<uint32_t>(lp.top_ids.size());
    std::copy(lp.top_ids.begin(), lp.top_ids.end(), out.top_tokens);
    std::copy(lp.top_logprobs.begin(), lp.top_logprobs.end(), out.top_logprobs);
    *out_logprobs = out;
  });
}

EP_API ep_status ep_sessions_sample(int32_t *out_tokens, ep_token_logprobs *const *out_logprobs, ep_session *const *sessions,
                                    const ep_generate_options *const *options, const uint32_t *top_logprobs,
                                    size_t n_sessions) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_tokens, fn, "out_tokens");
    ep::capi::require_arg(sessions, fn, "sessions");
    if (!n_sessions) ep::fail(ep::Status::invalid_argument, "{}: no sessions", fn);
    std::vector<ep::engine::Session *> ss(n_sessions);
    std::vector<ep::engine::GenerateParams> params(n_sessions);
    std::vector<const ep::engine::GenerateParams *> param_ptrs(n_sessions);
    std::vector<ep::backend::TokenLogprobs> lps(out_logprobs ? n_sessions : 0);
    std::vector<ep::backend::TokenLogprobs *> lp_ptrs(out_logprobs ? n_sessions : 0, nullptr);
    for (size_t i = 0; i < n_sessions; ++i) {
      if (!sessions[i]) ep::fail(ep::Status::invalid_argument, "{}: sessions[{}] is NULL", fn, i);
      ss[i] = sessions[i]->session.get();
      const uint32_t top = top_logprobs ? top_logprobs[i] : 0;
      if (top > EP_MAX_TOP_LOGPROBS)
        ep::fail(ep::Status::invalid_argument, "{}: top_logprobs[{}] is {} (expected 0..{})", fn, i, top, EP_MAX_TOP_LOGPROBS);
      if (out_logprobs && out_logprobs[i]) {
        ep::capi::check_struct_size(out_logprobs[i]->struct_size, sizeof(ep_token_logprobs), sizeof(ep_token_logprobs),
                                    fmt::format("out_logprobs[{}]", i).c_str());
        lps[i].top_n = static_cast<int32_t>(top);
        lp_ptrs[i] = &lps[i];
      } else if (top) {
        ep::fail(ep::Status::invalid_argument, "{}: top_logprobs[{}] is {} with no out_logprobs entry for the session", fn, i, top);
      }
      const std::string where = fmt::format("{}: options[{}]", fn, i);
      try {
        params[i] = ep::capi::generate_params(ep::capi::read_generate_options(options ? options[i] : nullptr, where.c_str()));
        ep::engine::check_generate_params(params[i]);
      } catch (const ep::Error &e) {
        if (std::string_view(e.what()).starts_with(where)) throw;
        ep::fail(e.status(), "{}: {}", where, e.what());
      }
      param_ptrs[i] = &params[i];
    }
    std::vector<int32_t> tokens(n_sessions, -1);
    ep::engine::sample_next_batch(ss, param_ptrs, lp_ptrs, tokens);
    for (size_t i = 0; i < n_sessions; ++i) {
      out_tokens[i] = tokens[i];
      if (lp_ptrs.empty() || !lp_ptrs[i]) continue;
      const ep::backend::TokenLogprobs &lp = lps[i];
      ep_token_logprobs out;
      ep_token_logprobs_init(&out);
      out.token = tokens[i];
      out.logprob = lp.logprob;
      out.n_top = static_cast<uint32_t>(lp.top_ids.size());
      std::copy(lp.top_ids.begin(), lp.top_ids.end(), out.top_tokens);
      std::copy(lp.top_logprobs.begin(), lp.top_logprobs.end(), out.top_logprobs);
      *out_logprobs[i] = out;
    }
  });
}

EP_API ep_status ep_session_fork(ep_session **out_session, const ep_session *session) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_session, fn, "out_session");
    *out_session = nullptr;
    ep::capi::require_arg(session, fn, "session");
    auto s = std::make_unique<ep_session>();
    s->model = session->model;
    s->session = session->session->fork();
    *out_session = s.release();
  });
}

EP_API ep_status ep_session_tokens(int32_t *out_tokens, size_t capacity, size_t *out_count, const ep_session *session) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_count, fn, "out_count");
    ep::capi::require_arg(session, fn, "session");
    if (capacity) ep::capi::require_arg(out_tokens, fn, "out_tokens");
    const std::span<const int32_t> t = session->session->tokens();
    *out_count = t.size();
    if (capacity >= t.size()) std::copy(t.begin(), t.end(), out_tokens);
  });
}

EP_API ep_status ep_session_state_bytes(uint64_t *out_bytes, const ep_session *session) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_bytes, fn, "out_bytes");
    ep::capi::require_arg(session, fn, "session");
    *out_bytes = session->session->state_bytes();
  });
}

EP_API ep_status ep_session_set_draw_count(ep_session *session, uint64_t draw_count) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(session, fn, "session");
    session->session->set_draw_count(draw_count);
  });
}

}  // extern "C"
