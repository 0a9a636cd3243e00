#include "format/gguf.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>

namespace ep::format {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kMaxDepth = 8;            // nested arrays
constexpr uint64_t kMaxNestedElems = 1u << 20;

bool valid_type(uint32_t t) { return t <= 12; }

struct Parser {
  Cursor &c;
  const std::string &file;
  uint64_t nested_budget = kMaxNestedElems;

  std::string read_string(const char *what) {
    const uint64_t at = c.offset();
    const uint64_t len = c.u64();
    if (len > c.remaining())
      fail(Status::format, "{}: {} at offset {}: string length {} exceeds the {} bytes left in the file", file, what,
           at, len, c.remaining());
    std::string s(static_cast<size_t>(len), '\0');
    c.read(s.data(), s.size());
    return s;
  }

  GgufValue read_value(GgufType type, uint32_t depth, const std::string &key) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufType::u8: v.u = c.u8(); break;
      case GgufType::i8: v.i = static_cast<int8_t>(c.u8()); break;
      case GgufType::u16: v.u = c.u16(); break;
      case GgufType::i16: v.i = static_cast<int16_t>(c.u16()); break;
      case GgufType::u32: v.u = c.u32(); break;
      case GgufType::i32: v.i = static_cast<int32_t>(c.u32()); break;
      case GgufType::u64: v.u = c.u64(); break;
      case GgufType::i64: v.i = static_cast<int64_t>(c.u64()); break;
      case GgufType::f32: v.f = c.get<float>(); break;
      case GgufType::f64: v.f = c.get<double>(); break;
      case GgufType::boolean: {
        const uint64_t at = c.offset();
        const uint8_t b = c.u8();
        if (b > 1) fail(Status::format, "{}: key '{}' at offset {}: bool byte is {}, expected 0 or 1", file, key, at, b);
        v.u = b;
        break;
      }
      case GgufType::string: v.s = read_string("string value"); break;
      case GgufType::array: {
        const uint64_t at = c.offset();
        if (depth >= kMaxDepth)
          fail(Status::format, "{}: key '{}' at offset {}: arrays nested deeper than {}", file, key, at, kMaxDepth);
        const uint32_t et = c.u32();
        if (!valid_type(et))
          fail(Status::format, "{}: key '{}' at offset {}: array element type {} is not a GGUF type", file, key, at, et);
        v.elem_type = static_cast<GgufType>(et);
        const uint64_t n = c.u64();
        const size_t esize = gguf_scalar_size(v.elem_type);
        const uint64_t min_elem = esize ? esize : (v.elem_type == GgufType::string ? 8 : 12);
        if (n > c.remaining() / min_elem)
          fail(Status::format, "{}: key '{}' at offset {}: array of {} {} elements needs at least {} bytes, {} left",
               file, key, at, n, gguf_type_name(v.elem_type), n > UINT64_MAX / min_elem ? UINT64_MAX : n * min_elem,
               c.remaining());
        if (esize) {
          v.raw.resize(static_cast<size_t>(n * esize));
          c.read(v.raw.data(), v.raw.size());
          if (v.elem_type == GgufType::boolean) {
            for (uint8_t b : v.raw)
              if (b > 1) fail(Status::format, "{}: key '{}' at offset {}: bool element is {}", file, key, at, b);
          }
        } else if (v.elem_type == GgufType::string) {
          v.strings.reserve(static_cast<size_t>(n));
          for (uint64_t k = 0; k < n; ++k) v.strings.push_back(read_string("array string"));
        } else {
          if (n > nested_budget)
            fail(Status::format, "{}: key '{}' at offset {}: more than {} nested array elements in the file", file, key,
                 at, kMaxNestedElems);
          nested_budget -= n;
          v.arrays.reserve(static_cast<size_t>(n));
          for (uint64_t k = 0; k < n; ++k) v.arrays.push_back(read_value(GgufType::array, depth + 1, key));
        }
        break;
      }
    }
    return v;
  }
};

}  // namespace

std::string_view gguf_type_name(GgufType type) noexcept {
  switch (type) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "?";
}

size_t gguf_scalar_size(GgufType type) noexcept {
  switch (type) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
    default: return 0;
  }
}

GgufValue GgufValue::make_array(GgufType elem, const std::vector<GgufValue> &elems) {
  GgufValue x;
  x.type = GgufType::array;
  x.elem_type = elem;
  const size_t es = gguf_scalar_size(elem);
  for (const GgufValue &e : elems) {
    if (e.type != elem)
      fail(Status::invalid_argument, "GGUF array of {} given a {} element", gguf_type_name(elem), gguf_type_name(e.type));
    if (es) {
      uint8_t b[8];
      switch (elem) {
        case GgufType::f32: { const float f = static_cast<float>(e.f); std::memcpy(b, &f, 4); break; }
        case GgufType::f64: std::memcpy(b, &e.f, 8); break;
        case GgufType::i8: case GgufType::i16: case GgufType::i32: case GgufType::i64: std::memcpy(b, &e.i, es); break;
        default: std::memcpy(b, &e.u, es); break;
      }
      x.raw.insert(x.raw.end(), b, b + es);
    } else if (elem == GgufType::string) {
      x.strings.push_back(e.s);
    } else {
      x.arrays.push_back(e);
    }
  }
  return x;
}

size_t GgufValue::array_size() const {
  if (type != GgufType::array) return 0;
  const size_t es = gguf_scalar_size(elem_type);
  if (es) return raw.size() / es;
  return elem_type == GgufType::string ? strings.size() : arrays.size();
}

GgufValue GgufValue::at(size_t index) const {
  if (index >= array_size()) fail(Status::invalid_argument, "GGUF array index {} out of range {}", index, array_size());
  const size_t es = gguf_scalar_size(elem_type);
  if (elem_type == GgufType::string) return make_string(strings[index]);
  if (elem_type == GgufType::array) return arrays[index];
  GgufValue v;
  v.type = elem_type;
  const uint8_t *p = raw.data() + index * es;
  switch (elem_type) {
    case GgufType::u8: case GgufType::boolean: v.u = p[0]; break;
    case GgufType::i8: v.i = static_cast<int8_t>(p[0]); break;
    case GgufType::u16: { uint16_t x; std::memcpy(&x, p, 2); v.u = x; break; }
    case GgufType::i16: { int16_t x; std::memcpy(&x, p, 2); v.i = x; break; }
    case GgufType::u32: { uint32_t x; std::memcpy(&x, p, 4); v.u = x; break; }
    case GgufType::i32: { int32_t x; std::memcpy(&x, p, 4); v.i = x; break; }
    case GgufType::u64: std::memcpy(&v.u, p, 8); break;
    case GgufType::i64: std::memcpy(&v.i, p, 8); break;
    case GgufType::f32: { float x; std::memcpy(&x, p, 4); v.f = x; break; }
    case GgufType::f64: std::memcpy(&v.f, p, 8); break;
    default: break;
  }
  return v;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::u8: case GgufType::i8: case GgufType::u16: case GgufType::i16: case GgufType::u32:
    case GgufType::i32: case GgufType::u64: case GgufType::i64: return true;
    default: return false;
  }
}

uint64_t GgufValue::as_uint(std::string_view context) const {
  switch (type) {
    case GgufType::u8: case GgufType::u16: case GgufType::u32: case GgufType::u64: return u;
    case GgufType::i8: case GgufType::i16: case GgufType::i32: case GgufType::i64:
      if (i >= 0) return static_cast<uint64_t>(i);
      fail(Status::format, "{}: expected a non-negative integer, found {}", context, i);
    default: fail(Status::format, "{}: expected an integer, found a {}", context, gguf_type_name(type));
  }
}

int64_t GgufValue::as_int(std::string_view context) const {
  switch (type) {
    case GgufType::u8: case GgufType::u16: case GgufType::u32: case GgufType::u64: case GgufType::boolean:
      return static_cast<int64_t>(u);
    case GgufType::i8: case GgufType::i16: case GgufType::i32: case GgufType::i64:
      return i;
    default:
      fail(Status::format, "{}: expected an integer, found {}", context, gguf_type_name(type));
  }
}

double GgufValue::as_float(std::string_view context) const {
  if (type == GgufType::f32 || type == GgufType::f64) return f;
  return static_cast<double>(as_int(context));
}

std::string GgufValue::to_string(size_t max_elems) const {
  switch (type) {
    case GgufType::u8: case GgufType::u16: case GgufType::u32: case GgufType::u64: return fmt::format("{}", u);
    case GgufType::i8: case GgufType::i16: case GgufType::i32: case GgufType::i64: return fmt::format("{}", i);
    case GgufType::f32: case GgufType::f64: return fmt::format("{}", f);
    case GgufType::boolean: return u ? "true" : "false";
    case GgufType::string: {
      std::string t = s.size() > 60 ? s.substr(0, 60) + "..." : s;
      for (char &ch : t)
        if (ch == '\n' || ch == '\r') ch = ' ';
      return "\"" + t + "\"";
    }
    case GgufType::array: {
      const size_t n = array_size();
      std::string out = fmt::format("{}[{}] [", gguf_type_name(elem_type), n);
      for (size_t k = 0; k < n && k < max_elems; ++k) out += (k ? ", " : "") + at(k).to_string(max_elems);
      if (n > max_elems) out += ", ...";
      return out + "]";
    }
  }
  return "?";
}

bool GgufValue::operator==(const GgufValue &o) const {
  if (type != o.type) return false;
  switch (type) {
    case GgufType::string: return s == o.s;
    case GgufType::array: return elem_type == o.elem_type && raw == o.raw && strings == o.strings && arrays == o.arrays;
    case GgufType::f32: case GgufType::f64: return f == o.f;
    case GgufType::i8: case GgufType::i16: case GgufType::i32: case GgufType::i64: return i == o.i;
    default: return u == o.u;
  }
}

GgufFile GgufFile::open(const std::string &path) { return parse(std::make_shared<FileSource>(path)); }

GgufFile GgufFile::parse(std::shared_ptr<const ByteSource> source) {
  GgufFile g;
  g.source_ = std::move(source);
  const ByteSource &src = *g.source_;
  const std::string &file = src.name();
  Cursor c(src, 0);
  if (src.size() < 4) fail(Status::format, "{}: truncated file: {} bytes, not a GGUF file", file, src.size());
  const uint32_t magic = c.u32();
  if (magic != kGgufMagic) fail(Status::format, "{}: bad magic at offset 0: {:#010x} is not GGUF", file, magic);
  g.version_ = c.u32();
  if (g.version_ < 2 || g.version_ > 3)
    fail(Status::version, "{}: unsupported GGUF version {} at offset 4 (this library reads 2 and 3)", file, g.version_);
  const uint64_t n_tensors = c.u64();
  const uint64_t n_kv = c.u64();
  // Minimum encoded sizes bound the counts by the bytes left: no allocation from a hostile count.
  if (n_kv > c.remaining() / 13)
    fail(Status::format, "{}: metadata count {} at offset 16 cannot fit in the {} bytes left", file, n_kv, c.remaining());
  Parser p{c, file};
  g.kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.offset();
    std::string key = p.read_string("metadata key");
    const uint32_t t = c.u32();
    if (!valid_type(t))
      fail(Status::format, "{}: key '{}' at offset {}: value type {} is not a GGUF type", file, key, at, t);
    GgufValue v = p.read_value(static_cast<GgufType>(t), 0, key);
    for (const auto &kv : g.kv_)
      if (kv.first == key) fail(Status::format, "{}: duplicate metadata key '{}' at offset {}", file, key, at);
    g.kv_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue *a = g.find("general.alignment")) {
    if (a->type != GgufType::u32 || a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail(Status::format, "{}: general.alignment must be a u32 power of two, found {} {}", file,
           gguf_type_name(a->type), a->to_string());
    g.alignment_ = static_cast<uint32_t>(a->u);
  }
  if (n_tensors > c.remaining() / 24)
    fail(Status::format, "{}: tensor count {} at offset 8 cannot fit in the {} bytes left", file, n_tensors,
         c.remaining());
  g.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.info_offset = c.offset();
    t.name = p.read_string("tensor name");
    t.n_dims = c.u32();
    if (t.n_dims > 4)
      fail(Status::format, "{}: tensor '{}' at offset {}: {} dimensions, at most 4 are allowed", file, t.name,
           t.info_offset, t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      t.ne[d] = c.u64();
      if (t.ne[d] > static_cast<uint64_t>(INT64_MAX))
        fail(Status::format, "{}: tensor '{}' at offset {}: dimension {} is {}", file, t.name, t.info_offset, d, t.ne[d]);
    }
    const uint32_t type = c.u32();
    const std::string ctx = fmt::format("{}: tensor '{}' at offset {}", file, t.name, t.info_offset);
    t.type = require_ggml_type(type, ctx).type;
    t.offset = c.u64();
    uint64_t rows = 1;
    for (uint32_t d = 1; d < 4; ++d) rows = checked_mul(rows, t.ne[d], ctx.c_str());
    t.nbytes = checked_mul(ggml_row_bytes(t.type, t.ne[0], ctx), rows, ctx.c_str());
    if (t.offset % g.alignment_ != 0)
      fail(Status::format, "{}: data offset {} is not a multiple of the alignment {}", ctx, t.offset, g.alignment_);
    if (g.tensor_index_.count(t.name)) fail(Status::format, "{}: duplicate tensor name", ctx);
    g.tensor_index_.emplace(t.name, g.tensors_.size());
    g.tensors_.push_back(std::move(t));
  }
  g.data_offset_ = align_up(c.offset(), g.alignment_);
  for (GgufTensorInfo &t : g.tensors_) {
    t.file_offset = checked_add(g.data_offset_, t.offset, "tensor offset");
    const uint64_t end = checked_add(t.file_offset, t.nbytes, "tensor end");
    if (end > src.size())
      fail(Status::format, "{}: truncated file: tensor '{}' (info at offset {}) needs bytes [{}, {}) but the file has {}",
           file, t.name, t.info_offset, t.file_offset, end, src.size());
  }
  return g;
}

const GgufValue *GgufFile::find(std::string_view key) const {
  for (const auto &kv : kv_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const GgufTensorInfo *GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::optional<SplitName> parse_split_name(const std::string &path) {
  // "<prefix>-NNNNN-of-MMMMM.gguf"
  constexpr std::string_view tail = ".gguf";
  if (path.size() < 20 || path.compare(path.size() - tail.size(), tail.size(), tail) != 0) return std::nullopt;
  const size_t end = path.size() - tail.size();
  const size_t start = end - 15;  // "-00001-of-00003"
  const std::string_view s(path.data() + start, 15);
  auto digits = [](std::string_view d) {
    uint32_t v = 0;
    for (char ch : d) {
      if (ch < '0' || ch > '9') return UINT32_MAX;
      v = v * 10 + static_cast<uint32_t>(ch - '0');
    }
    return v;
  };
  if (s[0] != '-' || s.substr(6, 4) != "-of-") return std::nullopt;
  const uint32_t idx = digits(s.substr(1, 5)), cnt = digits(s.substr(10, 5));
  if (idx == UINT32_MAX || cnt == UINT32_MAX || idx == 0 || cnt == 0 || idx > cnt) return std::nullopt;
  return SplitName{path.substr(0, start), idx, cnt};
}

std::string split_path(const std::string &prefix, uint32_t index, uint32_t count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, index, count);
}

GgufSet GgufSet::open(const std::string &path) {
  GgufSet set;
  GgufFile given = GgufFile::open(path);
  const GgufValue *count_v = given.find("split.count");
  const uint64_t meta_count = count_v ? count_v->as_uint(path + ": split.count") : 1;
  const auto split = parse_split_name(path);
  if (!split) {
    if (meta_count > 1)
      fail(Status::format, "{}: split.count is {} but the name is not '<name>-0000N-of-0000M.gguf', so the other shards "
           "cannot be found", path, meta_count);
    set.shards_.push_back(std::move(given));
    return set;
  }
  if (count_v && meta_count != split->count)
    fail(Status::format, "{}: split.count is {} but the file name says {} shards", path, meta_count, split->count);
  uint64_t total = 0;
  for (uint32_t k = 1; k <= split->count; ++k) {
    const std::string shard_path = split_path(split->prefix, k, split->count);
    if (k == split->index) {
      set.shards_.push_back(std::move(given));
    } else {
      if (!std::filesystem::exists(shard_path))
        fail(Status::not_found, "{}: shard {} of {} of split set {} is missing", shard_path, k, split->count, path);
      set.shards_.push_back(GgufFile::open(shard_path));
    }
    const GgufFile &s = set.shards_.back();
    if (split->count > 1) {
      const GgufValue *no = s.find("split.no");
      const GgufValue *cnt = s.find("split.count");
      if (!no || !cnt)
        fail(Status::format, "{}: shard {} of {} has no split.no/split.count metadata", shard_path, k, split->count);
      if (no->as_uint(shard_path + ": split.no") != k - 1 || cnt->as_uint(shard_path + ": split.count") != split->count)
        fail(Status::format, "{}: shard changed: split.no {} split.count {}, expected {} and {}", shard_path,
             no->to_string(), cnt->to_string(), k - 1, split->count);
    }
    total += s.tensors().size();
  }
  if (const GgufValue *tc = set.shards_.front().find("split.tensors.count")) {
    if (tc->as_uint("split.tensors.count") != total)
      fail(Status::format, "{}: split.tensors.count is {} but the {} shards hold {} tensors (a shard changed)",
           set.shards_.front().path(), tc->to_string(), split->count, total);
  }
  std::map<std::string_view, size_t> seen;
  for (size_t k = 0; k < set.shards_.size(); ++k) {
    for (const GgufTensorInfo &t : set.shards_[k].tensors()) {
      auto [it, fresh] = seen.emplace(t.name, k);
      if (!fresh)
        fail(Status::format, "{}: tensor '{}' is also in shard {}", set.shards_[k].path(), t.name,
             set.shards_[it->second].path());
    }
  }
  return set;
}

std::optional<GgufSet::Located> GgufSet::find_tensor(std::string_view name) const {
  for (const GgufFile &f : shards_)
    if (const GgufTensorInfo *t = f.find_tensor(name)) return Located{&f, t};
  return std::nullopt;
}

size_t GgufSet::tensor_count() const {
  size_t n = 0;
  for (const GgufFile &f : shards_) n += f.tensors().size();
  return n;
}

}  // namespace ep::format
