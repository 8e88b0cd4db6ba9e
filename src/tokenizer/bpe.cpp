#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "tokenizer/utf8.h"

namespace sparrow {
namespace {

// GPT-2's table keeps the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF as themselves and
// maps the remaining 68 bytes, in increasing order, to U+0100, U+0101, ...
bool byte_is_printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct ByteTables {
  std::array<uint32_t, 256> to_char{};
  ByteTables() {
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) to_char[b] = byte_is_printable(b) ? static_cast<uint32_t>(b) : next++;
  }
};
const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

uint64_t pair_key(int32_t l, int32_t r) { return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r); }

uint64_t mix(uint64_t k) {  // splitmix64 finaliser: ids are small and dense, so spread them
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  k ^= k >> 31;
  return k;
}

// Pieces up to this many symbols use the quadratic scan (no heap, no allocation beyond the
// symbol list); longer ones (long runs of one character) use the heap, O(n log n).
constexpr size_t kSmallPiece = 64;

}  // namespace

uint32_t byte_level_char(uint8_t byte) { return byte_tables().to_char[byte]; }

int byte_level_byte(uint32_t cp) {
  if (cp < 256 && byte_is_printable(static_cast<int>(cp))) return static_cast<int>(cp);
  if (cp >= 0x100 && cp < 0x100 + 68) {
    uint32_t n = cp - 0x100;
    for (int b = 0; b < 256; ++b)
      if (!byte_is_printable(b) && n-- == 0) return b;
  }
  return -1;
}

Expected<BpeModel> BpeModel::build(std::vector<std::pair<std::string, int32_t>> vocab,
                                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options) {
  BpeModel m;
  m.options_ = std::move(options);
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) {
    if (id < 0) return Status::corrupt("vocabulary token '" + tok + "' has negative id " + std::to_string(id));
    max_id = std::max(max_id, id);
  }
  m.tokens_.assign(static_cast<size_t>(max_id + 1), std::string());
  m.has_token_.assign(static_cast<size_t>(max_id + 1), false);
  m.ids_.reserve(vocab.size());
  for (auto& [tok, id] : vocab) {
    if (m.has_token_[id])
      return Status::corrupt("vocabulary ids " + std::to_string(id) + " used twice ('" + m.tokens_[id] + "' and '" + tok + "')");
    m.has_token_[id] = true;
    m.ids_.emplace(tok, id);
    m.tokens_[id] = std::move(tok);
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append(ch, byte_level_char(static_cast<uint8_t>(b)));
    auto it = m.ids_.find(ch);
    m.byte_ids_[b] = it == m.ids_.end() ? -1 : it->second;
  }
  if (m.options_.unk_token) {
    auto it = m.ids_.find(*m.options_.unk_token);
    if (it == m.ids_.end()) return Status::corrupt("unk_token '" + *m.options_.unk_token + "' is not in the vocabulary");
    m.unk_id_ = it->second;
  }

  size_t cap = 16;
  while (cap < merges.size() * 2 + 16) cap <<= 1;
  m.table_.assign(cap, Slot{});
  m.mask_ = cap - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m.ids_.find(a), ib = m.ids_.find(b), iab = m.ids_.find(a + b);
    auto where = [&] { return "merge " + std::to_string(rank) + " ('" + a + "' '" + b + "')"; };
    if (ia == m.ids_.end()) return Status::corrupt(where() + ": '" + a + "' is not in the vocabulary");
    if (ib == m.ids_.end()) return Status::corrupt(where() + ": '" + b + "' is not in the vocabulary");
    if (iab == m.ids_.end()) return Status::corrupt(where() + ": '" + a + b + "' is not in the vocabulary");
    const uint64_t key = pair_key(ia->second, ib->second);
    uint64_t h = mix(key) & m.mask_;
    while (m.table_[h].key != ~0ull && m.table_[h].key != key) h = (h + 1) & m.mask_;
    if (m.table_[h].key == key) continue;  // a repeated merge keeps its first (lowest) rank
    m.table_[h].key = key;
    m.table_[h].target = {static_cast<int32_t>(rank), iab->second};
    ++m.num_merges_;
  }
  return m;
}

std::optional<BpeModel::MergeTarget> BpeModel::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  uint64_t h = mix(key) & mask_;
  while (true) {
    const Slot& s = table_[h];
    if (s.key == key) return s.target;
    if (s.key == ~0ull) return std::nullopt;
    h = (h + 1) & mask_;
  }
}

const std::string* BpeModel::token(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(tokens_.size()) || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

std::optional<int32_t> BpeModel::id_of(std::string_view token) const {
  auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::merge_small(std::vector<int32_t>& syms) const {
  // rank[i]: rank of the merge of (syms[i], syms[i+1]), INT32_MAX if none.
  constexpr int32_t kNone = INT32_MAX;
  int32_t rank[kSmallPiece], target[kSmallPiece];
  size_t n = syms.size();
  auto fill = [&](size_t i) {
    auto t = find_merge(syms[i], syms[i + 1]);
    rank[i] = t ? t->rank : kNone;
    target[i] = t ? t->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) fill(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;  // strict: the leftmost of equal ranks wins
    if (rank[best] == kNone) break;
    syms[best] = target[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      syms[i] = syms[i + 1];
      rank[i] = rank[i + 1];
      target[i] = target[i + 1];
    }
    --n;
    if (best > 0) fill(best - 1);
    if (best + 1 < n) fill(best);
  }
  syms.resize(n);
}

void BpeModel::merge_large(std::vector<int32_t>& syms) const {
  const int32_t n = static_cast<int32_t>(syms.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (auto t = find_merge(syms[pos], syms[next[pos]])) heap.push({t->rank, pos, t->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int32_t r = next[c.pos];
    // Stale if either side changed since the candidate was pushed. A symbol only grows to the
    // right and never splits, so an unchanged merged id means an unchanged pair.
    auto t = find_merge(syms[c.pos], syms[r]);
    if (!t || t->id != c.id) continue;
    syms[c.pos] = c.id;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (options_.ignore_merges) {
    std::string form;
    for (unsigned char c : bytes) utf8_append(form, byte_level_char(c));
    if (auto it = ids_.find(form); it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<int32_t> syms;
  syms.clear();
  bool last_was_unk = false;
  for (unsigned char c : bytes) {
    const int32_t id = byte_ids_[c];
    if (id >= 0) {
      syms.push_back(id);
      last_was_unk = false;
    } else if (unk_id_) {
      if (!(options_.fuse_unk && last_was_unk)) syms.push_back(*unk_id_);
      last_was_unk = true;
    }
  }
  if (syms.size() > 1) {
    if (syms.size() <= kSmallPiece)
      merge_small(syms);
    else
      merge_large(syms);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

}  // namespace sparrow
