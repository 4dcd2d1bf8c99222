#include "core/model/tokenizer_json/onig_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "absl/strings/str_cat.h"
#include "core/model/tokenizer_json/unicode_chars.h"

namespace linattn::tokenizer_json {
namespace {

constexpr char kWord[] = R"(\p{L}\p{M}\p{N}\p{Pc})";
constexpr char kSpace[] = R"(\s\x{85})";
constexpr char kHex[] = "0-9a-fA-F";

absl::Status Refuse(size_t at, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("at offset ", at, ": ", what,
                   " (its Oniguruma meaning is not supported)"));
}

}  // namespace

absl::StatusOr<std::string> TranslateOnigPattern(absl::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 == p.size()) return Refuse(i, "a trailing backslash");
      const char e = p[++i];
      switch (e) {
        case 's':
          out += in_class ? kSpace : absl::StrCat("[", kSpace, "]");
          break;
        case 'S':
          if (in_class) return Refuse(i - 1, "\\S inside a bracket");
          absl::StrAppend(&out, "[^", kSpace, "]");
          break;
        case 'w':
          out += in_class ? kWord : absl::StrCat("[", kWord, "]");
          break;
        case 'W':
          if (in_class) return Refuse(i - 1, "\\W inside a bracket");
          absl::StrAppend(&out, "[^", kWord, "]");
          break;
        case 'h':
          out += in_class ? kHex : absl::StrCat("[", kHex, "]");
          break;
        case 'H':
          if (in_class) return Refuse(i - 1, "\\H inside a bracket");
          absl::StrAppend(&out, "[^", kHex, "]");
          break;
        case 'b':
        case 'B': {
          if (in_class) {  // backspace inside a class in both dialects
            out += "\\x{8}";
            break;
          }
          const std::string w = absl::StrCat("[", kWord, "]");
          absl::StrAppend(&out, "(?:(?<=", w, ")", e == 'b' ? "(?!" : "(?=", w,
                          ")|(?<!", w, ")", e == 'b' ? "(?=" : "(?!", w, "))");
          break;
        }
        case 'u': {
          size_t j = i + 1;
          while (j < p.size() && j < i + 5 &&
                 std::isxdigit(static_cast<unsigned char>(p[j]))) {
            ++j;
          }
          if (j != i + 5) return Refuse(i - 1, "\\u without four hex digits");
          absl::StrAppend(&out, "\\x{", p.substr(i + 1, 4), "}");
          i += 4;
          break;
        }
        case 'G':
          return Refuse(i - 1, "\\G");
        case 'K':
          return Refuse(i - 1, "\\K");
        case 'R':
        case 'X':
        case 'N':
        case 'O':
          return Refuse(i - 1, absl::StrCat("\\", std::string(1, e)));
        default:
          out.push_back('\\');
          out.push_back(e);
          // \p{…}, \P{…} and \x{…} carry their braces along.
          if ((e == 'p' || e == 'P' || e == 'x') && i + 1 < p.size() &&
              p[i + 1] == '{') {
            const size_t close = p.find('}', i + 1);
            if (close == absl::string_view::npos) {
              return Refuse(i - 1, "an unclosed \\p{ or \\x{");
            }
            out.append(p.data() + i + 1, close - i);
            i = close;
          }
          break;
      }
      continue;
    }
    if (in_class) {
      if (c == '[') {
        if (i + 1 < p.size() && p[i + 1] == ':') {
          return Refuse(i, "a POSIX bracket [:…:]");
        }
        return Refuse(i, "a nested character class");
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        return Refuse(i, "a class intersection &&");
      }
      if (c == ']') in_class = false;
      out.push_back(c);
      continue;
    }
    switch (c) {
      case '[':
        in_class = true;
        out.push_back(c);
        if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
        if (i + 1 < p.size() && p[i + 1] == ']') {  // a literal ']' first
          out += "\\]";
          ++i;
        }
        break;
      case '(':
        out.push_back(c);
        if (i + 1 < p.size() && p[i + 1] == '?') {
          out.push_back(p[++i]);
          if (i + 1 >= p.size()) return Refuse(i, "an unfinished group");
          const char k = p[i + 1];
          if (k == ':' || k == '=' || k == '!' || k == '>') break;
          if (k == '<' && i + 2 < p.size() &&
              (p[i + 2] == '=' || p[i + 2] == '!')) {
            break;
          }
          if (k == '<' || k == '\'') break;  // a named group
          // Inline options: (?imx-imx) or (?imx-imx:…).
          size_t j = i + 1;
          for (; j < p.size() && p[j] != ')' && p[j] != ':'; ++j) {
            const char f = p[j];
            if (f == 'i' || f == 'x' || f == '-') {
              out.push_back(f);
            } else if (f == 'm') {
              out.push_back('s');
            } else {
              return Refuse(j, absl::StrCat("the inline option '",
                                            std::string(1, f), "'"));
            }
          }
          i = j - 1;
        }
        break;
      case '}':
        out.push_back(c);
        if (i + 1 < p.size() && p[i + 1] == '+') {
          return Refuse(i + 1, "a {n,m} quantifier followed by '+'");
        }
        break;
      default:
        out.push_back(c);
        break;
    }
  }
  if (in_class) return Refuse(p.size(), "an unclosed character class");
  return out;
}

absl::StatusOr<std::shared_ptr<const OnigRegex>> OnigRegex::Compile(
    absl::string_view pattern, absl::string_view field) {
  auto translated = TranslateOnigPattern(pattern);
  if (!translated.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", translated.status().message()));
  }
  std::shared_ptr<OnigRegex> re(new OnigRegex());
  re->field_ = std::string(field);
  re->translated_ = std::move(*translated);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(re->translated_.data()),
      re->translated_.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error,
      &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not a pattern linattn can run (",
                     reinterpret_cast<const char*>(message), ")"));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back when it cannot
  re->code_ = code;
  return std::shared_ptr<const OnigRegex>(std::move(re));
}

absl::StatusOr<std::shared_ptr<const OnigRegex>> OnigRegex::Literal(
    absl::string_view text, absl::string_view field) {
  std::string escaped;
  for (char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x80 && !std::isalnum(b)) escaped.push_back('\\');
    if (b < 0x20 || b == 0x7F) {
      escaped.pop_back();
      absl::StrAppend(&escaped, "\\x{", absl::Hex(b), "}");
      continue;
    }
    escaped.push_back(c);
  }
  return Compile(escaped, field);
}

OnigRegex::~OnigRegex() {
  if (code_ != nullptr) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

namespace {

// One JIT stack per thread, larger than PCRE2's 32 KiB default so that the
// lookaheads of long whitespace runs do not run out.
struct MatchResources {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  MatchResources() {
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchResources() {
    pcre2_match_context_free(context);
    if (stack != nullptr) pcre2_jit_stack_free(stack);
  }
};

}  // namespace

absl::Status OnigRegex::FindAll(absl::string_view text,
                                std::vector<Span>* out) const {
  thread_local MatchResources resources;
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t from = 0;
  bool have_last = false;
  size_t last_end = 0;
  absl::Status status;
  while (from <= text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), from,
                               PCRE2_NO_UTF_CHECK, data, resources.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      status = absl::ResourceExhaustedError(
          absl::StrCat("text: ", field_, " could not be matched (",
                       reinterpret_cast<const char*>(message), ")"));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
    const size_t s = ov[0], e = ov[1];
    if (s == e && have_last && last_end == e) {
      // onig's find_iter: no empty match where the last one ended.
      if (from >= text.size()) break;
      from += Utf8Length(static_cast<unsigned char>(text[from]));
      continue;
    }
    out->emplace_back(s, e);
    have_last = true;
    last_end = e;
    from = e;
  }
  pcre2_match_data_free(data);
  return status;
}

absl::Status OnigRegex::Cover(absl::string_view text,
                              std::vector<std::pair<Span, bool>>* out) const {
  if (text.empty()) {
    out->push_back({{0, 0}, false});
    return absl::OkStatus();
  }
  std::vector<Span> matches;
  if (absl::Status s = FindAll(text, &matches); !s.ok()) return s;
  size_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.first) out->push_back({{prev, m.first}, false});
    out->push_back({m, true});
    prev = m.second;
  }
  if (prev != text.size()) out->push_back({{prev, text.size()}, false});
  return absl::OkStatus();
}

}  // namespace linattn::tokenizer_json
