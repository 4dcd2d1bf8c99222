#include "core/model/jinja/lexer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/model/jinja/text.h"
#include "core/util/utf8.h"

namespace linattn::jinja {

std::string At(int line, int column, absl::string_view what) {
  return absl::StrCat("line ", line, ", column ", column, ": ", what);
}

namespace {

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      // The next tag: {{, {% or {#.
      size_t tag = pos_;
      for (;;) {
        tag = src_.find('{', tag);
        if (tag == std::string::npos || tag + 1 >= src_.size()) {
          tag = std::string::npos;
          break;
        }
        const char c = src_[tag + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++tag;
      }
      if (tag == std::string::npos) {
        Data(pos_, src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      const char kind = src_[tag + 1];
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign != '-' && sign != '+') sign = '\0';
      std::string text = src_.substr(pos_, tag - pos_);
      if (sign == '-') {
        text = std::string(RStripSpace(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: the whitespace between a line's start and a block
        // or comment tag goes.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            IsAllSpace(absl::string_view(text).substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      Data(pos_, text);
      pos_ = tag + 2 + (sign ? 1 : 0);
      absl::Status s;
      if (kind == '#') {
        s = Comment(tag);
      } else if (kind == '%' && RawBegins()) {
        s = Raw(tag);
      } else {
        s = Tag(tag, kind == '%');
      }
      if (!s.ok()) return s;
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Make(Token::Kind::kEnd, src_.size(), ""));
    return std::move(tokens_);
  }

 private:
  std::pair<int, int> LineCol(size_t offset) const {
    auto it =
        std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    const size_t start = line_starts_[line - 1];
    return {static_cast<int>(line),
            static_cast<int>(CodePointCount(absl::string_view(src_).substr(
                                 start, offset - start)) +
                             1)};
  }
  absl::Status Error(size_t offset, absl::string_view what) const {
    auto [line, col] = LineCol(offset);
    return absl::InvalidArgumentError(At(line, col, what));
  }
  Token Make(Token::Kind kind, size_t offset, std::string text) const {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    std::tie(t.line, t.column) = LineCol(offset);
    return t;
  }
  void Data(size_t offset, std::string text) {
    if (!text.empty())
      tokens_.push_back(Make(Token::Kind::kData, offset, text));
  }

  // After a block end: `-%}` eats the whitespace that follows, `+%}` keeps
  // it, and a plain `%}` (trim_blocks) eats one newline.
  void AfterBlockEnd(char sign) {
    if (sign == '-') {
      while (pos_ < src_.size()) {
        const size_t n = SpaceLengthAt(src_, pos_);
        if (n == 0) break;
        pos_ += n;
      }
    } else if (sign == '\0' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  absl::Status Comment(size_t tag) {
    size_t q = pos_;
    q = src_.find("#}", q);
    if (q == std::string::npos) return Error(tag, "Missing end of comment tag");
    char sign = '\0';
    if (q > pos_ && (src_[q - 1] == '-' || src_[q - 1] == '+')) {
      sign = src_[q - 1];
    }
    pos_ = q + 2;
    AfterBlockEnd(sign);
    return absl::OkStatus();
  }

  // {%[-+]? raw [-]?%}
  bool RawBegins() const {
    size_t p = SkipSpace(pos_);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = SkipSpace(p + 3);
    return src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 2, "%}") == 0;
  }
  size_t SkipSpace(size_t p) const {
    while (p < src_.size()) {
      const size_t n = SpaceLengthAt(src_, p);
      if (n == 0) break;
      p += n;
    }
    return p;
  }

  absl::Status Raw(size_t tag) {
    size_t p = SkipSpace(SkipSpace(pos_) + 3);
    if (src_[p] == '-') {
      pos_ = p + 3;
      AfterBlockEnd('-');
    } else {
      pos_ = p + 2;  // no trim_blocks newline after raw's start
    }
    // The body runs to {%[-+]? endraw [-+]?%}.
    size_t q = pos_;
    for (;;) {
      q = src_.find("{%", q);
      if (q == std::string::npos)
        return Error(tag, "Missing end of raw directive");
      size_t r = q + 2;
      char sign = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+'))
        sign = src_[r++];
      r = SkipSpace(r);
      if (src_.compare(r, 6, "endraw") != 0) {
        q += 2;
        continue;
      }
      r = SkipSpace(r + 6);
      char end_sign = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) {
        end_sign = src_[r++];
      }
      if (src_.compare(r, 2, "%}") != 0) {
        q += 2;
        continue;
      }
      std::string text = src_.substr(pos_, q - pos_);
      if (sign == '-') {
        text = std::string(RStripSpace(text));
      } else if (sign != '+') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 && l_pos < text.size() &&
            IsAllSpace(absl::string_view(text).substr(l_pos))) {
          text.resize(l_pos);
        }
      }
      Data(pos_, text);
      pos_ = r + 2;
      AfterBlockEnd(end_sign);
      return absl::OkStatus();
    }
  }

  absl::Status Tag(size_t tag, bool block) {
    tokens_.push_back(Make(
        block ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, tag, ""));
    std::vector<char> balance;
    for (;;) {
      if (pos_ >= src_.size()) {
        return Error(tag, block ? "unexpected end of template: the block tag "
                                  "is not closed"
                                : "unexpected end of template: the {{ tag is "
                                  "not closed");
      }
      if (balance.empty()) {
        const char* end = block ? "%}" : "}}";
        char sign = '\0';
        size_t p = pos_;
        if ((src_[p] == '-' || (block && src_[p] == '+')) &&
            src_.compare(p + 1, 2, end) == 0) {
          sign = src_[p];
          ++p;
        }
        if (src_.compare(p, 2, end) == 0) {
          tokens_.push_back(Make(
              block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, p, ""));
          pos_ = p + 2;
          if (block) {
            AfterBlockEnd(sign);
          } else if (sign == '-') {
            AfterBlockEnd('-');
          }
          return absl::OkStatus();
        }
      }
      if (const size_t n = SpaceLengthAt(src_, pos_); n > 0) {
        pos_ += n;
        continue;
      }
      if (absl::Status s = Lex(&balance); !s.ok()) return s;
    }
  }

  absl::Status Lex(std::vector<char>* balance) {
    const size_t start = pos_;
    const char c = src_[pos_];
    if (absl::ascii_isdigit(c)) return Number();
    if (absl::ascii_isalpha(c) || c == '_') {
      size_t e = pos_;
      while (e < src_.size() &&
             (absl::ascii_isalnum(src_[e]) || src_[e] == '_')) {
        ++e;
      }
      tokens_.push_back(
          Make(Token::Kind::kName, start, src_.substr(pos_, e - pos_)));
      pos_ = e;
      return absl::OkStatus();
    }
    if (c == '\'' || c == '"') return String();
    static const char* const kOps[] = {
        "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
        "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (src_.compare(pos_, n, op) != 0) continue;
      if (n == 1 && (c == '(' || c == '[' || c == '{')) {
        balance->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (n == 1 && (c == ')' || c == ']' || c == '}')) {
        if (balance->empty()) {
          return Error(pos_,
                       absl::StrCat("unexpected '", std::string(1, c), "'"));
        }
        if (balance->back() != c) {
          return Error(
              pos_,
              absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                           std::string(1, balance->back()), "'"));
        }
        balance->pop_back();
      }
      tokens_.push_back(Make(Token::Kind::kOp, start, op));
      pos_ += n;
      return absl::OkStatus();
    }
    return Error(
        pos_, absl::StrCat("unexpected char '",
                           src_.substr(pos_, Utf8LengthAt(src_, pos_)), "'"));
  }

  absl::Status Number() {
    const size_t start = pos_;
    if (src_[pos_] == '0' && pos_ + 1 < src_.size()) {
      const char base_char = absl::ascii_tolower(src_[pos_ + 1]);
      const int base = base_char == 'x'   ? 16
                       : base_char == 'o' ? 8
                       : base_char == 'b' ? 2
                                          : 0;
      if (base != 0) return Radix(base);
    }
    auto digits = [&](size_t p) {
      // (\d+_)*\d+
      size_t e = p;
      while (e < src_.size()) {
        if (absl::ascii_isdigit(src_[e])) {
          ++e;
        } else if (src_[e] == '_' && e > p && e + 1 < src_.size() &&
                   absl::ascii_isdigit(src_[e + 1])) {
          ++e;
        } else {
          break;
        }
      }
      return e;
    };
    size_t e = digits(pos_);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        absl::ascii_isdigit(src_[e + 1])) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && absl::ascii_isdigit(src_[x])) {
        e = digits(x);
        is_float = true;
      }
    }
    std::string literal;
    for (size_t i = start; i < e; ++i) {
      if (src_[i] != '_') literal.push_back(src_[i]);
    }
    Token t = Make(is_float ? Token::Kind::kFloat : Token::Kind::kInt, start,
                   src_.substr(start, e - start));
    if (is_float) {
      t.float_value = std::strtod(literal.c_str(), nullptr);
    } else {
      if (literal.size() > 1 && literal[0] == '0' &&
          literal.find_first_not_of('0') != std::string::npos) {
        return Error(start,
                     "an integer with a leading zero is not a Jinja "
                     "literal");
      }
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(literal.c_str(), &end, 10);
      if (errno == ERANGE) {
        return Error(start, "integer literal out of the 64-bit range");
      }
      t.int_value = v;
    }
    tokens_.push_back(std::move(t));
    pos_ = e;
    return absl::OkStatus();
  }

  // 0x…, 0o…, 0b… (digits may be separated by single underscores).
  absl::Status Radix(int base) {
    const size_t start = pos_;
    size_t e = pos_ + 2;
    uint64_t v = 0;
    bool any = false;
    for (; e < src_.size(); ++e) {
      const char c = absl::ascii_tolower(src_[e]);
      if (c == '_' && any) continue;
      int d = absl::ascii_isdigit(c)   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                       : 99;
      if (d >= base) break;
      if (v > (static_cast<uint64_t>(INT64_MAX) - d) / base) {
        return Error(start, "integer literal out of the 64-bit range");
      }
      v = v * base + d;
      any = true;
    }
    if (!any) return Error(start, "an integer literal without digits");
    Token t = Make(Token::Kind::kInt, start, src_.substr(start, e - start));
    t.int_value = static_cast<int64_t>(v);
    tokens_.push_back(std::move(t));
    pos_ = e;
    return absl::OkStatus();
  }

  // A quoted string, unescaped as Python's 'unicode-escape' does.
  absl::Status String() {
    const size_t start = pos_;
    const char quote = src_[pos_];
    size_t p = pos_ + 1;
    std::string value;
    while (p < src_.size() && src_[p] != quote) {
      if (src_[p] != '\\') {
        value.push_back(src_[p++]);
        continue;
      }
      if (p + 1 >= src_.size()) break;
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          value.push_back('\\');
          break;
        case '\'':
          value.push_back('\'');
          break;
        case '"':
          value.push_back('"');
          break;
        case 'a':
          value.push_back('\a');
          break;
        case 'b':
          value.push_back('\b');
          break;
        case 'f':
          value.push_back('\f');
          break;
        case 'n':
          value.push_back('\n');
          break;
        case 'r':
          value.push_back('\r');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'v':
          value.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            if (p + k >= src_.size() || !absl::ascii_isxdigit(src_[p + k])) {
              return Error(start,
                           absl::StrCat("truncated \\", std::string(1, e),
                                        " escape in a string"));
            }
            const char h = absl::ascii_tolower(src_[p + k]);
            cp = cp * 16 + (absl::ascii_isdigit(h) ? h - '0' : h - 'a' + 10);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return Error(start, "a string escape names no Unicode character");
          }
          p += n;
          value += FromCodePoints(std::u32string(1, cp));
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = e - '0';
            for (int k = 0;
                 k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7';
                 ++k) {
              cp = cp * 8 + (src_[p++] - '0');
            }
            value += FromCodePoints(std::u32string(1, cp));
          } else if (e == 'N') {
            return Error(start, "\\N{…} string escapes are not supported");
          } else {
            // Python keeps an unknown escape as written.
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    if (p >= src_.size()) return Error(start, "unterminated string");
    tokens_.push_back(Make(Token::Kind::kString, start, std::move(value)));
    pos_ = p + 1;
    return absl::OkStatus();
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source) {
  if (!IsValidUtf8(source)) {
    return absl::InvalidArgumentError("the template is not valid UTF-8");
  }
  // Newlines as Jinja reads them: \r\n and \r are \n, and one final
  // newline is dropped (keep_trailing_newline is off).
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text.push_back(source[i]);
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return Lexer(std::move(text)).Run();
}

}  // namespace linattn::jinja
