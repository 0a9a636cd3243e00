#include "testkit/store_pack.hpp"

#include "core/error.hpp"
#include "io/file.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ep::testkit {
namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
constexpr char kMagic[] = "ep-synthetic-pack v1";

inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string header_text(const SyntheticPackSpec &s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s layers=%u experts=%u object_bytes=%llu seed=%llu\n", kMagic,
                s.num_layers, s.num_experts, static_cast<unsigned long long>(s.object_bytes),
                static_cast<unsigned long long>(s.seed));
  return buf;
}

}  // namespace

uint64_t SyntheticPackSpec::stride() const { return io::align_up(object_bytes, io::kDirectAlignment); }

uint64_t SyntheticPackSpec::file_bytes() const {
  return kDataStart + static_cast<uint64_t>(num_layers) * num_experts * stride();
}

std::shared_ptr<store::UniformObjectMap> SyntheticPackSpec::object_map() const {
  return std::make_shared<store::UniformObjectMap>(num_layers, num_experts, object_bytes, stride(), kDataStart);
}

SyntheticPackSpec SyntheticPackSpec::for_size(uint64_t total_bytes, uint64_t object_bytes, uint32_t num_experts,
                                              uint64_t seed) {
  SyntheticPackSpec s;
  s.object_bytes = object_bytes;
  s.seed = seed;
  // At least total_bytes of objects; fewer experts per layer when that is smaller than a layer.
  const uint64_t objects = std::max<uint64_t>(1, (total_bytes + s.stride() - 1) / s.stride());
  s.num_experts = static_cast<uint32_t>(std::min<uint64_t>(std::max<uint32_t>(1, num_experts), objects));
  s.num_layers = static_cast<uint32_t>((objects + s.num_experts - 1) / s.num_experts);
  return s;
}

void fill_synthetic_object(const SyntheticPackSpec &spec, uint32_t layer, uint32_t expert, std::span<std::byte> out) {
  const uint64_t base = mix(spec.seed ^ mix((static_cast<uint64_t>(layer) << 32 | expert) + 1));
  const std::size_t words = out.size() / 8;
  auto *p = out.data();
  for (std::size_t i = 0; i < words; ++i) {
    const uint64_t v = mix(base + (i + 1) * kGamma);
    std::memcpy(p + i * 8, &v, 8);
  }
  const uint64_t tail = mix(base + (words + 1) * kGamma);
  std::memcpy(p + words * 8, &tail, out.size() - words * 8);
}

uint64_t synthetic_object_hash(const SyntheticPackSpec &spec, uint32_t layer, uint32_t expert) {
  std::vector<std::byte> buf(spec.object_bytes);
  fill_synthetic_object(spec, layer, expert, buf);
  return XXH3_64bits(buf.data(), buf.size());
}

std::optional<SyntheticPackSpec> read_synthetic_header(const std::string &path) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return std::nullopt;
  char buf[256] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  if (n < sizeof kMagic || std::strncmp(buf, kMagic, sizeof kMagic - 1) != 0) return std::nullopt;
  SyntheticPackSpec s;
  unsigned long long object_bytes = 0, seed = 0;
  if (std::sscanf(buf + sizeof kMagic - 1, " layers=%u experts=%u object_bytes=%llu seed=%llu", &s.num_layers,
                  &s.num_experts, &object_bytes, &seed) != 4)
    return std::nullopt;
  s.object_bytes = object_bytes;
  s.seed = seed;
  if (s.num_layers == 0 || s.num_experts == 0 || s.object_bytes == 0) return std::nullopt;
  return s;
}

bool create_synthetic_pack(const std::string &path, const SyntheticPackSpec &spec, unsigned threads) {
  if (auto existing = read_synthetic_header(path)) {
    if (existing->num_layers == spec.num_layers && existing->num_experts == spec.num_experts &&
        existing->object_bytes == spec.object_bytes && existing->seed == spec.seed &&
        io::file_size_bytes(path) == spec.file_bytes())
      return false;
  }
  const std::string tmp = path + ".tmp";
  io::FileHandle fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) fail_errno(errno, "create synthetic pack " + tmp);
  if (::ftruncate(fd.get(), static_cast<off_t>(spec.file_bytes())) != 0)
    fail_errno(errno, "ftruncate " + tmp);
  const uint64_t objects = static_cast<uint64_t>(spec.num_layers) * spec.num_experts;
  std::atomic<uint64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto writer = [&] {
    try {
      std::vector<std::byte> buf(spec.stride());
      for (uint64_t i; (i = next.fetch_add(1)) < objects;) {
        const auto layer = static_cast<uint32_t>(i / spec.num_experts);
        const auto expert = static_cast<uint32_t>(i % spec.num_experts);
        fill_synthetic_object(spec, layer, expert, std::span(buf.data(), spec.object_bytes));
        const uint64_t offset = SyntheticPackSpec::kDataStart + i * spec.stride();
        std::size_t done = 0;
        while (done < buf.size()) {
          const ssize_t w = ::pwrite(fd.get(), buf.data() + done, buf.size() - done, static_cast<off_t>(offset + done));
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) fail_errno(w < 0 ? errno : EIO, "write synthetic pack " + tmp);
          done += static_cast<std::size_t>(w);
        }
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(objects);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, threads); ++t) pool.emplace_back(writer);
  for (auto &t : pool) t.join();
  if (error) {
    ::unlink(tmp.c_str());
    std::rethrow_exception(error);
  }
  std::vector<char> header(SyntheticPackSpec::kDataStart, 0);
  const std::string text = header_text(spec);
  std::memcpy(header.data(), text.data(), text.size());
  if (::pwrite(fd.get(), header.data(), header.size(), 0) != static_cast<ssize_t>(header.size()))
    fail_errno(errno, "write synthetic pack header " + tmp);
  if (::fsync(fd.get()) != 0) fail_errno(errno, "fsync " + tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail_errno(errno, "rename " + tmp + " to " + path);
  return true;
}

uint64_t parse_size(const std::string &text) {
  if (text.empty()) fail(Status::invalid_argument, "empty size");
  char *end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v < 0) fail(Status::invalid_argument, "size '{}' is not a number", text);
  double mult = 1;
  std::string unit(end);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && unit.back() == 'i') unit.pop_back();
  if (unit == "" ) mult = 1;
  else if (unit == "K" || unit == "k") mult = 1024.0;
  else if (unit == "M" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else fail(Status::invalid_argument, "size '{}': unknown unit '{}' (use K, M, G, T)", text, unit);
  return static_cast<uint64_t>(std::llround(v * mult));
}

}  // namespace ep::testkit
