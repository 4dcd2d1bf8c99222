#include "core/model/tokenizer_json/decoders.h"

#include "absl/strings/str_replace.h"
#include "core/model/tokenizer_json/byte_level.h"
#include "core/model/tokenizer_json/onig_regex.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"

namespace linattn::tokenizer_json {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

class ByteLevelDecoder final : public Decoder {
 public:
  void Chain(std::vector<std::string>* tokens, DecodeMode mode) const override {
    std::string bytes;
    for (const std::string& t : *tokens) bytes += FromByteLevel(t);
    tokens->assign(1, mode == DecodeMode::kText ? ToValidUtf8(bytes) : bytes);
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepends)
      : replacement_(std::move(replacement)), prepends_(prepends) {}
  void Chain(std::vector<std::string>* tokens, DecodeMode mode) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const bool drop = i == 0 && prepends_ && mode == DecodeMode::kText;
      (*tokens)[i] =
          absl::StrReplaceAll((*tokens)[i], {{replacement_, drop ? "" : " "}});
    }
  }

 private:
  std::string replacement_;
  bool prepends_;  // prepend_scheme is not "never"
};

// u8::from_str_radix(s, 16) on two characters: an optional '+' then digits.
int ParseHexByte(absl::string_view s) {
  size_t i = 0;
  if (s[0] == '+') i = 1;
  if (i == s.size()) return -1;
  int v = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  void Chain(std::vector<std::string>* tokens, DecodeMode mode) const override {
    std::vector<std::string> out;
    std::string run;
    auto flush = [&] {
      if (run.empty()) return;
      if (mode == DecodeMode::kPiece || IsValidUtf8(run)) {
        out.push_back(run);
      } else {
        for (size_t k = 0; k < run.size(); ++k) out.push_back(kReplacementChar);
      }
      run.clear();
    };
    for (std::string& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        byte = ParseHexByte(absl::string_view(t).substr(3, 2));
      }
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void Chain(std::vector<std::string>* tokens, DecodeMode) const override {
    std::string all;
    for (const std::string& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void Chain(std::vector<std::string>* tokens, DecodeMode mode) const override {
    if (mode == DecodeMode::kPiece) return;
    for (std::string& t : *tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (offset, char)
      for (size_t i = 0; i < t.size();) {
        size_t len;
        chars.push_back({i, CodePointAt(t, i, &len)});
        i += len;
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < start_ && i < chars.size(); ++i) {
        if (chars[i].second != content_) break;
        start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        const size_t index = chars.size() - i - 1;
        if (chars[index].second != content_) break;
        stop_cut = index;
      }
      if (stop_cut <= start_cut) {
        t.clear();
        continue;
      }
      const size_t begin =
          start_cut < chars.size() ? chars[start_cut].first : t.size();
      const size_t end =
          stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::shared_ptr<const OnigRegex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  void Chain(std::vector<std::string>* tokens, DecodeMode) const override {
    for (std::string& t : *tokens) {
      // Bytes a piece holds that are not UTF-8 yet are left as they are.
      if (!IsValidUtf8(t)) continue;
      std::vector<Span> matches;
      if (!re_->FindAll(t, &matches).ok() || matches.empty()) continue;
      std::string out;
      size_t last = 0;
      for (const Span& m : matches) {
        out.append(t, last, m.first - last);
        out += content_;
        last = m.second;
      }
      out.append(t, last, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::shared_ptr<const OnigRegex> re_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void Chain(std::vector<std::string>* tokens, DecodeMode mode) const override {
    for (const auto& step : steps_) step->Chain(tokens, mode);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> LoadDecoder(const JsonField& f) {
  if (f.is_null()) return nullptr;
  LINATTN_RETURN_IF_ERROR(f.ExpectObject());
  LINATTN_ASSIGN_OR_RETURN(const std::string type, f.Type());
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Metaspace") {
    LINATTN_ASSIGN_OR_RETURN(std::string replacement, f["replacement"].Char());
    bool prepends = true;
    if (!f["prepend_scheme"].is_null()) {
      LINATTN_ASSIGN_OR_RETURN(std::string s, f["prepend_scheme"].String());
      if (s != "always" && s != "first" && s != "never") {
        return f["prepend_scheme"].Unsupported(s);
      }
      prepends = s != "never";
    }
    if (!f["add_prefix_space"].is_null()) {
      LINATTN_ASSIGN_OR_RETURN(bool add, f["add_prefix_space"].Bool(true));
      if (!add) prepends = false;
    }
    return std::make_unique<MetaspaceDecoder>(std::move(replacement), prepends);
  }
  if (type == "Strip") {
    LINATTN_ASSIGN_OR_RETURN(std::string content, f["content"].Char());
    LINATTN_ASSIGN_OR_RETURN(int64_t start,
                             f["start"].Int(std::nullopt, 0, 1 << 20));
    LINATTN_ASSIGN_OR_RETURN(int64_t stop,
                             f["stop"].Int(std::nullopt, 0, 1 << 20));
    size_t len;
    return std::make_unique<StripDecoder>(CodePointAt(content, 0, &len),
                                          static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  if (type == "Replace") {
    LINATTN_ASSIGN_OR_RETURN(auto re, LoadPattern(f["pattern"]));
    LINATTN_ASSIGN_OR_RETURN(std::string content, f["content"].String());
    return std::make_unique<ReplaceDecoder>(std::move(re), std::move(content));
  }
  if (type == "Sequence") {
    const JsonField list = f["decoders"];
    LINATTN_ASSIGN_OR_RETURN(size_t n, list.ArraySize());
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < n; ++i) {
      LINATTN_ASSIGN_OR_RETURN(auto step, LoadDecoder(list.at(i)));
      if (step == nullptr) return list.at(i).Error("must be a decoder");
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  return f["type"].Unsupported(type);
}

}  // namespace linattn::tokenizer_json
