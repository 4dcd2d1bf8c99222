#include "core/model/tokenizer_json/tokenizer_json.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/model/tokenizer_json/added_tokens.h"
#include "core/model/tokenizer_json/decoders.h"
#include "core/model/tokenizer_json/json_field.h"
#include "core/model/tokenizer_json/normalizers.h"
#include "core/model/tokenizer_json/post_processor.h"
#include "core/model/tokenizer_json/pre_tokenizers.h"
#include "core/model/tokenizer_json/token_model.h"
#include "core/model/tokenizer_json/unicode_chars.h"
#include "core/util/status_macros.h"
#include "core/util/utf8.h"

namespace linattn {
namespace {

using namespace tokenizer_json;  // NOLINT: this file assembles its parts

class JsonTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "tokenizer.json"; }
  uint32_t size() const override { return static_cast<uint32_t>(limit_); }
  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const override {
    return Run(text, false);
  }
  absl::StatusOr<std::vector<int32_t>> EncodeStart(
      absl::string_view text) const override {
    return Run(text, true);
  }
  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || id >= limit_) return "";
    return pieces_[id];
  }
  std::string Decode(std::span<const int32_t> ids) const override;

  absl::Status Load(const JsonField& root);

 private:
  absl::StatusOr<std::vector<int32_t>> Run(absl::string_view text,
                                           bool add_special) const;
  // The token string `tokenizers` decodes for id (special tokens and ids
  // it does not know: none).
  const std::string* DecodedToken(int32_t id) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<TokenModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  AddedTokens added_;
  int32_t limit_ = 0;
  std::vector<std::string> pieces_;  // TokenBytes of every id
};

absl::Status JsonTokenizer::Load(const JsonField& root) {
  LINATTN_RETURN_IF_ERROR(root.ExpectObject());
  // `truncation` and `padding` are what a batch encoder does by default;
  // transformers overrides them on every call, and so does linattn: a
  // prompt is never cut or padded.
  LINATTN_ASSIGN_OR_RETURN(normalizer_, LoadNormalizer(root["normalizer"]));
  LINATTN_ASSIGN_OR_RETURN(pre_tokenizer_,
                           LoadPreTokenizer(root["pre_tokenizer"]));
  if (root["model"].is_null()) return root["model"].Error("is required");
  LINATTN_ASSIGN_OR_RETURN(model_, LoadTokenModel(root["model"]));
  LINATTN_ASSIGN_OR_RETURN(post_processor_,
                           LoadPostProcessor(root["post_processor"]));
  LINATTN_ASSIGN_OR_RETURN(decoder_, LoadDecoder(root["decoder"]));
  LINATTN_RETURN_IF_ERROR(
      added_.Load(root["added_tokens"], *model_, normalizer_.get()));

  limit_ = std::max(model_->id_limit(), added_.id_limit());
  if (post_processor_ != nullptr) {
    limit_ = std::max(limit_, post_processor_->max_id() + 1);
  }
  pieces_.resize(limit_);
  std::vector<std::string> one(1);
  for (int32_t id = 0; id < limit_; ++id) {
    const std::string* token = DecodedToken(id);
    if (token == nullptr) continue;
    if (decoder_ == nullptr) {
      // Without a decoder `tokenizers` joins tokens with spaces.
      pieces_[id] = absl::StrCat(" ", *token);
      continue;
    }
    one.assign(1, *token);
    decoder_->Chain(&one, DecodeMode::kPiece);
    for (const std::string& part : one) pieces_[id] += part;
  }
  return absl::OkStatus();
}

const std::string* JsonTokenizer::DecodedToken(int32_t id) const {
  if (const AddedToken* t = added_.Find(id)) {
    if (t->special) return nullptr;
    return &t->normalized_content;  // simple_id_to_token
  }
  return model_->IdToToken(id);
}

absl::StatusOr<std::vector<int32_t>> JsonTokenizer::Run(
    absl::string_view text, bool add_special) const {
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError("text: not valid UTF-8");
  }
  std::vector<Piece> pieces;
  if (!text.empty()) {
    Piece whole;
    whole.text = std::string(text);
    whole.at_origin = true;
    whole.origin_bytes = Utf8Length(static_cast<unsigned char>(text[0]));
    pieces.push_back(std::move(whole));
  }
  added_.SplitRaw(&pieces);
  if (normalizer_ != nullptr) {
    for (Piece& p : pieces) {
      if (p.token < 0) LINATTN_RETURN_IF_ERROR(normalizer_->Apply(&p));
    }
  }
  added_.SplitNormalized(&pieces);
  if (pre_tokenizer_ != nullptr) {
    LINATTN_RETURN_IF_ERROR(pre_tokenizer_->Apply(&pieces));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Piece& p : pieces) {
    if (p.token >= 0) {
      ids.push_back(p.token);
    } else {
      LINATTN_RETURN_IF_ERROR(model_->Tokenize(p.text, &ids));
    }
  }
  if (add_special && post_processor_ != nullptr) post_processor_->Apply(&ids);
  return ids;
}

std::string JsonTokenizer::Decode(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const std::string* t = DecodedToken(id)) tokens.push_back(*t);
  }
  std::string text;
  if (decoder_ == nullptr) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
    return text;
  }
  decoder_->Chain(&tokens, DecodeMode::kText);
  for (const std::string& t : tokens) text += t;
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseTokenizerJson(
    absl::string_view text, const std::string& file) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": not valid JSON (", e.what(), ")"));
  }
  auto tokenizer = std::make_unique<JsonTokenizer>();
  LINATTN_RETURN_IF_ERROR(tokenizer->Load(JsonField(root, "", file)));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerJson(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  struct stat st;
  if (stat(path.c_str(), &st) == 0 &&
      static_cast<uint64_t>(st.st_size) > kMaxTokenizerJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", st.st_size, " bytes, more than the ",
                     kMaxTokenizerJsonBytes, " a tokenizer.json may have"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseTokenizerJson(buffer.str(), path);
}

}  // namespace linattn
