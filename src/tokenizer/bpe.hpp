// The BPE core shared by every tokenizer format: a merge table keyed by the ids of two adjacent
// symbols, and the merge loop of HF `tokenizers` (priority queue on (rank, position)).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace ep::tokenizer {

/// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n);
  /// Inserts unless the pair is already present (the first rank wins, as in HF). Returns
  /// false when it was present.
  bool insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  const Entry *find(int32_t left, int32_t right) const noexcept {
    if (slots_.empty()) return nullptr;
    const uint64_t key = make_key(left, right);
    size_t i = hash(key) & mask_;
    for (;;) {
      const Entry &e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const noexcept { return size_; }

 private:
  static uint64_t make_key(int32_t l, int32_t r) noexcept {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  static size_t hash(uint64_t k) noexcept { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 17); }
  void grow();
  std::vector<Entry> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

/// Reusable buffers of one encode call.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t len;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<int32_t> ids, ranks, merged;  // the linear path for short pieces
};

/// Pieces of at most this many bytes use a linear scan instead of the priority queue.
inline constexpr size_t kLinearMax = 24;

/// Appends the BPE ids of one pre-tokenized piece of raw bytes. @p byte_ids maps each byte to
/// its single-byte token (-1: none; the byte is then dropped, as HF does without unk_token,
/// or replaced by @p unk_id when >= 0).
void bpe_merge(std::string_view piece, const std::array<int32_t, 256> &byte_ids, const MergeTable &merges,
               int32_t unk_id, BpeScratch &scratch, std::vector<int32_t> &out);

}  // namespace ep::tokenizer
