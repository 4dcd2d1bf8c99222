// The Unigram model as `tokenizers` runs it (models/unigram/model.rs
// encode_optimized and tokenize): the best-scoring segmentation over byte
// positions, first candidate kept on ties (pieces by start, shorter first,
// then the unknown), a character no piece covers alone is unknown at
// min score − 10, consecutive unknowns fuse into one, and a fused unknown
// becomes byte-fallback <0xHH> tokens when the vocabulary has them all.
#include <limits>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "core/model/tokenizer_json/byte_trie.h"
#include "core/model/tokenizer_json/token_model.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"

namespace linattn::tokenizer_json {
namespace {

constexpr double kUnknownPenalty = 10.0;

class UnigramModel final : public TokenModel {
 public:
  absl::Status Tokenize(absl::string_view piece,
                        std::vector<int32_t>* ids) const override;
  std::optional<int32_t> TokenToId(absl::string_view token) const override {
    auto it = ids_.find(token);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* IdToToken(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return nullptr;
    return &pieces_[id];
  }
  size_t size() const override { return pieces_.size(); }
  int32_t id_limit() const override {
    return static_cast<int32_t>(pieces_.size());
  }

  absl::Status Load(const JsonField& f);

 private:
  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  absl::flat_hash_map<std::string, int32_t> ids_;
  ByteTrie trie_;
  double min_score_ = std::numeric_limits<double>::infinity();
  std::optional<int32_t> unk_id_;
  bool byte_fallback_ = false;
};

absl::Status UnigramModel::Load(const JsonField& f) {
  const JsonField vocab = f["vocab"];
  LINATTN_ASSIGN_OR_RETURN(size_t n, vocab.ArraySize());
  if (n > static_cast<size_t>(kMaxVocabulary)) {
    return vocab.Error(absl::StrCat("more than ", kMaxVocabulary, " entries"));
  }
  pieces_.reserve(n);
  scores_.reserve(n);
  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const json& e = vocab.value()[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_string() ||
        !e[1].is_number()) {
      return vocab.at(i).Error("must be [piece, score]");
    }
    pieces_.push_back(e[0].get<std::string>());
    scores_.push_back(e[1].get<double>());
    const auto id = static_cast<int32_t>(i);
    ids_[pieces_.back()] = id;  // a later duplicate wins, as in `tokenizers`
    trie_.Insert(pieces_.back(), id);
    min_score_ = std::min(min_score_, scores_.back());
  }
  if (!f["unk_id"].is_null()) {
    if (n == 0) return vocab.Error("is empty, so unk_id names nothing");
    LINATTN_ASSIGN_OR_RETURN(
        int64_t unk,
        f["unk_id"].Int(std::nullopt, 0, static_cast<int64_t>(n) - 1));
    unk_id_ = static_cast<int32_t>(unk);
  }
  LINATTN_ASSIGN_OR_RETURN(byte_fallback_, f["byte_fallback"].Bool(false));
  return absl::OkStatus();
}

absl::Status UnigramModel::Tokenize(absl::string_view s,
                                    std::vector<int32_t>* ids) const {
  if (s.empty()) return absl::OkStatus();
  struct Best {
    int32_t id = 0;
    double score = 0;
    int64_t starts_at = -1;
  };
  const double unk_score = min_score_ - kUnknownPenalty;
  std::vector<Best> best(s.size() + 1);
  for (size_t at = 0; at < s.size();) {
    const double here = best[at].score;
    const size_t char_len = Utf8Length(static_cast<unsigned char>(s[at]));
    bool single = false;
    auto offer = [&](size_t end, int32_t id, double score) {
      Best& t = best[end];
      const double candidate = score + here;
      if (t.starts_at < 0 || candidate > t.score) {
        t.score = candidate;
        t.starts_at = static_cast<int64_t>(at);
        t.id = id;
      }
    };
    // The trie holds each piece's id as the vocabulary maps it (the last
    // duplicate).
    trie_.Prefixes(s, at, [&](size_t len, int32_t id) {
      offer(at + len, id, scores_[id]);
      if (len == char_len) single = true;
    });
    if (!single) {
      if (!unk_id_) {
        return absl::InvalidArgumentError(
            "text: a character the vocabulary lacks, and model.unk_id is not "
            "set");
      }
      offer(at + char_len, *unk_id_, unk_score);
    }
    at += char_len;
  }
  // Back from the end: pieces, with consecutive unknowns fused.
  std::vector<std::pair<size_t, size_t>> spans;  // in reverse order
  std::vector<bool> unknown;
  for (size_t end = s.size(); end > 0;) {
    const Best& node = best[end];
    const auto start = static_cast<size_t>(node.starts_at);
    const bool is_unk = unk_id_ && node.id == *unk_id_;
    if (is_unk && !unknown.empty() && unknown.back()) {
      spans.back().first = start;
    } else {
      spans.push_back({start, end});
      unknown.push_back(is_unk);
    }
    end = start;
  }
  for (size_t k = spans.size(); k-- > 0;) {
    const absl::string_view text =
        s.substr(spans[k].first, spans[k].second - spans[k].first);
    if (auto it = ids_.find(text); it != ids_.end()) {
      ids->push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (unsigned char b : text) {
        auto it = ids_.find(absl::StrFormat("<0x%02X>", b));
        if (it == ids_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == text.size()) {
        ids->insert(ids->end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    ids->push_back(*unk_id_);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenModel>> LoadUnigramModel(
    const JsonField& f) {
  auto model = std::make_unique<UnigramModel>();
  LINATTN_RETURN_IF_ERROR(model->Load(f));
  return std::unique_ptr<TokenModel>(std::move(model));
}

absl::StatusOr<std::unique_ptr<TokenModel>> LoadTokenModel(const JsonField& f) {
  LINATTN_RETURN_IF_ERROR(f.ExpectObject());
  std::string type;
  if (f["type"].is_null()) {
    // `tokenizers` tells untagged models by their fields.
    if (f["merges"].value().is_array()) {
      type = "BPE";
    } else if (f["vocab"].value().is_array()) {
      type = "Unigram";
    } else {
      return f.Error(
          "has no \"type\", and is neither a BPE nor a Unigram model");
    }
  } else {
    LINATTN_ASSIGN_OR_RETURN(type, f.Type());
  }
  if (type == "BPE") return LoadBpeModel(f);
  if (type == "Unigram") return LoadUnigramModel(f);
  return f["type"].Unsupported(type);
}

}  // namespace linattn::tokenizer_json
