#include "core/model/tokenizer_json/added_tokens.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"

namespace linattn::tokenizer_json {
namespace {

// The regex crate's \w$ and ^\w (Unicode word characters).
bool EndsWithWord(absl::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
    --start;
  }
  size_t len;
  return IsWordChar(CodePointAt(s, start, &len));
}
bool StartsWithWord(absl::string_view s) {
  if (s.empty()) return false;
  size_t len;
  return IsWordChar(CodePointAt(s, 0, &len));
}
// Where the whitespace at the end of s begins (\s*$).
size_t TrailingSpaceStart(absl::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    size_t len;
    if (!IsWhiteSpace(CodePointAt(s, start, &len))) break;
    end = start;
  }
  return end;
}
// The length of the whitespace at the start of s (^\s*).
size_t LeadingSpaceLength(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    if (!IsWhiteSpace(CodePointAt(s, i, &len))) break;
    i += len;
  }
  return i;
}

}  // namespace

absl::Status AddedTokens::Load(const JsonField& list, const TokenModel& model,
                               const Normalizer* normalizer) {
  if (list.is_null()) return absl::OkStatus();
  LINATTN_ASSIGN_OR_RETURN(size_t n, list.ArraySize());
  absl::flat_hash_map<std::string, int32_t> by_content;
  // The file's tokens are added in one AddedVocabulary::add_tokens call:
  // new ids count up from the model's vocabulary size.
  auto next_id = static_cast<int32_t>(model.size());
  for (size_t i = 0; i < n; ++i) {
    const JsonField f = list.at(i);
    LINATTN_RETURN_IF_ERROR(f.ExpectObject());
    AddedToken t;
    LINATTN_ASSIGN_OR_RETURN(t.content, f["content"].String());
    LINATTN_ASSIGN_OR_RETURN(t.special, f["special"].Bool(false));
    LINATTN_ASSIGN_OR_RETURN(t.lstrip, f["lstrip"].Bool(false));
    LINATTN_ASSIGN_OR_RETURN(t.rstrip, f["rstrip"].Bool(false));
    LINATTN_ASSIGN_OR_RETURN(t.single_word, f["single_word"].Bool(false));
    LINATTN_ASSIGN_OR_RETURN(t.normalized, f["normalized"].Bool(!t.special));
    LINATTN_ASSIGN_OR_RETURN(int64_t stated,
                             f["id"].Int(std::nullopt, 0, kMaxVocabulary - 1));
    if (t.content.empty()) continue;  // `tokenizers` ignores these
    // The id the vocabulary already gives the content, else the next new
    // one.
    if (auto it = by_content.find(t.content); it != by_content.end()) {
      t.id = it->second;
    } else if (auto id = model.TokenToId(t.content)) {
      t.id = *id;
    } else {
      t.id = next_id++;
    }
    (void)stated;  // `tokenizers` only warns when the file says otherwise
    by_content[t.content] = t.id;
    t.normalized_content = t.content;
    if (t.normalized && normalizer != nullptr) {
      LINATTN_ASSIGN_OR_RETURN(t.normalized_content,
                               NormalizeText(*normalizer, t.content));
    }
    // A later token of the same id replaces the earlier one.
    if (auto it = by_id_.find(t.id); it != by_id_.end()) {
      tokens_[it->second] = t;
    } else {
      by_id_[t.id] = tokens_.size();
      tokens_.push_back(t);
    }
  }
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const AddedToken& t = tokens_[k];
    id_limit_ = std::max(id_limit_, t.id + 1);
    if (t.normalized) {
      if (!t.normalized_content.empty()) {
        normalized_.trie.Insert(t.normalized_content, static_cast<int32_t>(k));
      }
    } else {
      raw_.trie.Insert(t.content, static_cast<int32_t>(k));
    }
  }
  return absl::OkStatus();
}

void AddedTokens::Split(const Matcher& m, std::vector<Piece>* pieces) const {
  if (m.trie.empty()) return;
  std::vector<Piece> out;
  out.reserve(pieces->size());
  auto slice = [&out](const Piece& p, size_t begin, size_t end, int32_t token) {
    if (begin >= end) return;
    Piece s;
    s.text = p.text.substr(begin, end - begin);
    s.token = token;
    s.at_origin = p.at_origin && begin < p.origin_bytes;
    s.origin_bytes =
        s.at_origin ? std::min(p.origin_bytes - begin, end - begin) : 0;
    out.push_back(std::move(s));
  };
  for (Piece& p : *pieces) {
    if (p.token >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    const absl::string_view text = p.text;
    size_t start_offset = 0;
    for (size_t i = 0; i < text.size();) {
      size_t best_len = 0;
      int32_t best = -1;
      m.trie.Prefixes(text, i, [&](size_t len, int32_t k) {
        best_len = len;
        best = k;
      });
      if (best < 0) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + best_len;
      i = stop;  // leftmost-longest: the scan goes on after this match
      const AddedToken& t = tokens_[best];
      if (t.single_word) {
        const bool start_ok =
            start == 0 || !EndsWithWord(text.substr(0, start));
        const bool stop_ok =
            stop == text.size() || !StartsWithWord(text.substr(stop));
        if (!start_ok || !stop_ok) continue;
      }
      if (t.lstrip) {
        start =
            std::max(TrailingSpaceStart(text.substr(0, start)), start_offset);
      }
      if (t.rstrip) stop += LeadingSpaceLength(text.substr(stop));
      if (start_offset < start) slice(p, start_offset, start, -1);
      slice(p, start, stop, t.id);
      start_offset = stop;
    }
    if (start_offset < text.size()) slice(p, start_offset, text.size(), -1);
  }
  *pieces = std::move(out);
}

}  // namespace linattn::tokenizer_json
