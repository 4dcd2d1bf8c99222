#include "core/model/rwkv_world_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/model/tokenizer_json/byte_trie.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"

namespace linattn {
namespace {

bool HexValue(absl::string_view digits, uint32_t* value) {
  *value = 0;
  for (char c : digits) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
    const uint32_t d = absl::ascii_isdigit(static_cast<unsigned char>(c))
                           ? c - '0'
                           : (absl::ascii_tolower(c) - 'a' + 10);
    *value = *value * 16 + d;
  }
  return true;
}

// The bytes of a Python str or bytes literal as repr() writes them (the
// token's part of a line); an error says what is wrong with it.
absl::StatusOr<std::string> ParseLiteral(absl::string_view s) {
  s = absl::StripLeadingAsciiWhitespace(s);
  bool bytes = false;
  if (!s.empty() && (s[0] == 'b' || s[0] == 'B')) {
    bytes = true;
    s.remove_prefix(1);
  }
  if (s.size() < 2 || (s[0] != '\'' && s[0] != '"') || s.back() != s[0]) {
    return absl::InvalidArgumentError(
        "the token is not a quoted Python str or bytes literal");
  }
  const char quote = s[0];
  const absl::string_view body = s.substr(1, s.size() - 2);
  std::string out;
  for (size_t i = 0; i < body.size();) {
    const unsigned char c = body[i];
    if (c == static_cast<unsigned char>(quote)) {
      return absl::InvalidArgumentError(
          "an unescaped quote inside the token's literal");
    }
    if (c != '\\') {
      if (bytes && c >= 0x80) {
        return absl::InvalidArgumentError(
            "a bytes literal holds only ASCII characters");
      }
      // str: the file's own UTF-8 (checked whole before parsing).
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if (i + 1 >= body.size()) {
      return absl::InvalidArgumentError("the literal ends in a backslash");
    }
    const char e = body[i + 1];
    i += 2;
    uint32_t value = 0;
    switch (e) {
      case '\\':
      case '\'':
      case '"':
        out.push_back(e);
        continue;
      case 'a':
        out.push_back('\a');
        continue;
      case 'b':
        out.push_back('\b');
        continue;
      case 'f':
        out.push_back('\f');
        continue;
      case 'n':
        out.push_back('\n');
        continue;
      case 'r':
        out.push_back('\r');
        continue;
      case 't':
        out.push_back('\t');
        continue;
      case 'v':
        out.push_back('\v');
        continue;
      case 'x':
        if (i + 2 > body.size() || !HexValue(body.substr(i, 2), &value)) {
          return absl::InvalidArgumentError("\\x takes two hex digits");
        }
        i += 2;
        break;
      case 'u':
      case 'U': {
        if (bytes) {  // not an escape in bytes: both characters stay
          out.push_back('\\');
          out.push_back(e);
          continue;
        }
        const size_t n = e == 'u' ? 4 : 8;
        if (i + n > body.size() || !HexValue(body.substr(i, n), &value)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "\\", std::string(1, e), " takes ", n, " hex digits"));
        }
        i += n;
        break;
      }
      case 'N':
        return absl::InvalidArgumentError("\\N{…} escapes are not read");
      default:
        if (e >= '0' && e <= '7') {
          value = e - '0';
          for (int k = 0;
               k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7';
               ++k, ++i) {
            value = value * 8 + (body[i] - '0');
          }
          break;
        }
        // Python keeps an unknown escape as written.
        out.push_back('\\');
        --i;
        continue;
    }
    if (bytes) {
      if (value > 0xFF) {
        return absl::InvalidArgumentError("a bytes escape above \\xff (\\377)");
      }
      out.push_back(static_cast<char>(value));
    } else {
      if (value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
        return absl::InvalidArgumentError(
            absl::StrCat("code point ", value, " has no UTF-8 encoding"));
      }
      tokenizer_json::AppendUtf8(static_cast<char32_t>(value), &out);
    }
  }
  return out;
}

class RwkvWorldTokenizer final : public Tokenizer {
 public:
  RwkvWorldTokenizer(std::vector<std::string> bytes_of,
                     tokenizer_json::ByteTrie trie)
      : bytes_of_(std::move(bytes_of)), trie_(std::move(trie)) {}

  std::string kind() const override { return "rwkv_world"; }
  uint32_t size() const override {
    return static_cast<uint32_t>(bytes_of_.size());
  }

  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const override {
    std::vector<int32_t> ids;
    size_t at = 0;
    while (at < text.size()) {
      // The longest token that is a prefix of text[at..) (the trie calls
      // back shortest first): every byte has one (checked at load), so each
      // step moves on.
      int32_t best = -1;
      size_t length = 0;
      trie_.Prefixes(text, at, [&](size_t n, int32_t id) {
        best = id;
        length = n;
      });
      if (best < 0) {
        return absl::InternalError("a byte without a token of its own");
      }
      ids.push_back(best);
      at += length;
    }
    return ids;
  }

  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= bytes_of_.size()) return "";
    return bytes_of_[id];
  }

 private:
  std::vector<std::string> bytes_of_;  // by id; "" for id 0 and gaps
  tokenizer_json::ByteTrie trie_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseRwkvWorldVocabulary(
    absl::string_view text, absl::string_view name) {
  if (text.size() > kMaxRwkvVocabBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", text.size(),
                     " bytes; a vocabulary is read "
                     "up to ",
                     kMaxRwkvVocabBytes));
  }
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": not UTF-8 text (the file is read as UTF-8)"));
  }
  std::vector<std::pair<std::string, int32_t>> tokens;
  std::vector<std::string> bytes_of;
  uint64_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto refuse = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": line ", line_no, ": ", why));
    };
    const size_t first_space = line.find(' ');
    const size_t last_space = line.rfind(' ');
    if (first_space == absl::string_view::npos || last_space == first_space) {
      return refuse("expected `ID LITERAL LENGTH`");
    }
    uint32_t id = 0, length = 0;
    if (!absl::SimpleAtoi(line.substr(0, first_space), &id) ||
        !absl::ascii_isdigit(static_cast<unsigned char>(line[0])) || id == 0 ||
        id > kMaxRwkvTokenId) {
      return refuse(absl::StrCat("the id must be in [1, ", kMaxRwkvTokenId,
                                 "] (0 is the end of text)"));
    }
    const absl::string_view length_text = line.substr(last_space + 1);
    if (length_text.empty() ||
        !std::all_of(length_text.begin(), length_text.end(),
                     [](char c) { return c >= '0' && c <= '9'; }) ||
        !absl::SimpleAtoi(length_text, &length)) {
      return refuse("the length must be a number of bytes");
    }
    absl::StatusOr<std::string> bytes =
        ParseLiteral(line.substr(first_space, last_space - first_space));
    if (!bytes.ok()) return refuse(bytes.status().message());
    if (bytes->empty() || bytes->size() > kMaxRwkvTokenBytes) {
      return refuse(
          absl::StrCat("a token holds 1 to ", kMaxRwkvTokenBytes, " bytes"));
    }
    if (bytes->size() != length) {
      return refuse(absl::StrCat("the token has ", bytes->size(),
                                 " bytes, the line says ", length));
    }
    if (id < bytes_of.size() && !bytes_of[id].empty()) {
      return refuse(absl::StrCat("id ", id, " appears twice"));
    }
    if (id >= bytes_of.size()) bytes_of.resize(id + 1);
    bytes_of[id] = *bytes;
    tokens.emplace_back(*std::move(bytes), static_cast<int32_t>(id));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no tokens"));
  }
  // One id per token: sorted by bytes, equal neighbours repeat.
  std::vector<uint32_t> order(tokens.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return tokens[a].first < tokens[b].first;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (tokens[order[i]].first == tokens[order[i - 1]].first) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ids ", tokens[order[i - 1]].second, " and ",
                       tokens[order[i]].second, " are the same token"));
    }
  }
  tokenizer_json::ByteTrie trie;
  for (const auto& [bytes, id] : tokens) trie.Insert(bytes, id);
  for (int b = 0; b < 256; ++b) {
    bool single = false;
    trie.Prefixes(std::string(1, static_cast<char>(b)), 0,
                  [&](size_t, int32_t) { single = true; });
    if (!single) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": byte ", b,
          " has no token of its own (greedy matching needs all 256)"));
    }
  }
  return std::make_unique<RwkvWorldTokenizer>(std::move(bytes_of),
                                              std::move(trie));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadRwkvWorldTokenizer(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > kMaxRwkvVocabBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": larger than a vocabulary is read (",
                     kMaxRwkvVocabBytes, " bytes)"));
  }
  in.seekg(0);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  if (!in) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ParseRwkvWorldVocabulary(text, path);
}

}  // namespace linattn
