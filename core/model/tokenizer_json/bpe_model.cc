// The BPE model as `tokenizers` runs it (models/bpe/model.rs merge_word,
// word.rs merge_all): a piece's characters become symbols (vocabulary
// entries, else byte-fallback <0xHH> tokens, else the unknown token, fused
// when fuse_unk), then the lowest-ranked merge applies first, leftmost among
// equal ranks, until none applies.
#include <algorithm>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "core/model/tokenizer_json/token_model.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"

namespace linattn::tokenizer_json {
namespace {

struct MergeTarget {
  uint32_t rank;
  int32_t id;
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
         static_cast<uint32_t>(b);
}

class BpeModel final : public TokenModel {
 public:
  absl::Status Tokenize(absl::string_view piece,
                        std::vector<int32_t>* ids) const override;
  std::optional<int32_t> TokenToId(absl::string_view token) const override {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* IdToToken(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size() ||
        !has_token_[id]) {
      return nullptr;
    }
    return &tokens_[id];
  }
  size_t size() const override { return vocab_.size(); }
  int32_t id_limit() const override {
    return static_cast<int32_t>(tokens_.size());
  }

  absl::Status Load(const JsonField& f);

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    size_t len;  // bytes of the piece; 0 once merged into its left neighbour
  };
  absl::Status MergeWord(absl::string_view w, std::vector<int32_t>* ids) const;
  const MergeTarget* FindMerge(int32_t a, int32_t b) const {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;
  std::vector<bool> has_token_;
  absl::flat_hash_map<uint64_t, MergeTarget> merges_;
  std::optional<std::string> unk_token_;
  std::optional<int32_t> unk_id_;
  std::optional<std::string> prefix_, suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xHH>, or -1

  // Words already merged (a cache as `tokenizers` keeps, same results).
  static constexpr size_t kCacheEntries = 10000;
  static constexpr size_t kCacheWordBytes = 256;
  mutable absl::Mutex cache_mutex_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_
      ABSL_GUARDED_BY(cache_mutex_);
};

absl::Status BpeModel::Load(const JsonField& f) {
  if (!f["dropout"].is_null()) {
    LINATTN_ASSIGN_OR_RETURN(double dropout, f["dropout"].Number());
    if (dropout != 0.0) {
      return f["dropout"].Error(
          "BPE dropout samples a different split each time; linattn encodes "
          "deterministically and does not support it");
    }
  }
  LINATTN_ASSIGN_OR_RETURN(unk_token_, f["unk_token"].OptionalString());
  LINATTN_ASSIGN_OR_RETURN(prefix_,
                           f["continuing_subword_prefix"].OptionalString());
  LINATTN_ASSIGN_OR_RETURN(suffix_, f["end_of_word_suffix"].OptionalString());
  LINATTN_ASSIGN_OR_RETURN(fuse_unk_, f["fuse_unk"].Bool(false));
  LINATTN_ASSIGN_OR_RETURN(byte_fallback_, f["byte_fallback"].Bool(false));
  LINATTN_ASSIGN_OR_RETURN(ignore_merges_, f["ignore_merges"].Bool(false));

  const JsonField vocab = f["vocab"];
  if (!vocab.value().is_object()) return vocab.Error("must be an object");
  if (vocab.value().size() > static_cast<size_t>(kMaxVocabulary)) {
    return vocab.Error(absl::StrCat("more than ", kMaxVocabulary, " entries"));
  }
  vocab_.reserve(vocab.value().size());
  int32_t limit = 0;
  for (auto it = vocab.value().begin(); it != vocab.value().end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() >= kMaxVocabulary) {
      return vocab[it.key().c_str()].Error(
          absl::StrCat("must be an id in [0, ", kMaxVocabulary, ")"));
    }
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    vocab_[it.key()] = id;
    limit = std::max(limit, id + 1);
  }
  tokens_.assign(limit, std::string());
  has_token_.assign(limit, false);
  for (const auto& [token, id] : vocab_) {
    tokens_[id] = token;
    has_token_[id] = true;
  }
  if (unk_token_) {
    // Missing from the vocabulary, it fails the first text that needs it
    // (as in `tokenizers`).
    if (auto it = vocab_.find(*unk_token_); it != vocab_.end()) {
      unk_id_ = it->second;
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(absl::StrFormat("<0x%02X>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  const JsonField merges = f["merges"];
  LINATTN_ASSIGN_OR_RETURN(size_t n, merges.ArraySize());
  merges_.reserve(n);
  const size_t prefix_len = prefix_ ? prefix_->size() : 0;
  uint32_t rank = 0;
  for (size_t i = 0; i < n; ++i) {
    const json& m = merges.value()[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;  // as `tokenizers` skips
      const size_t space = line.find(' ');
      if (space == std::string::npos ||
          line.find(' ', space + 1) != std::string::npos) {
        return merges.at(i).Error("must be two tokens separated by a space");
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return merges.at(i).Error("must be \"a b\" or [\"a\", \"b\"]");
    }
    if (b.size() < prefix_len) {
      return merges.at(i).Error(
          "the second token is shorter than continuing_subword_prefix");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    auto inew = vocab_.find(a + b.substr(prefix_len));
    if (ia == vocab_.end() || ib == vocab_.end() || inew == vocab_.end()) {
      return merges.at(i).Error(absl::StrCat("'",
                                             ia == vocab_.end() ? a
                                             : ib == vocab_.end()
                                                 ? b
                                                 : a + b.substr(prefix_len),
                                             "' is not in model.vocab"));
    }
    // Later duplicates replace earlier ones, as in `tokenizers`.
    merges_[PairKey(ia->second, ib->second)] = {rank++, inew->second};
  }
  return absl::OkStatus();
}

absl::Status BpeModel::Tokenize(absl::string_view piece,
                                std::vector<int32_t>* ids) const {
  if (piece.empty()) return absl::OkStatus();
  if (ignore_merges_) {
    if (auto id = TokenToId(piece)) {
      ids->push_back(*id);
      return absl::OkStatus();
    }
  }
  const bool cacheable = piece.size() < kCacheWordBytes;
  if (cacheable && cache_mutex_.ReaderTryLock()) {
    auto it = cache_.find(piece);
    const bool hit = it != cache_.end();
    if (hit) ids->insert(ids->end(), it->second.begin(), it->second.end());
    cache_mutex_.ReaderUnlock();
    if (hit) return absl::OkStatus();
  }
  std::vector<int32_t> word;
  LINATTN_RETURN_IF_ERROR(MergeWord(piece, &word));
  ids->insert(ids->end(), word.begin(), word.end());
  if (cacheable && cache_mutex_.TryLock()) {
    if (cache_.size() < kCacheEntries) cache_.emplace(piece, std::move(word));
    cache_mutex_.Unlock();
  }
  return absl::OkStatus();
}

absl::Status BpeModel::MergeWord(absl::string_view w,
                                 std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(w.size());
  auto add = [&symbols](int32_t id, size_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, len});
    if (n > 0) symbols[n - 1].next = n;
  };
  // A pending unknown symbol: its id and bytes.
  bool unk = false;
  int32_t unk_symbol = -1;
  size_t unk_len = 0;
  std::string s;
  for (size_t i = 0; i < w.size();) {
    const size_t len = Utf8Length(static_cast<unsigned char>(w[i]));
    const bool first = i == 0, last = i + len >= w.size();
    s.clear();
    if (!first && prefix_) s += *prefix_;
    s.append(w.data() + i, len);
    if (last && suffix_) s += *suffix_;
    i += len;
    if (auto it = vocab_.find(s); it != vocab_.end()) {
      if (unk) {
        add(unk_symbol, unk_len);
        unk = false;
      }
      add(it->second, len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : s) all &= byte_ids_[b] >= 0;
      if (all) {
        // A pending unknown stays pending here, as in `tokenizers`.
        for (unsigned char b : s) add(byte_ids_[b], 1);
        continue;
      }
    }
    if (unk_token_) {
      if (!unk_id_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "text: a character the vocabulary lacks needs model.unk_token '",
            *unk_token_, "', which is not in model.vocab"));
      }
      if (unk && fuse_unk_) {
        unk_len += len;
      } else {
        if (unk) add(unk_symbol, unk_len);
        unk = true;
        unk_symbol = *unk_id_;
        unk_len = len;
      }
    }
  }
  if (unk) add(unk_symbol, unk_len);

  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t id;
    bool operator<(const Candidate& o) const {  // a min-heap on (rank, pos)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeTarget* m = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(i), m->id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    const MergeTarget* now = FindMerge(cur.id, right.id);
    if (now == nullptr || now->id != top.id) continue;  // a stale entry
    cur.id = top.id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeTarget* m = FindMerge(symbols[cur.prev].id, cur.id)) {
        queue.push({m->rank, cur.prev, m->id});
      }
    }
    if (cur.next >= 0) {
      if (const MergeTarget* m = FindMerge(cur.id, symbols[cur.next].id)) {
        queue.push({m->rank, top.pos, m->id});
      }
    }
  }
  for (const Symbol& sym : symbols) {
    if (sym.len != 0) ids->push_back(sym.id);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenModel>> LoadBpeModel(const JsonField& f) {
  auto model = std::make_unique<BpeModel>();
  LINATTN_RETURN_IF_ERROR(model->Load(f));
  return std::unique_ptr<TokenModel>(std::move(model));
}

}  // namespace linattn::tokenizer_json
