#include "model/causal_lm.hpp"

#include "core/error.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"
#include "model/deepseek_v4.hpp"
#include "model/kimi.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

namespace ep::model {

void CausalLm::forward(const int32_t *tokens, int64_t n, LmState &state, float *logits) {
  const backend::Tensor out = forward(tokens, n, state, logits ? LogitRows::all : LogitRows::none);
  if (logits && out.data) backend().download(logits, out.data, out.n_bytes());
}

namespace {

namespace fs = std::filesystem;

uint64_t buffer_bytes(const DeepseekV4State &s) {
  uint64_t n = 0;
  for (const LayerState &l : s.layers)
    for (const CompressorState *c : {&l.comp, &l.index})
      n += c->buf_kv.bytes() + c->buf_gate.bytes() + c->entries.bytes() + c->overlap_kv.bytes() + c->overlap_gate.bytes();
  for (const LayerState &l : s.layers) n += l.window.bytes();
  return n;
}

uint64_t buffer_bytes(const KimiState &s) {
  uint64_t n = 0;
  for (const KimiLayerState &l : s.layers) n += l.conv.bytes() + l.S.bytes() + l.keys.bytes() + l.values.bytes();
  return n;
}

/// A model class's state (DeepseekV4State, KimiState) as an LmState.
template <class State>
class StateOf final : public LmState {
 public:
  explicit StateOf(State s) : state(std::move(s)) {}
  int64_t n_past() const override { return state.n_past; }
  std::unique_ptr<LmState> clone() const override { return std::make_unique<StateOf>(state); }
  uint64_t state_bytes() const override { return buffer_bytes(state); }
  State state;
};

/// The adapter: the model class's own forward pass, state and experts; @p info and the first
/// expert block come from its config.
template <class Model, class State>
class ModelLm final : public CausalLm {
 public:
  ModelLm(std::unique_ptr<Model> m, CausalLmInfo info, int64_t first_expert_layer)
      : m_(std::move(m)), info_(std::move(info)), first_(first_expert_layer) {}
  const CausalLmInfo &info() const override { return info_; }
  std::unique_ptr<LmState> new_state() const override { return std::make_unique<StateOf<State>>(m_->new_state()); }
  uint64_t state_bytes(int64_t tokens) const override { return m_->state_bytes(tokens); }
  backend::Tensor forward(const int32_t *tokens, int64_t n, LmState &state, LogitRows rows) override {
    auto *s = dynamic_cast<StateOf<State> *>(&state);
    if (!s) fail(Status::internal, "{}: forward() with the state of another model", info_.architecture);
    return m_->forward(tokens, n, s->state, rows);
  }
  backend::Tensor forward_batch(std::span<const int32_t> tokens, std::span<const int64_t> offsets,
                                std::span<LmState *const> states, LogitRows rows) override {
    std::vector<State *> own(states.size());
    for (size_t i = 0; i < states.size(); ++i) {
      auto *s = dynamic_cast<StateOf<State> *>(states[i]);
      if (!s) fail(Status::internal, "{}: forward_batch() with the state of another model", info_.architecture);
      own[i] = &s->state;
    }
    backend::Tensor out = m_->forward_batch(tokens, offsets, own, rows);
    // one sequence's last row comes back as [vocab]: the batch shape is [vocab, 1]
    if (rows == LogitRows::last && out.data && states.size() == 1) out = backend::Tensor::make(out.data, out.type, out.device, {info_.vocab, 1});
    return out;
  }
  backend::Backend &backend() const override { return m_->backend(); }
  const std::vector<experts::ExpertShape> &expert_shapes() const override { return m_->expert_shapes(); }
  int64_t first_expert_layer() const override { return first_; }
  void set_experts(std::unique_ptr<experts::ExpertProvider> experts) override { m_->set_experts(std::move(experts)); }
  uint64_t weight_bytes() const override { return m_->weight_bytes(); }

 private:
  std::unique_ptr<Model> m_;
  CausalLmInfo info_;
  int64_t first_ = 0;
};

template <class Config>
CausalLmInfo info_of(const Config &c, std::string architecture) {
  CausalLmInfo i;
  i.architecture = std::move(architecture);
  i.vocab = c.vocab;
  i.n_layers = c.n_layers;
  i.hidden = c.hidden;
  i.n_experts = c.n_experts;
  i.n_experts_used = c.n_experts_used;
  i.context_length = c.max_positions;
  return i;
}

std::unique_ptr<CausalLm> open_deepseek_v4_lm(const std::string &source, backend::Backend &backend,
                                              const CausalLmOptions &options) {
  DeepseekV4LoadOptions lo;
  lo.resident_experts = options.resident_experts;
  lo.expert_devices = options.expert_devices;
  auto m = DeepseekV4Model::open(source, backend, lo);
  CausalLmInfo info = info_of(m->config(), "deepseek4");
  // Every block is MoE (the first ones hash-routed): provider layer = block.
  return std::make_unique<ModelLm<DeepseekV4Model, DeepseekV4State>>(std::move(m), std::move(info), 0);
}

std::unique_ptr<CausalLm> open_kimi_lm(const std::string &source, backend::Backend &backend, const CausalLmOptions &options) {
  KimiLoadOptions lo;
  lo.resident_experts = options.resident_experts;
  lo.expert_devices = options.expert_devices;
  auto m = KimiModel::open(source, backend, lo);
  const KimiConfig &c = m->config();
  // Provider layer i must be MoE layer i = block n_dense_layers + i (moe_index()).
  const int64_t first = c.n_dense_layers;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const int64_t want = il < first ? -1 : il - first;
    if (m->moe_index(il) != want)
      fail(Status::internal, "{}: {} layer {} has MoE index {}, expected {}", source, c.arch, il, m->moe_index(il), want);
  }
  CausalLmInfo info = info_of(c, c.arch);
  return std::make_unique<ModelLm<KimiModel, KimiState>>(std::move(m), std::move(info), first);
}

using OpenFn = std::unique_ptr<CausalLm> (*)(const std::string &, backend::Backend &, const CausalLmOptions &);

/// One row per architecture: the one list of what open_causal_lm() opens (the C API, the engine's
/// device choice and every message naming the supported architectures read it). Adding an
/// architecture: docs/howto/adding-a-model.md.
struct Architecture {
  std::string_view gguf_name;  ///< general.architecture
  std::string_view hf_type;    ///< config.json model_type
  OpenFn open;
  bool cuda;                   ///< the CUDA backend runs it (the CPU backend runs every one)
};

const std::array<Architecture, 3> kArchitectures = {{
    {"deepseek4", "deepseek_v4", &open_deepseek_v4_lm, true},
    {"kimi-linear", "kimi_linear", &open_kimi_lm, true},
    {"kimi-k3", "kimi_k3", &open_kimi_lm, true},
}};

const Architecture *find_architecture(const std::string &name) {
  for (const Architecture &a : kArchitectures)
    if (a.gguf_name == name) return &a;
  return nullptr;
}

bool runs_on(const Architecture &a, backend::Device device) { return device == backend::Device::cpu || a.cuda; }

}  // namespace

std::string known_architectures() {
  std::string s;
  for (const Architecture &a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.gguf_name);
  return s;
}

std::string source_architecture(const std::string &source) {
  using format::FileFormat;
  const FileFormat kind = format::detect_file_format(source);
  if (kind == FileFormat::gguf) {
    const format::GgufFile f = format::GgufFile::open(source);
    const format::GgufValue *a = f.find("general.architecture");
    if (!a || a->type != format::GgufType::string)
      fail(Status::format, "{}: general.architecture is missing or not a string", source);
    return a->s;
  }
  if (kind == FileFormat::expert_pack)
    fail(Status::invalid_argument, "{}: an Expert Pack, not a model source (GGUF or safetensors checkpoint)", source);
  std::error_code ec;
  const fs::path dir = format::checkpoint_dir_of(source, kind);
  const fs::path config = dir / "config.json";
  if (!fs::exists(config, ec))
    fail(Status::format, "{}: a {}, neither a GGUF file nor a safetensors checkpoint (no config.json in {})", source,
         format::file_format_name(kind), dir.string());
  std::ifstream in(config);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail_errno(errno, "read " + config.string());
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(Status::format, "{}: not a JSON object", config.string());
  const auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) fail(Status::format, "{}: no model_type string", config.string());
  const std::string type = mt->get<std::string>();
  for (const Architecture &a : kArchitectures)
    if (a.hf_type == type) return std::string(a.gguf_name);
  return type;
}

bool architecture_known(const std::string &architecture) { return find_architecture(architecture) != nullptr; }

bool architecture_runs_on(const std::string &architecture, backend::Device device) {
  const Architecture *a = find_architecture(architecture);
  return a && runs_on(*a, device);
}

std::unique_ptr<CausalLm> open_causal_lm(const std::string &source, backend::Backend &backend, const CausalLmOptions &options) {
  const std::string arch = source_architecture(source);
  const Architecture *a = find_architecture(arch);
  if (!a) fail(Status::unsupported, "{}: architecture '{}' is not supported (supported: {})", source, arch, known_architectures());
  if (!runs_on(*a, backend.device()))
    fail(Status::unsupported, "{}: the {} model does not run on the {} backend yet (use the CPU)", source, arch,
         backend::device_name(backend.device()));
  return a->open(source, backend, options);
}

}  // namespace ep::model
