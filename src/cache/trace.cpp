#include "cache/trace.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string_view>

namespace ep::cache {
namespace {

// Value of "key=<number>" inside a preamble line, if present.
bool field(const std::string &line, std::string_view key, uint64_t &out) {
  const std::string needle = std::string(key) + "=";
  std::size_t pos = 0;
  while ((pos = line.find(needle, pos)) != std::string::npos) {
    if (pos == 0 || line[pos - 1] == ' ' || line[pos - 1] == '#') {
      const char *begin = line.c_str() + pos + needle.size();
      char *end = nullptr;
      const unsigned long long v = std::strtoull(begin, &end, 10);
      if (end == begin) return false;
      out = v;
      return true;
    }
    pos += needle.size();
  }
  return false;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

uint64_t number(std::string_view s, const std::string &path, std::size_t line_no) {
  uint64_t v = 0;
  if (s.empty()) fail(Status::format, "{}:{}: empty number", path, line_no);
  for (char c : s) {
    if (c == '\r') break;
    if (c < '0' || c > '9') fail(Status::format, "{}:{}: '{}' is not a non-negative integer", path, line_no, s);
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

void finish(Trace &t, const std::string &path) {
  if (t.accesses.empty()) fail(Status::format, "{}: the trace has no accesses", path);
  uint32_t max_layer = 0, max_expert = 0, max_k = 0;
  for (const auto &a : t.accesses) {
    max_layer = std::max(max_layer, a.layer);
    for (uint32_t e : a.experts) max_expert = std::max(max_expert, e);
    if (!a.prefill) max_k = std::max<uint32_t>(max_k, static_cast<uint32_t>(a.experts.size()));
  }
  t.num_layers = std::max(t.num_layers, max_layer + 1);
  t.num_experts = std::max(t.num_experts, max_expert + 1);
  if (t.top_k == 0) t.top_k = max_k;
  if (t.object_bytes.size() < t.num_layers) {
    const uint64_t fill = t.object_bytes.empty() ? (1u << 20) : t.max_object_bytes();
    t.object_bytes.resize(t.num_layers, fill);
  }
  for (auto &b : t.object_bytes)
    if (b == 0) b = t.max_object_bytes();
}

Trace read_route_csv(std::istream &in, const std::string &path, TracePhases phases) {
  Trace t;
  t.name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  std::string line;
  std::size_t line_no = 0;
  bool header_seen = false;
  // Current (phase, step, layer) cell.
  int64_t cur_phase = -1, cur_step = -1, cur_layer = -1;
  TraceAccess cell;
  std::map<uint32_t, std::size_t> prefill_access;  // layer → index in accesses
  std::map<uint32_t, uint32_t> prefill_tokens;
  auto flush = [&] {
    if (cur_layer < 0) return;
    if (cell.prefill) {
      if (phases == TracePhases::all) {
        auto it = prefill_access.find(cell.layer);
        if (it == prefill_access.end()) {
          prefill_access[cell.layer] = t.accesses.size();
          t.accesses.push_back(cell);
        } else {
          auto &dst = t.accesses[it->second].experts;
          dst.insert(dst.end(), cell.experts.begin(), cell.experts.end());
        }
        ++prefill_tokens[cell.layer];
      }
    } else {
      t.accesses.push_back(cell);
    }
    cell = TraceAccess{};
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      uint64_t v = 0, layer = 0, bytes = 0;
      if (field(line, "n_layer", v)) t.num_layers = static_cast<uint32_t>(v);
      if (field(line, "n_expert", v)) t.num_experts = static_cast<uint32_t>(v);
      if (field(line, "n_expert_used", v)) t.top_k = static_cast<uint32_t>(v);
      if (field(line, "layer", layer) && field(line, "expert_bytes", bytes)) {
        if (t.object_bytes.size() <= layer) t.object_bytes.resize(layer + 1, 0);
        t.object_bytes[layer] = bytes;
      }
      continue;
    }
    if (!header_seen) {
      if (line.rfind("turn,phase,step,layer,slot,expert", 0) != 0)
        fail(Status::format, "{}:{}: expected the header 'turn,phase,step,layer,slot,expert,...', found '{}'",
             path, line_no, line.substr(0, 80));
      header_seen = true;
      continue;
    }
    const auto cols = split(line, ',');
    if (cols.size() < 6) fail(Status::format, "{}:{}: expected at least 6 columns, found {}", path, line_no, cols.size());
    const auto phase = static_cast<int64_t>(number(cols[1], path, line_no));
    const auto step = static_cast<int64_t>(number(cols[2], path, line_no));
    const auto layer = static_cast<int64_t>(number(cols[3], path, line_no));
    const auto expert = static_cast<uint32_t>(number(cols[5], path, line_no));
    if (phase != cur_phase || step != cur_step || layer != cur_layer) {
      flush();
      cur_phase = phase;
      cur_step = step;
      cur_layer = layer;
      cell.layer = static_cast<uint32_t>(layer);
      cell.prefill = phase == 0;
    }
    cell.experts.push_back(expert);
  }
  flush();
  if (!header_seen) fail(Status::format, "{}: no header line: not a route_trace v1 CSV", path);
  for (auto &[layer, tokens] : prefill_tokens) t.tokens_per_acquire = std::max(t.tokens_per_acquire, tokens);
  finish(t, path);
  return t;
}

Trace read_store_trace(std::istream &in, const std::string &path) {
  Trace t;
  t.name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  std::string line;
  std::size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty()) continue;
    if (line[0] == '#') {
      uint64_t v = 0, layer = 0;
      if (field(line, "num_layers", v)) t.num_layers = static_cast<uint32_t>(v);
      if (field(line, "num_experts", v)) t.num_experts = static_cast<uint32_t>(v);
      if (field(line, "top_k", v)) t.top_k = static_cast<uint32_t>(v);
      if (field(line, "tokens_per_acquire", v)) t.tokens_per_acquire = static_cast<uint32_t>(v);
      if (field(line, "layer", layer) && field(line, "object_bytes", v)) {
        if (t.object_bytes.size() <= layer) t.object_bytes.resize(layer + 1, 0);
        t.object_bytes[layer] = v;
      }
      continue;
    }
    if (line.rfind("layer,", 0) == 0) continue;  // header
    const auto cols = split(line, ',');
    if (cols.size() != 2) fail(Status::format, "{}:{}: expected 'layer,experts', found '{}'", path, line_no, line.substr(0, 80));
    TraceAccess a;
    a.layer = static_cast<uint32_t>(number(cols[0], path, line_no));
    for (auto id : split(cols[1], ' '))
      if (!id.empty()) a.experts.push_back(static_cast<uint32_t>(number(id, path, line_no)));
    if (a.experts.empty()) fail(Status::format, "{}:{}: an access without experts", path, line_no);
    t.accesses.push_back(std::move(a));
  }
  finish(t, path);
  return t;
}

}  // namespace

uint64_t Trace::max_object_bytes() const {
  uint64_t m = 0;
  for (uint64_t b : object_bytes) m = std::max(m, b);
  return m;
}

uint64_t Trace::object_bytes_of(uint32_t layer) const {
  return layer < object_bytes.size() ? object_bytes[layer] : max_object_bytes();
}

Trace read_trace(const std::string &path, TracePhases phases) {
  std::ifstream in(path);
  if (!in) fail(Status::not_found, "{}: cannot open the trace", path);
  std::string first;
  std::getline(in, first);
  in.clear();
  in.seekg(0);
  if (first.rfind("# ep_store_trace v1", 0) == 0) return read_store_trace(in, path);
  if (first.rfind("# route_trace v1", 0) == 0) return read_route_csv(in, path, phases);
  fail(Status::format, "{}: the first line '{}' is neither '# route_trace v1' nor '# ep_store_trace v1'",
       path, first.substr(0, 80));
}

SyntheticTraceOptions::Kind parse_synthetic_kind(const std::string &name) {
  if (name == "uniform") return SyntheticTraceOptions::Kind::uniform;
  if (name == "zipf") return SyntheticTraceOptions::Kind::zipf;
  if (name == "zipf-temporal" || name == "zipf_temporal") return SyntheticTraceOptions::Kind::zipf_temporal;
  fail(Status::invalid_argument, "synthetic trace '{}' is not one of uniform, zipf, zipf-temporal", name);
}

Trace synthetic_trace(const SyntheticTraceOptions &o) {
  if (o.num_layers == 0 || o.num_experts == 0 || o.top_k == 0 || o.top_k > o.num_experts)
    fail(Status::invalid_argument, "synthetic trace: need layers > 0 and 0 < top_k {} <= experts {}", o.top_k,
         o.num_experts);
  Trace t;
  const char *kind_name = o.kind == SyntheticTraceOptions::Kind::uniform ? "uniform"
                          : o.kind == SyntheticTraceOptions::Kind::zipf  ? "zipf"
                                                                         : "zipf-temporal";
  t.name = std::string("synthetic-") + kind_name;
  t.num_layers = o.num_layers;
  t.num_experts = o.num_experts;
  t.top_k = o.top_k;
  t.object_bytes.assign(o.num_layers, o.object_bytes);
  std::mt19937_64 rng(o.seed);
  // Per layer: which expert has popularity rank r (a random permutation).
  std::vector<std::vector<uint32_t>> rank_to_expert(o.num_layers);
  for (auto &perm : rank_to_expert) {
    perm.resize(o.num_experts);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), rng);
  }
  std::vector<double> cdf(o.num_experts);
  double sum = 0;
  for (uint32_t r = 0; r < o.num_experts; ++r) {
    sum += 1.0 / std::pow(static_cast<double>(r + 1), o.zipf_s);
    cdf[r] = sum;
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::vector<uint32_t>> previous(o.num_layers);
  for (uint32_t token = 0; token < o.tokens; ++token) {
    for (uint32_t layer = 0; layer < o.num_layers; ++layer) {
      TraceAccess a;
      a.layer = layer;
      std::vector<char> taken(o.num_experts, 0);
      while (a.experts.size() < o.top_k) {
        uint32_t e;
        if (o.kind == SyntheticTraceOptions::Kind::uniform) {
          e = static_cast<uint32_t>(std::uniform_int_distribution<uint32_t>(0, o.num_experts - 1)(rng));
        } else if (o.kind == SyntheticTraceOptions::Kind::zipf_temporal && !previous[layer].empty() &&
                   unit(rng) < o.temporal_repeat) {
          const auto &prev = previous[layer];
          e = prev[std::uniform_int_distribution<std::size_t>(0, prev.size() - 1)(rng)];
        } else {
          const double x = unit(rng) * sum;
          const auto r = static_cast<uint32_t>(std::lower_bound(cdf.begin(), cdf.end(), x) - cdf.begin());
          e = rank_to_expert[layer][std::min(r, o.num_experts - 1)];
        }
        if (taken[e]) continue;
        taken[e] = 1;
        a.experts.push_back(e);
      }
      previous[layer] = a.experts;
      t.accesses.push_back(std::move(a));
    }
  }
  return t;
}

void write_trace(const Trace &trace, const std::string &path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail(Status::io, "{}: cannot create the trace file", tmp);
    out << "# ep_store_trace v1\n";
    out << "# num_layers=" << trace.num_layers << " num_experts=" << trace.num_experts
        << " top_k=" << trace.top_k << " tokens_per_acquire=" << trace.tokens_per_acquire << "\n";
    for (std::size_t l = 0; l < trace.object_bytes.size(); ++l)
      out << "# layer=" << l << " object_bytes=" << trace.object_bytes[l] << "\n";
    out << "layer,experts\n";
    for (const auto &a : trace.accesses) {
      out << a.layer << ',';
      for (std::size_t i = 0; i < a.experts.size(); ++i) out << (i ? " " : "") << a.experts[i];
      out << '\n';
    }
    if (!out.flush()) fail(Status::io, "{}: write failed", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail_errno(errno, "rename " + tmp + " to " + path);
}

}  // namespace ep::cache
