#include "core/model/tokenizer_json/normalizers.h"

#include <algorithm>
#include <vector>

#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"

namespace linattn::tokenizer_json {
namespace {

class FormNormalizer final : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  absl::Status Apply(Piece* p) const override {
    if (p->origin_bytes > 0) {
      p->origin_bytes =
          Normalize(absl::string_view(p->text).substr(0, p->origin_bytes),
                    form_)
              .size();
    }
    p->text = Normalize(p->text, form_);
    p->origin_bytes = std::min(p->origin_bytes, p->text.size());
    return absl::OkStatus();
  }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  absl::Status Apply(Piece* p) const override {
    if (p->origin_bytes > 0) {
      p->origin_bytes =
          Lowercase(absl::string_view(p->text).substr(0, p->origin_bytes))
              .size();
    }
    p->text = Lowercase(p->text);
    return absl::OkStatus();
  }
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  absl::Status Apply(Piece* p) const override {
    std::string out;
    size_t origin = 0;
    for (size_t i = 0; i < p->text.size();) {
      size_t len;
      const char32_t c = CodePointAt(p->text, i, &len);
      if (!IsMark(c)) out.append(p->text, i, len);
      i += len;
      if (i <= p->origin_bytes) origin = out.size();
    }
    p->text = std::move(out);
    p->origin_bytes = origin;
    return absl::OkStatus();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  absl::Status Apply(Piece* p) const override {
    const std::string& t = p->text;
    size_t begin = 0, end = t.size();
    if (left_) {
      while (begin < end) {
        size_t len;
        if (!IsWhiteSpace(CodePointAt(t, begin, &len))) break;
        begin += len;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin &&
               (static_cast<unsigned char>(t[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t len;
        if (!IsWhiteSpace(CodePointAt(t, start, &len))) break;
        end = start;
      }
    }
    p->origin_bytes = p->origin_bytes > begin ? p->origin_bytes - begin : 0;
    p->text = t.substr(begin, end - begin);
    p->origin_bytes = std::min(p->origin_bytes, p->text.size());
    return absl::OkStatus();
  }

 private:
  bool left_, right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  absl::Status Apply(Piece* p) const override {
    if (p->text.empty()) return absl::OkStatus();  // prepend.rs
    p->text.insert(0, prefix_);
    if (p->origin_bytes > 0) p->origin_bytes += prefix_.size();
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::shared_ptr<const OnigRegex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  absl::Status Apply(Piece* p) const override {
    std::vector<Span> matches;
    LINATTN_RETURN_IF_ERROR(re_->FindAll(p->text, &matches));
    if (matches.empty()) return absl::OkStatus();
    std::string out;
    out.reserve(p->text.size());
    size_t last = 0;
    for (const Span& m : matches) {
      out.append(p->text, last, m.first - last);
      out += content_;
      last = m.second;
    }
    out.append(p->text, last, std::string::npos);
    // The replacement of a match at the start aligns to the start.
    if (p->origin_bytes > 0 && matches.front().first == 0) {
      const size_t m = matches.front().second;
      p->origin_bytes =
          content_.size() + (p->origin_bytes > m ? p->origin_bytes - m : 0);
    }
    p->text = std::move(out);
    p->origin_bytes = std::min(p->origin_bytes, p->text.size());
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const OnigRegex> re_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  absl::Status Apply(Piece* p) const override {
    for (const auto& step : steps_) {
      LINATTN_RETURN_IF_ERROR(step->Apply(p));
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> LoadNormalizer(const JsonField& f) {
  if (f.is_null()) return nullptr;
  LINATTN_RETURN_IF_ERROR(f.ExpectObject());
  LINATTN_ASSIGN_OR_RETURN(const std::string type, f.Type());
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::kNfd);
  if (type == "NFKC")
    return std::make_unique<FormNormalizer>(NormalForm::kNfkc);
  if (type == "NFKD")
    return std::make_unique<FormNormalizer>(NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    LINATTN_ASSIGN_OR_RETURN(bool left, f["strip_left"].Bool(false));
    LINATTN_ASSIGN_OR_RETURN(bool right, f["strip_right"].Bool(false));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "Prepend") {
    LINATTN_ASSIGN_OR_RETURN(std::string prefix, f["prepend"].String());
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    LINATTN_ASSIGN_OR_RETURN(auto re, LoadPattern(f["pattern"]));
    LINATTN_ASSIGN_OR_RETURN(std::string content, f["content"].String());
    return std::make_unique<ReplaceNormalizer>(std::move(re),
                                               std::move(content));
  }
  if (type == "Sequence") {
    const JsonField list = f["normalizers"];
    LINATTN_ASSIGN_OR_RETURN(size_t n, list.ArraySize());
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < n; ++i) {
      LINATTN_ASSIGN_OR_RETURN(auto step, LoadNormalizer(list.at(i)));
      if (step == nullptr) return list.at(i).Error("must be a normalizer");
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  return f["type"].Unsupported(type);
}

absl::StatusOr<std::string> NormalizeText(const Normalizer& normalizer,
                                          absl::string_view text) {
  Piece p;
  p.text = std::string(text);
  LINATTN_RETURN_IF_ERROR(normalizer.Apply(&p));
  return std::move(p.text);
}

}  // namespace linattn::tokenizer_json
