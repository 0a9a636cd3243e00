#include "cache/trace.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
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

std::vector<LayerSkew> routing_skew(const Trace &trace) {
  std::vector<std::vector<uint64_t>> counts(trace.num_layers, std::vector<uint64_t>(trace.num_experts, 0));
  for (const TraceAccess &a : trace.accesses)
    for (uint32_t e : a.experts)
      if (a.layer < trace.num_layers && e < trace.num_experts) ++counts[a.layer][e];
  std::vector<LayerSkew> out;
  const size_t top = std::max<size_t>(1, static_cast<size_t>(std::lround(0.1 * trace.num_experts)));
  for (uint32_t l = 0; l < trace.num_layers; ++l) {
    std::vector<uint64_t> c = counts[l];
    uint64_t total = 0;
    for (uint64_t v : c) total += v;
    if (total == 0) continue;
    LayerSkew s;
    s.layer = l;
    s.picks = total;
    double h = 0.0;
    for (uint64_t v : c)
      if (v) {
        const double p = static_cast<double>(v) / static_cast<double>(total);
        h -= p * std::log2(p);
      }
    s.entropy_ratio = trace.num_experts > 1 ? h / std::log2(static_cast<double>(trace.num_experts)) : 0.0;
    std::sort(c.begin(), c.end(), std::greater<>());
    uint64_t head = 0;
    for (size_t i = 0; i < std::min(top, c.size()); ++i) head += c[i];
    s.top_share = static_cast<double>(head) / static_cast<double>(total);
    out.push_back(s);
  }
  return out;
}

}  // namespace ep::cache
