#include "tokenizer/bpe.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace ep::tokenizer {

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Entry> old = std::move(slots_);
  slots_.assign(cap, Entry{});
  mask_ = cap - 1;
  size_ = 0;
  for (const Entry &e : old) {
    if (e.key != kEmpty) insert(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFFu), e.rank, e.merged);
  }
}

void MergeTable::grow() { reserve(std::max<size_t>(16, size_ * 2 + 2)); }

bool MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = make_key(left, right);
  size_t i = hash(key) & mask_;
  for (;;) {
    Entry &e = slots_[i];
    if (e.key == key) return false;
    if (e.key == kEmpty) {
      e = Entry{key, rank, merged};
      ++size_;
      return true;
    }
    i = (i + 1) & mask_;
  }
}

namespace {

// Min-heap order of HF's Merge: lower rank first, then lower position.
struct CandidateAfter {
  bool operator()(const BpeScratch::Candidate &a, const BpeScratch::Candidate &b) const noexcept {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.pos > b.pos;
  }
};

}  // namespace

void bpe_merge(std::string_view piece, const std::array<int32_t, 256> &byte_ids, const MergeTable &merges,
               int32_t unk_id, BpeScratch &scratch, std::vector<int32_t> &out) {
  auto &symbols = scratch.symbols;
  symbols.clear();
  for (char c : piece) {
    int32_t id = byte_ids[static_cast<uint8_t>(c)];
    if (id < 0) {
      if (unk_id < 0) continue;
      id = unk_id;
    }
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  if (symbols.size() == 1) {
    out.push_back(symbols[0].id);
    return;
  }

  if (symbols.size() <= kLinearMax) {
    // Short pieces: repeatedly merge the lowest-rank, leftmost pair by scanning. This is the
    // same order as the queue below (which pops the lowest (rank, position) pair still valid).
    auto &ids = scratch.ids;
    auto &ranks = scratch.ranks;
    auto &merged = scratch.merged;
    ids.clear();
    for (const auto &sym : symbols) ids.push_back(sym.id);
    ranks.assign(ids.size() - 1, INT32_MAX);
    merged.assign(ids.size() - 1, -1);
    auto refresh = [&](size_t i) {
      const MergeTable::Entry *m = merges.find(ids[i], ids[i + 1]);
      ranks[i] = m ? m->rank : INT32_MAX;
      merged[i] = m ? m->merged : -1;
    };
    for (size_t i = 0; i + 1 < ids.size(); ++i) refresh(i);
    for (;;) {
      size_t best = SIZE_MAX;
      int32_t best_rank = INT32_MAX;
      for (size_t i = 0; i < ranks.size(); ++i) {
        if (ranks[i] < best_rank) {
          best_rank = ranks[i];
          best = i;
        }
      }
      if (best == SIZE_MAX) break;
      ids[best] = merged[best];
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      ranks.erase(ranks.begin() + static_cast<std::ptrdiff_t>(best));
      merged.erase(merged.begin() + static_cast<std::ptrdiff_t>(best));
      if (best > 0) refresh(best - 1);
      if (best < ranks.size()) refresh(best);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }

  auto &heap = scratch.heap;
  heap.clear();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeTable::Entry *m = merges.find(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({m->rank, static_cast<int32_t>(i), m->merged});
    }
  }
  std::make_heap(heap.begin(), heap.end(), CandidateAfter{});

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandidateAfter{});
    const BpeScratch::Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol &cur = symbols[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const BpeScratch::Symbol right = symbols[next_pos];
    // Skip stale entries: the pair at this position changed since it was queued.
    const MergeTable::Entry *now = merges.find(cur.id, right.id);
    if (now == nullptr || now->merged != top.merged) continue;

    cur.id = top.merged;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;

    if (cur.prev >= 0) {
      if (const MergeTable::Entry *m = merges.find(symbols[cur.prev].id, cur.id)) {
        heap.push_back({m->rank, cur.prev, m->merged});
        std::push_heap(heap.begin(), heap.end(), CandidateAfter{});
      }
    }
    if (cur.next >= 0) {
      if (const MergeTable::Entry *m = merges.find(cur.id, symbols[cur.next].id)) {
        heap.push_back({m->rank, top.pos, m->merged});
        std::push_heap(heap.begin(), heap.end(), CandidateAfter{});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace ep::tokenizer
