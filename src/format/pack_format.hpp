// Expert Pack v1: the on-disk structs, byte for byte (docs/pack-format.md is the spec).
// Everything is little-endian; the structs are written and read with memcpy on little-endian
// hosts only (static_assert below).
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ep::format {

static_assert(std::endian::native == std::endian::little, "Expert Pack I/O assumes a little-endian host");

/// "EPACK" NUL CR LF: the CR LF pair catches text-mode mangling, as in PNG.
inline constexpr std::array<uint8_t, 8> kPackMagic = {'E', 'P', 'A', 'C', 'K', 0x00, 0x0D, 0x0A};
inline constexpr uint32_t kPackVersion = 1;
inline constexpr uint32_t kPackNumRoles = 3;
inline constexpr uint32_t kPackDefaultAlignment = 4096;
inline constexpr uint32_t kPackMinAlignment = 64;
inline constexpr uint32_t kPackMaxAlignment = 1u << 20;
/// Every role payload starts at a multiple of this inside its object.
inline constexpr uint32_t kPackRoleAlignment = 256;
/// The objects are striped over num_parts part files (docs/pack-format.md, "Striped packs"):
/// object i lies in part i mod num_parts at offset (i div num_parts) * object_stride.
inline constexpr uint32_t kPackFlagStriped = 1;
/// A source index (docs/pack-format.md, "Source indexes"): the file holds the header, index and
/// strings only and every payload is read from its source file (PackEntry::source_file at
/// source_offset; an fp4_e8m0 slice with its scale tensor, re-laid as it is read); the objects
/// keep the layout a pack would give them.
inline constexpr uint32_t kPackFlagSourceObjects = 2;
/// Flags this reader knows; any other bit set is EP_ERR_UNSUPPORTED.
inline constexpr uint32_t kPackKnownFlags = kPackFlagStriped | kPackFlagSourceObjects;
/// The most part files a striped pack may have.
inline constexpr uint32_t kPackMaxParts = 256;

/// How an entry's payload comes from its source (PackEntry::source_layout).
enum class SourceLayout : uint32_t {
  verbatim = 0,  ///< the payload is the source slice [source_offset, + nbytes)
  /// MXFP4 payload re-laid from packed FP4 (nbytes · 16/17 bytes at source_offset) and E8M0
  /// scales (nbytes / 17 bytes) in the same safetensors file, in the tensor named by
  /// fp4_scale_tensor_name(source_tensor) (format/checkpoint_tensors.hpp)
  fp4_e8m0 = 1,
};

/// The three matrices of one routed expert, in the order they sit in the object.
enum class Role : uint32_t { gate = 0, up = 1, down = 2 };
std::string_view role_name(Role role) noexcept;

/// The fixed 256-byte header at file offset 0.
struct PackHeader {
  uint8_t magic[8];                 ///< kPackMagic
  uint32_t version;                 ///< kPackVersion
  uint32_t header_size;             ///< sizeof(PackHeader) = 256
  uint32_t entry_size;              ///< sizeof(PackEntry) = 128
  uint32_t flags;                   ///< 0, kPackFlagStriped or kPackFlagSourceObjects
  uint32_t num_layers;              ///< MoE layers in the pack (pack layer 0 .. num_layers-1)
  uint32_t num_experts;             ///< routed experts per layer
  uint32_t num_roles;               ///< 3 (gate, up, down)
  uint32_t top_k;                   ///< experts used per token (informational)
  uint32_t alignment;               ///< object alignment in bytes (4096 by default)
  uint32_t first_layer;             ///< model block index of pack layer 0
  uint64_t data_start;              ///< file offset of object (0, 0); multiple of alignment
  uint64_t object_stride;           ///< bytes between consecutive objects; multiple of alignment
  uint64_t index_offset;            ///< file offset of the entry array
  uint64_t index_size;              ///< bytes of the entry array = entries * entry_size
  uint64_t strings_offset;          ///< file offset of the string table
  uint64_t strings_size;            ///< bytes of the string table
  uint64_t file_size;               ///< total bytes of the pack file
  uint8_t index_sha256[32];         ///< SHA-256 of index bytes followed by string-table bytes
  uint8_t source_files_sha256[32];  ///< identity: the source files (docs/pack-format.md)
  uint8_t model_identity_sha256[32];///< identity: the expert weights themselves
  uint8_t config_sha256[32];        ///< identity: the build configuration
  uint32_t num_parts;               ///< striped: part files (2..kPackMaxParts); else 0
  uint32_t parts_string;            ///< striped: string-table offset of part 0's path (parts 1.. follow, each NUL-terminated); else 0
  uint8_t reserved[8];              ///< zero
  uint64_t header_xxh3;             ///< XXH3-64 of bytes [0, 248)
};
static_assert(sizeof(PackHeader) == 256);
static_assert(offsetof(PackHeader, data_start) == 48);
static_assert(offsetof(PackHeader, index_sha256) == 104);
static_assert(offsetof(PackHeader, num_parts) == 232);
static_assert(offsetof(PackHeader, reserved) == 240);
static_assert(offsetof(PackHeader, header_xxh3) == 248);

/// One entry per (layer, expert, role), sorted by layer, then expert, then role.
struct PackEntry {
  uint32_t layer;                   ///< pack layer
  uint32_t expert;
  uint32_t role;                    ///< Role
  uint32_t ggml_type;               ///< ggml type id (format/ggml_type.hpp)
  uint32_t n_dims;                  ///< 1..4
  uint32_t source_file;             ///< string-table offset of the source file path
  uint32_t source_tensor;           ///< string-table offset of the source tensor name
  uint32_t source_layout;           ///< SourceLayout (0 in packs of verbatim slices only)
  uint64_t ne[4];                   ///< shape in ggml order (ne[0] contiguous); unused dims 1
  uint64_t source_offset;           ///< absolute offset of the slice in the source file
  uint64_t nbytes;                  ///< payload bytes (= source slice bytes when verbatim)
  uint64_t pack_offset;             ///< absolute offset of the payload in the pack
  uint64_t payload_xxh3;            ///< XXH3-64 of the payload
  uint8_t source_sha256[32];        ///< SHA-256 of the source bytes (verbatim: = of the payload; fp4_e8m0: values then scales)
};
static_assert(sizeof(PackEntry) == 128);
static_assert(offsetof(PackEntry, ne) == 32);
static_assert(offsetof(PackEntry, source_offset) == 64);
static_assert(offsetof(PackEntry, source_sha256) == 96);

/// Bytes of the header covered by header_xxh3.
inline constexpr size_t kPackHeaderHashedBytes = offsetof(PackHeader, header_xxh3);

}  // namespace ep::format
