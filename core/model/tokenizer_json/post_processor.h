// tokenizer.json's "post_processor" for one sequence: TemplateProcessing
// (its "single" template and special_tokens' ids), RobertaProcessing and
// BertProcessing (cls, the text, sep), ByteLevel (nothing to ids) and
// Sequence.
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_POST_PROCESSOR_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_POST_PROCESSOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/tokenizer_json/json_field.h"

namespace linattn::tokenizer_json {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // The ids of a text with the special tokens the template adds.
  virtual void Apply(std::vector<int32_t>* ids) const = 0;
  // The largest id it adds, or -1.
  virtual int32_t max_id() const = 0;
};

// nullptr for a null field.
absl::StatusOr<std::unique_ptr<PostProcessor>> LoadPostProcessor(
    const JsonField& field);

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_POST_PROCESSOR_H_
