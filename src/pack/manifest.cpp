#include "pack/manifest.hpp"

#include "core/error.hpp"
#include "format/hash.hpp"

#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

namespace ep::pack {

std::string manifest_path(const std::string &pack_path) { return pack_path + ".json"; }

nlohmann::json Manifest::to_json() const {
  nlohmann::json j;
  j["format"] = "expertpack-manifest";
  j["version"] = version;
  j["generation"] = generation;
  j["created_utc"] = created_utc;
  j["pack"] = {{"file", pack_file}, {"size", pack_size}};
  j["identity"] = {{"source_files_sha256", source_files_sha256},
                   {"model_identity_sha256", model_identity_sha256},
                   {"config_sha256", config_sha256}};
  nlohmann::json srcs = nlohmann::json::array();
  for (const ManifestSource &s : sources)
    srcs.push_back({{"path", s.path}, {"size", s.size}, {"mtime_ns", s.mtime_ns}, {"digest", s.digest}});
  j["sources"] = srcs;
  j["config"] = config;
  j["build"] = build.is_null() ? nlohmann::json::object() : build;
  return j;
}

namespace {

const nlohmann::json &field(const nlohmann::json &j, const char *key, const std::string &name) {
  if (!j.is_object() || !j.contains(key)) fail(Status::format, "{}: manifest lacks \"{}\"", name, key);
  return j[key];
}

std::string str_field(const nlohmann::json &j, const char *key, const std::string &name) {
  const auto &v = field(j, key, name);
  if (!v.is_string()) fail(Status::format, "{}: manifest field \"{}\" is not a string", name, key);
  return v.get<std::string>();
}

uint64_t uint_field(const nlohmann::json &j, const char *key, const std::string &name) {
  const auto &v = field(j, key, name);
  if (!v.is_number_unsigned()) fail(Status::format, "{}: manifest field \"{}\" is not an unsigned integer", name, key);
  return v.get<uint64_t>();
}

std::string digest_field(const nlohmann::json &j, const char *key, const std::string &name) {
  std::string s = str_field(j, key, name);
  if (s.size() != 64 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail(Status::format, "{}: manifest field \"{}\" is not a 64-digit lower-case hex SHA-256", name, key);
  return s;
}

}  // namespace

Manifest Manifest::parse(const std::string &text, const std::string &name) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(Status::format, "{}: the manifest is not a JSON object", name);
  if (str_field(j, "format", name) != "expertpack-manifest")
    fail(Status::format, "{}: manifest \"format\" is not \"expertpack-manifest\"", name);
  Manifest m;
  m.version = static_cast<uint32_t>(uint_field(j, "version", name));
  if (m.version != 1) fail(Status::version, "{}: unsupported manifest version {} (this library reads 1)", name, m.version);
  m.generation = uint_field(j, "generation", name);
  m.created_utc = str_field(j, "created_utc", name);
  const auto &pack = field(j, "pack", name);
  m.pack_file = str_field(pack, "file", name);
  m.pack_size = uint_field(pack, "size", name);
  const auto &id = field(j, "identity", name);
  m.source_files_sha256 = digest_field(id, "source_files_sha256", name);
  m.model_identity_sha256 = digest_field(id, "model_identity_sha256", name);
  m.config_sha256 = digest_field(id, "config_sha256", name);
  const auto &srcs = field(j, "sources", name);
  if (!srcs.is_array()) fail(Status::format, "{}: manifest \"sources\" is not an array", name);
  for (const auto &s : srcs) {
    ManifestSource ms;
    ms.path = str_field(s, "path", name);
    ms.size = uint_field(s, "size", name);
    const auto &mt = field(s, "mtime_ns", name);
    if (!mt.is_number_integer()) fail(Status::format, "{}: manifest source mtime_ns is not an integer", name);
    ms.mtime_ns = mt.get<int64_t>();
    ms.digest = digest_field(s, "digest", name);
    m.sources.push_back(std::move(ms));
  }
  m.config = field(j, "config", name);
  if (!m.config.is_object()) fail(Status::format, "{}: manifest \"config\" is not an object", name);
  if (j.contains("build")) m.build = j["build"];
  return m;
}

Manifest Manifest::load(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::not_found, "{}: manifest missing", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

void check_manifest_matches(const Manifest &m, const format::PackFile &pack, const std::string &name) {
  const auto &h = pack.header();
  auto same = [](const std::string &hex, const uint8_t *d) { return hex == format::to_hex(d, 32); };
  if (m.pack_size != pack.file_size() || !same(m.source_files_sha256, h.source_files_sha256) ||
      !same(m.model_identity_sha256, h.model_identity_sha256) || !same(m.config_sha256, h.config_sha256))
    fail(Status::stale, "{}: manifest does not match the pack {} (identity digests or size differ: rebuilt pack or stale "
         "manifest)", name, pack.path());
  const std::string dumped = m.config.dump();
  const format::Sha256 c = format::sha256(dumped.data(), dumped.size());
  if (format::hex(c) != m.config_sha256)
    fail(Status::corrupt, "{}: manifest config does not hash to its config_sha256", name);
}

void check_sources(const Manifest &m) {
  for (const ManifestSource &s : m.sources) {
    struct stat st {};
    if (::stat(s.path.c_str(), &st) != 0)
      fail(Status::not_found, "source missing: {} (recorded in the manifest; {})", s.path, std::strerror(errno));
    const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (static_cast<uint64_t>(st.st_size) != s.size || mtime != s.mtime_ns)
      fail(Status::stale, "source changed: {}: size {} mtime_ns {} at build time, now size {} mtime_ns {}", s.path,
           s.size, s.mtime_ns, st.st_size, mtime);
  }
}

}  // namespace ep::pack
