#include "core/model/tokenizer_json/json_field.h"

#include "core/model/tokenizer_json/onig_regex.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"

namespace linattn::tokenizer_json {

absl::StatusOr<std::string> JsonField::Char() const {
  LINATTN_ASSIGN_OR_RETURN(std::string s, String());
  size_t len = 0;
  if (!s.empty()) CodePointAt(s, 0, &len);
  if (s.empty() || len != s.size()) return Error("must be one character");
  return s;
}

absl::StatusOr<std::shared_ptr<const OnigRegex>> LoadPattern(
    const JsonField& f) {
  LINATTN_RETURN_IF_ERROR(f.ExpectObject());
  if (f.value().size() != 1) {
    return f.Error("must hold one of \"String\" and \"Regex\"");
  }
  if (f.has("String")) {
    LINATTN_ASSIGN_OR_RETURN(std::string s, f["String"].String());
    return OnigRegex::Literal(s, f["String"].where());
  }
  if (f.has("Regex")) {
    LINATTN_ASSIGN_OR_RETURN(std::string r, f["Regex"].String());
    return OnigRegex::Compile(r, f["Regex"].where());
  }
  return f.Error("must hold one of \"String\" and \"Regex\"");
}

}  // namespace linattn::tokenizer_json
