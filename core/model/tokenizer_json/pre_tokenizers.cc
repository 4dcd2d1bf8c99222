#include "core/model/tokenizer_json/pre_tokenizers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/model/tokenizer_json/byte_level.h"
#include "core/model/tokenizer_json/onig_regex.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"

namespace linattn::tokenizer_json {
namespace {

// PreTokenizedString::split: `split` runs on each piece that is not a
// token yet; tokens pass through; empty results are dropped.
template <typename Fn>
absl::Status SplitEach(std::vector<Piece>* pieces, Fn split) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (Piece& p : *pieces) {
    if (p.token >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    LINATTN_RETURN_IF_ERROR(split(p, &out));
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

// NormalizedString::prepend.
void Prepend(Piece* p, absl::string_view prefix) {
  p->text = absl::StrCat(prefix, p->text);
  if (p->origin_bytes > 0) p->origin_bytes += prefix.size();
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::shared_ptr<const OnigRegex> re, SplitBehavior behavior,
                    bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    return SplitEach(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      Cover cover;
      LINATTN_RETURN_IF_ERROR(re_->Cover(p.text, &cover));
      if (invert_) {
        for (auto& part : cover) part.second = !part.second;
      }
      SplitPiece(p, cover, behavior_, out);
      return absl::OkStatus();
    });
  }

 private:
  std::shared_ptr<const OnigRegex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(std::shared_ptr<const OnigRegex> re,
                        bool add_prefix_space)
      : re_(std::move(re)), add_prefix_space_(add_prefix_space) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    absl::Status split =
        SplitEach(pieces, [&](Piece& p, std::vector<Piece>* out) {
          if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) {
            Prepend(&p, " ");
          }
          if (re_ == nullptr) {
            if (!p.text.empty()) out->push_back(std::move(p));
            return absl::OkStatus();
          }
          Cover cover;
          LINATTN_RETURN_IF_ERROR(re_->Cover(p.text, &cover));
          SplitPiece(p, cover, SplitBehavior::kIsolated, out);
          return absl::OkStatus();
        });
    if (!split.ok()) return split;
    for (Piece& p : *pieces) {
      if (p.token >= 0) continue;
      const size_t origin =
          ToByteLevel(p.text.substr(0, p.origin_bytes)).size();
      p.text = ToByteLevel(p.text);
      p.origin_bytes = origin;
    }
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const OnigRegex> re_;  // null: use_regex false
  bool add_prefix_space_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme,
                        bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {
    size_t len;
    replacement_char_ = CodePointAt(replacement_, 0, &len);
  }
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    return SplitEach(pieces, [&](Piece& p, std::vector<Piece>* out) {
      std::string text;
      size_t origin = 0;
      for (size_t i = 0; i < p.text.size(); ++i) {
        if (p.text[i] == ' ') {
          text += replacement_;
        } else {
          text.push_back(p.text[i]);
        }
        if (i + 1 == p.origin_bytes) origin = text.size();
      }
      p.text = std::move(text);
      p.origin_bytes = origin;
      const bool starts =
          p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        Prepend(&p, replacement_);
      }
      if (!split_) {
        if (!p.text.empty()) out->push_back(std::move(p));
        return absl::OkStatus();
      }
      const char32_t r = replacement_char_;
      SplitPiece(p, CoverChars(p.text, [r](char32_t c) { return c == r; }),
                 SplitBehavior::kMergedWithNext, out);
      return absl::OkStatus();
    });
  }

 private:
  std::string replacement_;
  char32_t replacement_char_;
  PrependScheme scheme_;
  bool split_;
};

// Splits by a character predicate (Digits, Punctuation, WhitespaceSplit).
template <typename Pred>
class CharPreTokenizer final : public PreTokenizer {
 public:
  CharPreTokenizer(Pred pred, SplitBehavior behavior)
      : pred_(pred), behavior_(behavior) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    return SplitEach(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      SplitPiece(p, CoverChars(p.text, pred_), behavior_, out);
      return absl::OkStatus();
    });
  }

 private:
  Pred pred_;
  SplitBehavior behavior_;
};
template <typename Pred>
std::unique_ptr<PreTokenizer> MakeCharPreTokenizer(Pred pred,
                                                   SplitBehavior behavior) {
  return std::make_unique<CharPreTokenizer<Pred>>(pred, behavior);
}

// `tokenizers`' Whitespace: the regex crate's \w+|[^\w\s]+, inverted and
// removed (runs of word characters, runs of other non-space characters).
class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    return SplitEach(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      Cover cover;
      const std::string& t = p.text;
      size_t i = 0, last = 0;
      // 0: space, 1: word, 2: other
      auto kind = [](char32_t c) {
        return IsWordChar(c) ? 1 : IsWhiteSpace(c) ? 0 : 2;
      };
      while (i < t.size()) {
        size_t len;
        const int k = kind(CodePointAt(t, i, &len));
        if (k == 0) {
          i += len;
          continue;
        }
        size_t j = i + len;
        while (j < t.size()) {
          size_t l2;
          if (kind(CodePointAt(t, j, &l2)) != k) break;
          j += l2;
        }
        if (last < i) cover.push_back({{last, i}, true});
        cover.push_back({{i, j}, false});
        last = i = j;
      }
      if (last < t.size()) cover.push_back({{last, t.size()}, true});
      SplitPiece(p, cover, SplitBehavior::kRemoved, out);
      return absl::OkStatus();
    });
  }
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> s)
      : steps_(std::move(s)) {}
  absl::Status Apply(std::vector<Piece>* pieces) const override {
    for (const auto& step : steps_) {
      LINATTN_RETURN_IF_ERROR(step->Apply(pieces));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// GPT-2's split, as `tokenizers`' ByteLevel states it.
constexpr char kByteLevelPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

absl::StatusOr<SplitBehavior> LoadSplitBehavior(const JsonField& f) {
  LINATTN_ASSIGN_OR_RETURN(const std::string b, f.String());
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return f.Unsupported(b);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> LoadPreTokenizer(
    const JsonField& f) {
  if (f.is_null()) return nullptr;
  LINATTN_RETURN_IF_ERROR(f.ExpectObject());
  LINATTN_ASSIGN_OR_RETURN(const std::string type, f.Type());
  if (type == "Sequence") {
    const JsonField list = f["pretokenizers"];
    LINATTN_ASSIGN_OR_RETURN(size_t n, list.ArraySize());
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < n; ++i) {
      LINATTN_ASSIGN_OR_RETURN(auto step, LoadPreTokenizer(list.at(i)));
      if (step == nullptr) return list.at(i).Error("must be a pre-tokenizer");
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    LINATTN_ASSIGN_OR_RETURN(auto re, LoadPattern(f["pattern"]));
    LINATTN_ASSIGN_OR_RETURN(SplitBehavior b, LoadSplitBehavior(f["behavior"]));
    LINATTN_ASSIGN_OR_RETURN(bool invert, f["invert"].Bool(std::nullopt));
    return std::make_unique<SplitPreTokenizer>(std::move(re), b, invert);
  }
  if (type == "ByteLevel") {
    LINATTN_ASSIGN_OR_RETURN(bool prefix,
                             f["add_prefix_space"].Bool(std::nullopt));
    LINATTN_ASSIGN_OR_RETURN(bool use_regex, f["use_regex"].Bool(true));
    std::shared_ptr<const OnigRegex> re;
    if (use_regex) {
      LINATTN_ASSIGN_OR_RETURN(
          re, OnigRegex::Compile(kByteLevelPattern, f.where()));
    }
    return std::make_unique<ByteLevelPreTokenizer>(std::move(re), prefix);
  }
  if (type == "Metaspace") {
    LINATTN_ASSIGN_OR_RETURN(std::string replacement, f["replacement"].Char());
    PrependScheme scheme = PrependScheme::kAlways;
    if (!f["prepend_scheme"].is_null()) {
      LINATTN_ASSIGN_OR_RETURN(std::string s, f["prepend_scheme"].String());
      if (s == "always") {
        scheme = PrependScheme::kAlways;
      } else if (s == "first") {
        scheme = PrependScheme::kFirst;
      } else if (s == "never") {
        scheme = PrependScheme::kNever;
      } else {
        return f["prepend_scheme"].Unsupported(s);
      }
    }
    if (!f["add_prefix_space"].is_null()) {
      LINATTN_ASSIGN_OR_RETURN(bool add, f["add_prefix_space"].Bool(true));
      if (!add) {
        if (scheme != PrependScheme::kNever && !f["prepend_scheme"].is_null()) {
          return f["add_prefix_space"].Error(
              "false does not match the declared prepend_scheme");
        }
        scheme = PrependScheme::kNever;
      }
    }
    LINATTN_ASSIGN_OR_RETURN(bool split, f["split"].Bool(true));
    return std::make_unique<MetaspacePreTokenizer>(std::move(replacement),
                                                   scheme, split);
  }
  if (type == "Digits") {
    LINATTN_ASSIGN_OR_RETURN(bool individual,
                             f["individual_digits"].Bool(false));
    return MakeCharPreTokenizer(&IsNumeric, individual
                                                ? SplitBehavior::kIsolated
                                                : SplitBehavior::kContiguous);
  }
  if (type == "Punctuation") {
    SplitBehavior b = SplitBehavior::kIsolated;
    if (!f["behavior"].is_null()) {
      LINATTN_ASSIGN_OR_RETURN(b, LoadSplitBehavior(f["behavior"]));
    }
    return MakeCharPreTokenizer(&IsPunctuation, b);
  }
  if (type == "WhitespaceSplit") {
    return MakeCharPreTokenizer(&IsWhiteSpace, SplitBehavior::kRemoved);
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(
        MakeCharPreTokenizer(&IsWhiteSpace, SplitBehavior::kRemoved));
    steps.push_back(
        MakeCharPreTokenizer(&IsPunctuation, SplitBehavior::kIsolated));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  return f["type"].Unsupported(type);
}

}  // namespace linattn::tokenizer_json
