#include "pack/source_index.hpp"

#include "core/error.hpp"
#include "format/pack_file.hpp"

#include <algorithm>

namespace ep::pack {

format::Sha256 source_file_digest(const format::ByteSource &file, uint64_t header_bytes,
                                  const std::vector<std::array<uint8_t, 32>> &slice_sha256) {
  format::Sha256Hasher h;
  const uint64_t end = std::min<uint64_t>(header_bytes, file.size());
  std::vector<uint8_t> buf;
  for (uint64_t off = 0; off < end;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(end - off, 8u << 20));
    buf.resize(n);
    file.read(off, buf.data(), n);
    h.update(buf.data(), n);
    off += n;
  }
  for (const auto &d : slice_sha256) h.update(d.data(), d.size());
  return h.finish();
}

void check_source_index(const format::PackFile &index, const Manifest &m, const ExpertPlan &plan) {
  const std::string &name = index.path();
  if (!index.source_objects()) fail(Status::format, "{}: not a source index (flags {:#x})", name, index.header().flags);
  if (plan.files.size() != m.sources.size())
    fail(Status::stale, "source changed: {} now has {} file(s), the index {} was built from {}", plan.files.front().path,
         plan.files.size(), name, m.sources.size());
  if (plan.first_layer != index.first_layer() || plan.num_layers != index.num_layers() ||
      plan.num_experts != index.num_experts() || plan.slices.size() != index.entries().size())
    fail(Status::stale, "source changed: {} now has MoE layers {}.. ({} layers of {} experts), the index {} has {}.. ({} of {})",
         plan.files.front().path, plan.first_layer, plan.num_layers, plan.num_experts, name, index.first_layer(),
         index.num_layers(), index.num_experts());
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const ExpertSlice &s = plan.slices[i];
    const format::RoleEntry &e = index.entries()[i];
    const std::string &file = plan.files[s.file].path;
    if (file != e.source_file || s.tensor != e.source_tensor || s.offset != e.source_offset || s.nbytes != e.nbytes ||
        s.type != e.type || s.n_dims != e.n_dims || s.ne != e.ne || s.layout != e.source_layout)
      fail(Status::stale,
           "source changed: {}: layer {} expert {} {} is tensor '{}' type {} [{}, {}, {}, {}] at offset {} ({} bytes), the index {} "
           "recorded '{}' in {} type {} [{}, {}, {}, {}] at offset {} ({} bytes)",
           file, i / 3 / plan.num_experts, i / 3 % plan.num_experts, format::role_name(e.role), s.tensor,
           static_cast<uint32_t>(s.type), s.ne[0], s.ne[1], s.ne[2], s.ne[3], s.offset, s.nbytes, name, e.source_tensor,
           e.source_file, static_cast<uint32_t>(e.type), e.ne[0], e.ne[1], e.ne[2], e.ne[3], e.source_offset, e.nbytes);
  }
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const SourceFile &sf = plan.files[f];
    const ManifestSource &ms = m.sources[f];
    if (sf.path != ms.path)
      fail(Status::stale, "source changed: file {} of the source is {}, the index {} was built from {}", f, sf.path, name, ms.path);
    std::vector<std::array<uint8_t, 32>> slices;
    for (size_t i = 0; i < plan.slices.size(); ++i)
      if (plan.slices[i].file == f) slices.push_back(index.entries()[i].source_sha256);
    const std::string now = format::hex(source_file_digest(format::FileSource(sf.path), sf.header_bytes, slices));
    if (now != ms.digest)
      fail(Status::stale,
           "source changed: {}: its metadata and tensor inventory (the first {} bytes) differ from those the index {} was built "
           "from (digest {}, recorded {})",
           sf.path, sf.header_bytes, name, now, ms.digest);
  }
}

}  // namespace ep::pack
