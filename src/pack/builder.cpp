#include "pack/builder.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "expertpack/build_config.h"
#include "format/byte_source.hpp"
#include "format/hash.hpp"
#include "format/microscale.hpp"
#include "format/pack_file.hpp"
#include "pack/manifest.hpp"
#include "pack/source_index.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <mutex>
#include <sys/file.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace ep::pack {
namespace fs = std::filesystem;
using format::PackEntry;
using format::PackHeader;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// flock on <pack>.lock, robust against a concurrent unlink (the inode check).
class BuildLock {
 public:
  explicit BuildLock(std::string path) : path_(std::move(path)) {
    for (int attempt = 0; attempt < 8; ++attempt) {
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0) fail_errno(errno, "create lock file " + path_);
      if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        ::close(fd_);
        fd_ = -1;
        if (e == EWOULDBLOCK)
          fail(Status::busy, "{}: another builder holds the lock (a pack is being built to this path)", path_);
        fail_errno(e, "flock " + path_);
      }
      struct stat a {}, b {};
      if (::fstat(fd_, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) return;
      ::close(fd_);  // the file we locked was unlinked by the previous holder: retry
      fd_ = -1;
    }
    fail(Status::busy, "{}: could not acquire the build lock", path_);
  }
  ~BuildLock() {
    if (fd_ >= 0) {
      ::unlink(path_.c_str());
      ::close(fd_);
    }
  }
  BuildLock(const BuildLock &) = delete;
  BuildLock &operator=(const BuildLock &) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

/// Removes a file on scope exit unless released.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFile(const TempFile &) = delete;
  TempFile &operator=(const TempFile &) = delete;
  const std::string &path() const { return path_; }
  void release() { path_.clear(); }

 private:
  std::string path_;
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

template <typename T>
void put(format::Sha256Hasher &h, T v) {
  h.update(&v, sizeof v);
}

/// Reads the slices in order on a background thread into a small ring of buffers and hashes
/// them there (SHA-256 and XXH3), so reading and hashing the source overlap writing the pack.
class SliceReader {
 public:
  struct Chunk {
    size_t slice;
    uint64_t offset_in_slice;
    std::vector<uint8_t> bytes;
  };
  struct Digest {
    format::Sha256 sha256{};
    uint64_t xxh3 = 0;
  };
  /// Digest of slice @p s; valid once next() returned the slice's last chunk.
  const Digest &digest(size_t s) const { return digests_[s]; }

  SliceReader(const ExpertPlan &plan, const std::vector<std::unique_ptr<format::FileSource>> &files, size_t chunk_bytes)
      : plan_(plan), files_(files), chunk_bytes_(chunk_bytes), digests_(plan.slices.size()), thread_([this] { run(); }) {}
  ~SliceReader() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// The next chunk in order; throws what the reader thread hit.
  Chunk next() {
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [&] { return !ready_.empty() || error_; });
    if (ready_.empty() && error_) std::rethrow_exception(error_);
    Chunk c = std::move(ready_.front());
    ready_.pop_front();
    cv_.notify_all();
    return c;
  }
  /// Returns a buffer for reuse.
  void recycle(std::vector<uint8_t> &&buffer) {
    std::lock_guard<std::mutex> g(mu_);
    free_.push_back(std::move(buffer));
    cv_.notify_all();
  }

 private:
  void run() {
    try {
      for (size_t s = 0; s < plan_.slices.size(); ++s) {
        const ExpertSlice &slice = plan_.slices[s];
        format::Sha256Hasher sha;
        format::Xxh3Hasher xxh;
        if (slice.layout == format::SourceLayout::fp4_e8m0) {
          run_fp4(s, slice);
          continue;
        }
        for (uint64_t off = 0; off < slice.nbytes || (slice.nbytes == 0 && off == 0);) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, slice.nbytes - off));
          std::vector<uint8_t> buf;
          {
            std::unique_lock<std::mutex> g(mu_);
            cv_.wait(g, [&] { return stop_ || ready_.size() < kDepth; });
            if (stop_) return;
            if (!free_.empty()) {
              buf = std::move(free_.back());
              free_.pop_back();
            }
          }
          buf.resize(n);
          files_[slice.file]->read(slice.offset + off, buf.data(), n);
          sha.update(buf.data(), n);
          xxh.update(buf.data(), n);
          if (off + n == slice.nbytes) digests_[s] = Digest{sha.finish(), xxh.finish()};  // before publishing
          {
            std::lock_guard<std::mutex> g(mu_);
            ready_.push_back(Chunk{s, off, std::move(buf)});
          }
          cv_.notify_all();
          off += n;
          if (n == 0) break;
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> g(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }

  /// An FP4 expert role: its values and scales read whole, hashed as they are in the source,
  /// re-laid into MXFP4 blocks (format/microscale.hpp), then handed out in chunks.
  void run_fp4(size_t s, const ExpertSlice &slice) {
    const auto &f = *files_[slice.file];
    std::vector<uint8_t> values(static_cast<size_t>(slice.source_nbytes)), scales(static_cast<size_t>(slice.scale_nbytes));
    f.read(slice.offset, values.data(), values.size());
    files_[slice.scale_file]->read(slice.scale_offset, scales.data(), scales.size());
    format::Sha256Hasher sha;
    sha.update(values.data(), values.size());
    sha.update(scales.data(), scales.size());
    const uint64_t rows = slice.ne[1], cols = slice.ne[0];
    if (values.size() != rows * cols / 2 || scales.size() != rows * cols / 32 || slice.nbytes != format::mxfp4_bytes(rows, cols))
      fail(Status::internal, "{}: FP4 slice of {} x {} with {} value and {} scale bytes", slice.tensor, rows, cols, values.size(),
           scales.size());
    std::vector<uint8_t> payload(static_cast<size_t>(slice.nbytes));
    format::fp4_e8m0_to_mxfp4(values.data(), scales.data(), rows, cols, payload.data(),
                              fmt::format("{}: tensor '{}' at offset {} with scales '{}' at offset {} of {}", f.name(), slice.tensor,
                                          slice.offset, slice.scale_tensor, slice.scale_offset, files_[slice.scale_file]->name()));
    digests_[s] = Digest{sha.finish(), format::xxh3_64(payload.data(), payload.size())};
    for (uint64_t off = 0; off < slice.nbytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, slice.nbytes - off));
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stop_ || ready_.size() < kDepth; });
        if (stop_) return;
        ready_.push_back(Chunk{s, off, std::vector<uint8_t>(payload.begin() + static_cast<std::ptrdiff_t>(off),
                                                            payload.begin() + static_cast<std::ptrdiff_t>(off + n))});
      }
      cv_.notify_all();
      off += n;
    }
  }

  static constexpr size_t kDepth = 4;
  const ExpertPlan &plan_;
  const std::vector<std::unique_ptr<format::FileSource>> &files_;
  size_t chunk_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> ready_;
  std::vector<std::vector<uint8_t>> free_;
  std::exception_ptr error_;
  std::vector<Digest> digests_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace

BuildResult build_pack(const std::vector<std::string> &sources, const std::string &pack_path,
                       const BuildOptions &options) {
  return build_pack(plan_sources(sources), pack_path, options);
}

BuildResult build_pack(const ExpertPlan &plan, const std::string &pack_path, const BuildOptions &options) {
  const auto t0 = Clock::now();
  const uint32_t align = options.alignment;
  if (align < format::kPackMinAlignment || align > format::kPackMaxAlignment || (align & (align - 1)) != 0)
    fail(Status::invalid_argument, "pack alignment {} is not a power of two in [{}, {}]", align,
         format::kPackMinAlignment, format::kPackMaxAlignment);
  if (plan.num_layers == 0 || plan.num_experts == 0 ||
      plan.slices.size() != static_cast<size_t>(plan.num_layers) * plan.num_experts * 3)
    fail(Status::invalid_argument, "expert plan is empty or inconsistent");

  const fs::path out = fs::absolute(pack_path).lexically_normal();
  const std::string dir = out.parent_path().string();
  const std::string base = out.filename().string();
  BuildLock lock(out.string() + ".lock");
  // Temporaries of builders that died (killed, power loss) before renaming: every builder takes
  // the lock before creating its temporaries, so under the lock no live builder owns any.
  {
    std::error_code ec;
    uint64_t removed = 0, removed_bytes = 0;
    const std::string pack_prefix = "." + base + ".tmp-", manifest_prefix = "." + base + ".json.tmp-";
    for (const auto &e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(pack_prefix, 0) != 0 && name.rfind(manifest_prefix, 0) != 0) continue;
      const uint64_t bytes = e.is_regular_file(ec) ? e.file_size(ec) : 0;
      if (fs::remove(e.path(), ec)) {
        ++removed;
        removed_bytes += bytes;
      }
    }
    if (removed) log::warn("{}: removed {} temporary file(s) ({} bytes) left by an interrupted build", out.string(), removed, removed_bytes);
  }

  // Striping: part k of N is <stripe_dirs[k]>/<pack name>.part<k>.
  const uint32_t num_parts = static_cast<uint32_t>(options.stripe_dirs.size());
  if (options.source_index && num_parts)
    fail(Status::invalid_argument, "{}: a source index has no objects to stripe", out.string());
  if (num_parts == 1 || num_parts > format::kPackMaxParts)
    fail(Status::invalid_argument, "{}: striping needs 2..{} directories, {} given", out.string(), format::kPackMaxParts, num_parts);
  std::vector<std::string> part_paths;
  for (uint32_t k = 0; k < num_parts; ++k) {
    const fs::path d = fs::absolute(options.stripe_dirs[k]).lexically_normal();
    std::error_code ec;
    if (!fs::is_directory(d, ec))
      fail(Status::not_found, "{}: stripe directory {} (part {}) does not exist or is not a directory", out.string(), d.string(), k);
    part_paths.push_back((d / fmt::format("{}.part{}", base, k)).string());
    const std::string prefix = fmt::format(".{}.part{}.tmp-", base, k);
    for (const auto &e : fs::directory_iterator(d, ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) fs::remove(e.path(), ec);
  }

  for (const SourceFile &f : plan.files) {
    const fs::path src = fs::absolute(f.path).lexically_normal();
    if (src == out) fail(Status::invalid_argument, "{}: the pack would overwrite its own source", out.string());
    for (const std::string &p : part_paths)
      if (src == fs::path(p)) fail(Status::invalid_argument, "{}: a part would overwrite the source {}", out.string(), p);
  }

  // ---- layout ----
  const uint64_t num_objects = static_cast<uint64_t>(plan.num_layers) * plan.num_experts;
  std::vector<std::array<uint64_t, 3>> in_obj(num_objects);
  uint64_t max_obj = 0;
  for (uint64_t o = 0; o < num_objects; ++o) {
    uint64_t end = 0;
    for (int r = 0; r < 3; ++r) {
      const ExpertSlice &s = plan.slices[o * 3 + r];
      in_obj[o][r] = r == 0 ? 0 : format::align_up(end, format::kPackRoleAlignment);
      end = in_obj[o][r] + s.nbytes;
    }
    max_obj = std::max(max_obj, end);
  }
  const uint64_t stride = std::max<uint64_t>(format::align_up(max_obj, align), align);

  // String table: source paths and tensor names, deduplicated.
  std::vector<uint8_t> strings;
  std::map<std::string, uint32_t> string_ids;
  auto intern = [&](const std::string &s) {
    auto it = string_ids.find(s);
    if (it != string_ids.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(strings.size());
    strings.insert(strings.end(), s.begin(), s.end());
    strings.push_back(0);
    string_ids.emplace(s, id);
    return id;
  };
  std::vector<PackEntry> entries(plan.slices.size());
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const ExpertSlice &s = plan.slices[i];
    PackEntry &e = entries[i];
    std::memset(&e, 0, sizeof e);
    e.layer = static_cast<uint32_t>(i / 3 / plan.num_experts);
    e.expert = static_cast<uint32_t>(i / 3 % plan.num_experts);
    e.role = static_cast<uint32_t>(i % 3);
    e.ggml_type = static_cast<uint32_t>(s.type);
    e.n_dims = s.n_dims;
    e.source_file = intern(plan.files[s.file].path);
    e.source_tensor = intern(s.tensor);
    for (int d = 0; d < 4; ++d) e.ne[d] = s.ne[d];
    e.source_offset = s.offset;
    e.source_layout = static_cast<uint32_t>(s.layout);
    e.nbytes = s.nbytes;
  }
  PackHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, format::kPackMagic.data(), 8);
  h.version = format::kPackVersion;
  h.header_size = sizeof(PackHeader);
  h.entry_size = sizeof(PackEntry);
  h.num_layers = plan.num_layers;
  h.num_experts = plan.num_experts;
  h.num_roles = format::kPackNumRoles;
  h.top_k = plan.top_k;
  h.alignment = align;
  h.first_layer = plan.first_layer;
  h.index_offset = sizeof(PackHeader);
  h.index_size = entries.size() * sizeof(PackEntry);
  if (num_parts) {
    // The part paths go into the string table, consecutively (PackHeader::parts_string).
    h.flags |= format::kPackFlagStriped;
    h.num_parts = num_parts;
    h.parts_string = static_cast<uint32_t>(strings.size());
    for (const std::string &p : part_paths) {
      strings.insert(strings.end(), p.begin(), p.end());
      strings.push_back(0);
    }
  }
  h.strings_offset = h.index_offset + h.index_size;
  h.strings_size = strings.size();
  h.data_start = format::align_up(h.strings_offset + h.strings_size, align);
  h.object_stride = stride;
  if (options.source_index) h.flags |= format::kPackFlagSourceObjects;
  h.file_size = num_parts || options.source_index ? h.data_start : h.data_start + num_objects * stride;
  for (uint64_t o = 0; o < num_objects; ++o)
    for (int r = 0; r < 3; ++r) entries[o * 3 + r].pack_offset = h.data_start + o * stride + in_obj[o][r];

  // ---- copy ----
  std::vector<std::unique_ptr<format::FileSource>> files;
  std::vector<format::Sha256> file_digests;
  for (const SourceFile &f : plan.files) {
    files.push_back(std::make_unique<format::FileSource>(f.path));
    ::posix_fadvise(files.back()->fd(), 0, 0, POSIX_FADV_SEQUENTIAL);  // a hint: failure is harmless
    if (files.back()->size() != f.size || files.back()->mtime_ns() != f.mtime_ns)
      fail(Status::stale, "source changed: {} changed between planning and building", f.path);
  }

  TempFile temp(dir + "/." + base + ".tmp-" + std::to_string(::getpid()));
  std::unique_ptr<format::OutputFile> outf = format::create_output_file(temp.path(), /*exclusive=*/false);
  if (options.wrap_output) outf = options.wrap_output(std::move(outf));
  // Zeros where the header goes: an interrupted file has no magic and never opens as a pack.
  outf->write_zeros(h.data_start);
  // Where object o's bytes go: the pack file, or part o mod N (each part written sequentially).
  std::vector<std::unique_ptr<TempFile>> part_temps;
  std::vector<std::unique_ptr<format::OutputFile>> part_out;
  for (uint32_t k = 0; k < num_parts; ++k) {
    const fs::path pp(part_paths[k]);
    part_temps.push_back(
        std::make_unique<TempFile>((pp.parent_path() / fmt::format(".{}.tmp-{}", pp.filename().string(), ::getpid())).string()));
    part_out.push_back(format::create_output_file(part_temps.back()->path(), /*exclusive=*/false));
    if (options.wrap_output) part_out.back() = options.wrap_output(std::move(part_out.back()));
  }
  auto output_of = [&](uint64_t object) -> format::OutputFile & {
    return num_parts ? *part_out[static_cast<size_t>(object % num_parts)] : *outf;
  };

  const uint64_t total = plan.payload_bytes();
  uint64_t done = 0;
  const auto copy_t0 = Clock::now();
  {
    SliceReader reader(plan, files, options.chunk_bytes);
    auto finish_slice = [&](size_t s) {
      const SliceReader::Digest &d = reader.digest(s);
      std::memcpy(entries[s].source_sha256, d.sha256.data(), 32);
      entries[s].payload_xxh3 = d.xxh3;
      const uint64_t o = s / 3;
      const int r = static_cast<int>(s % 3);
      const uint64_t end = in_obj[o][r] + plan.slices[s].nbytes;
      if (options.source_index) return;
      if (r == 2) output_of(o).write_zeros(stride - end);
      else output_of(o).write_zeros(in_obj[o][r + 1] - end);
    };
    for (size_t s = 0; s < plan.slices.size();) {
      SliceReader::Chunk c = reader.next();
      if (!options.source_index) output_of(c.slice / 3).write(c.bytes.data(), c.bytes.size());
      done += c.bytes.size();
      const bool slice_done = c.offset_in_slice + c.bytes.size() == plan.slices[c.slice].nbytes;
      const size_t current = c.slice;
      reader.recycle(std::move(c.bytes));
      if (slice_done) {
        finish_slice(current);
        ++s;
      }
      if (options.progress) {
        BuildProgress p;
        p.done_bytes = done;
        p.total_bytes = total;
        p.elapsed_s = seconds_since(copy_t0);
        p.rate_bytes_per_s = p.elapsed_s > 0 ? static_cast<double>(done) / p.elapsed_s : 0;
        p.eta_s = p.rate_bytes_per_s > 0 ? static_cast<double>(total - done) / p.rate_bytes_per_s : 0;
        options.progress(p);
      }
    }
  }
  if (num_parts == 0 && outf->offset() != h.file_size)
    fail(Status::internal, "{}: wrote {} bytes, the layout says {}", temp.path(), outf->offset(), h.file_size);
  for (uint32_t k = 0; k < num_parts; ++k) {
    const uint64_t objects = (num_objects - std::min<uint64_t>(k, num_objects) + num_parts - 1) / num_parts;
    if (part_out[k]->offset() != objects * stride)
      fail(Status::internal, "{}: wrote {} bytes, the layout says {}", part_temps[k]->path(), part_out[k]->offset(), objects * stride);
  }

  // ---- digests ----
  for (size_t f = 0; f < plan.files.size(); ++f) {
    std::vector<std::array<uint8_t, 32>> slices;
    for (size_t s = 0; s < plan.slices.size(); ++s) {
      if (plan.slices[s].file != f) continue;
      slices.emplace_back();
      std::memcpy(slices.back().data(), entries[s].source_sha256, 32);
    }
    file_digests.push_back(source_file_digest(*files[f], plan.files[f].header_bytes, slices));
  }
  {
    format::Sha256Hasher sf;
    for (const auto &d : file_digests) sf.update(d.data(), d.size());
    std::memcpy(h.source_files_sha256, sf.finish().data(), 32);
  }
  {
    format::Sha256Hasher mi;
    put(mi, plan.first_layer);
    put(mi, plan.num_layers);
    put(mi, plan.num_experts);
    for (const PackEntry &e : entries) {
      put(mi, e.layer);
      put(mi, e.expert);
      put(mi, e.role);
      put(mi, e.ggml_type);
      put(mi, e.n_dims);
      mi.update(e.ne, sizeof e.ne);
      mi.update(e.source_sha256, 32);
    }
    std::memcpy(h.model_identity_sha256, mi.finish().data(), 32);
  }
  nlohmann::json config = {
      {"arch", plan.arch},
      {"source_format", plan.source_format},
      {"alignment", align},
      {"role_alignment", format::kPackRoleAlignment},
      {"first_layer", plan.first_layer},
      {"num_layers", plan.num_layers},
      {"num_experts", plan.num_experts},
      {"top_k", plan.top_k},
      {"roles", {"gate", "up", "down"}},
      {"pack_version", format::kPackVersion},
  };
  if (num_parts) config["parts"] = num_parts;
  if (options.source_index) config["source_objects"] = true;
  const std::string config_text = config.dump();
  std::memcpy(h.config_sha256, format::sha256(config_text.data(), config_text.size()).data(), 32);
  {
    format::Sha256Hasher ih;
    ih.update(entries.data(), entries.size() * sizeof(PackEntry));
    ih.update(strings.data(), strings.size());
    std::memcpy(h.index_sha256, ih.finish().data(), 32);
  }
  h.header_xxh3 = format::xxh3_64(&h, format::kPackHeaderHashedBytes);

  // Index and strings first, header last.
  outf->write_at(h.index_offset, entries.data(), entries.size() * sizeof(PackEntry));
  outf->write_at(h.strings_offset, strings.data(), strings.size());
  outf->write_at(0, &h, sizeof h);
  outf->sync();
  outf.reset();
  // The parts take their names first (without the pack file they are just files), so that the
  // temporary pack file opens with them.
  for (uint32_t k = 0; k < num_parts; ++k) {
    part_out[k]->sync();
    part_out[k].reset();
    if (::rename(part_temps[k]->path().c_str(), part_paths[k].c_str()) != 0)
      fail_errno(errno, "rename " + part_temps[k]->path() + " to " + part_paths[k]);
    part_temps[k]->release();
    format::sync_directory(fs::path(part_paths[k]).parent_path().string());
  }
  const double copy_seconds = seconds_since(copy_t0);

  if (options.verify) format::PackFile::open(temp.path(), format::ValidationLevel::structure);

  // ---- manifest ----
  Manifest m;
  const std::string mpath = manifest_path(out.string());
  if (fs::exists(mpath)) {
    try {
      m.generation = Manifest::load(mpath).generation + 1;
    } catch (const Error &) {
      m.generation = 1;  // an unreadable old manifest is replaced
    }
  }
  m.created_utc = utc_now();
  m.pack_file = base;
  m.pack_size = h.file_size;
  m.source_files_sha256 = format::to_hex(h.source_files_sha256, 32);
  m.model_identity_sha256 = format::to_hex(h.model_identity_sha256, 32);
  m.config_sha256 = format::to_hex(h.config_sha256, 32);
  for (size_t f = 0; f < plan.files.size(); ++f)
    m.sources.push_back(ManifestSource{plan.files[f].path, plan.files[f].size, plan.files[f].mtime_ns,
                                       format::hex(file_digests[f])});
  m.config = config;
  const double total_seconds = seconds_since(t0);
  m.build = {{"seconds", total_seconds},
             {"payload_bytes", total},
             {"payload_mib_per_s", total_seconds > 0 ? static_cast<double>(total) / total_seconds / 1048576.0 : 0.0},
             {"builder", std::string("libexpertpack ") + EP_BUILD_VERSION}};
  TempFile mtemp(dir + "/." + base + ".json.tmp-" + std::to_string(::getpid()));
  {
    const std::string text = m.to_json().dump(2) + "\n";
    auto mf = format::create_output_file(mtemp.path());
    mf->write(text.data(), text.size());
    mf->sync();
  }
  if (::rename(temp.path().c_str(), out.c_str()) != 0) fail_errno(errno, "rename " + temp.path() + " to " + out.string());
  temp.release();
  if (::rename(mtemp.path().c_str(), mpath.c_str()) != 0) fail_errno(errno, "rename " + mtemp.path() + " to " + mpath);
  mtemp.release();
  format::sync_directory(dir);

  BuildResult r;
  r.pack_path = out.string();
  r.manifest_path = mpath;
  r.part_paths = part_paths;
  r.file_bytes = h.file_size;
  r.payload_bytes = total;
  r.num_layers = plan.num_layers;
  r.num_experts = plan.num_experts;
  r.generation = m.generation;
  r.seconds = seconds_since(t0);
  r.copy_seconds = copy_seconds;
  r.payload_bytes_per_s = r.seconds > 0 ? static_cast<double>(total) / r.seconds : 0;
  log::info("built {}: {} layers x {} experts, {} payload bytes in {:.2f} s ({:.1f} MiB/s)", r.pack_path, r.num_layers,
            r.num_experts, total, r.seconds, r.payload_bytes_per_s / 1048576.0);
  return r;
}

}  // namespace ep::pack
