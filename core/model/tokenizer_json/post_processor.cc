#include "core/model/tokenizer_json/post_processor.h"

#include <algorithm>
#include <string>

#include "core/model/tokenizer_json/token_model.h"
#include "core/util/status_macros.h"

namespace linattn::tokenizer_json {
namespace {

// A template: runs of special ids around the text ("A").
class TemplateProcessor final : public PostProcessor {
 public:
  // `before` + text + `after`.
  TemplateProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void Apply(std::vector<int32_t>* ids) const override {
    ids->insert(ids->begin(), before_.begin(), before_.end());
    ids->insert(ids->end(), after_.begin(), after_.end());
  }
  int32_t max_id() const override {
    int32_t m = -1;
    for (int32_t id : before_) m = std::max(m, id);
    for (int32_t id : after_) m = std::max(m, id);
    return m;
  }

 private:
  std::vector<int32_t> before_, after_;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> s)
      : steps_(std::move(s)) {}
  void Apply(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->Apply(ids);
  }
  int32_t max_id() const override {
    int32_t m = -1;
    for (const auto& step : steps_) m = std::max(m, step->max_id());
    return m;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// ["token", id] as Roberta and Bert processing state cls and sep.
absl::StatusOr<int32_t> TokenPairId(const JsonField& f) {
  if (!f.value().is_array() || f.value().size() != 2 ||
      !f.value()[0].is_string()) {
    return f.Error("must be [token, id]");
  }
  LINATTN_ASSIGN_OR_RETURN(int64_t id,
                           f.at(1).Int(std::nullopt, 0, kMaxVocabulary - 1));
  return static_cast<int32_t>(id);
}

absl::StatusOr<std::unique_ptr<PostProcessor>> LoadTemplate(
    const JsonField& f) {
  const JsonField single = f["single"];
  LINATTN_ASSIGN_OR_RETURN(size_t n, single.ArraySize());
  const JsonField specials = f["special_tokens"];
  std::vector<int32_t> before, after;
  bool seen_text = false;
  for (size_t i = 0; i < n; ++i) {
    const JsonField item = single.at(i);
    LINATTN_RETURN_IF_ERROR(item.ExpectObject());
    if (item.has("Sequence")) {
      LINATTN_ASSIGN_OR_RETURN(std::string which,
                               item["Sequence"]["id"].String());
      if (which != "A") {
        return item["Sequence"]["id"].Error(
            "the single-sequence template can only hold \"A\"");
      }
      if (seen_text) return item.Error("the text appears twice");
      seen_text = true;
      continue;
    }
    if (!item.has("SpecialToken")) {
      return item.Error("must hold \"Sequence\" or \"SpecialToken\"");
    }
    LINATTN_ASSIGN_OR_RETURN(std::string name,
                             item["SpecialToken"]["id"].String());
    const JsonField special = specials[name.c_str()];
    if (special.is_null()) {
      return item["SpecialToken"]["id"].Error(
          "'" + name + "' is not in post_processor.special_tokens");
    }
    const JsonField ids = special["ids"];
    LINATTN_ASSIGN_OR_RETURN(size_t count, ids.ArraySize());
    for (size_t k = 0; k < count; ++k) {
      LINATTN_ASSIGN_OR_RETURN(
          int64_t id, ids.at(k).Int(std::nullopt, 0, kMaxVocabulary - 1));
      (seen_text ? after : before).push_back(static_cast<int32_t>(id));
    }
  }
  if (!seen_text) return single.Error("has no \"A\" sequence");
  return std::make_unique<TemplateProcessor>(std::move(before),
                                             std::move(after));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> LoadPostProcessor(
    const JsonField& f) {
  if (f.is_null()) return nullptr;
  LINATTN_RETURN_IF_ERROR(f.ExpectObject());
  LINATTN_ASSIGN_OR_RETURN(const std::string type, f.Type());
  if (type == "TemplateProcessing") return LoadTemplate(f);
  if (type == "ByteLevel") {
    return std::make_unique<TemplateProcessor>(std::vector<int32_t>{},
                                               std::vector<int32_t>{});
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    LINATTN_ASSIGN_OR_RETURN(int32_t cls, TokenPairId(f["cls"]));
    LINATTN_ASSIGN_OR_RETURN(int32_t sep, TokenPairId(f["sep"]));
    return std::make_unique<TemplateProcessor>(std::vector<int32_t>{cls},
                                               std::vector<int32_t>{sep});
  }
  if (type == "Sequence") {
    const JsonField list = f["processors"];
    LINATTN_ASSIGN_OR_RETURN(size_t n, list.ArraySize());
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < n; ++i) {
      LINATTN_ASSIGN_OR_RETURN(auto step, LoadPostProcessor(list.at(i)));
      if (step == nullptr) return list.at(i).Error("must be a post-processor");
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  return f["type"].Unsupported(type);
}

}  // namespace linattn::tokenizer_json
