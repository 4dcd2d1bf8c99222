// liblinattn_sentencepiece.so: see sentencepiece_shim.h. No Abseil here.
#include "core/model/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

void SetError(const std::string& what, char* error, size_t size) {
  if (size == 0) return;
  std::snprintf(error, size, "%s", what.c_str());
}

std::string PieceBytes(const sentencepiece::SentencePieceProcessor& sp,
                       int id) {
  if (id < 0 || id >= sp.GetPieceSize() || sp.IsControl(id)) return "";
  const std::string& piece = sp.IdToPiece(id);
  if (sp.IsByte(id)) {
    unsigned value = 0;
    if (std::sscanf(piece.c_str(), "<0x%02X>", &value) == 1) {
      return std::string(1, static_cast<char>(value));
    }
    return "";
  }
  if (sp.IsUnknown(id)) return " \xE2\x81\x87 ";  // " ⁇ ", as sentencepiece
  static const std::string kSpace = "\xE2\x96\x81";  // ▁
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      out.push_back(' ');
      i += kSpace.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

}  // namespace

extern "C" {

void* linattn_spm_load(const char* path, char* error, size_t error_size) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto status = sp->Load(path);
  if (!status.ok()) {
    SetError(status.ToString(), error, error_size);
    delete sp;
    return nullptr;
  }
  return sp;
}

void linattn_spm_free(void* processor) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(processor);
}

int linattn_spm_size(void* processor) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(processor)
      ->GetPieceSize();
}

long linattn_spm_encode(void* processor, const char* text, size_t length,
                        int* ids, size_t capacity, char* error,
                        size_t error_size) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(processor);
  std::vector<int> out;
  const auto status = sp->Encode(std::string_view(text, length), &out);
  if (!status.ok()) {
    SetError(status.ToString(), error, error_size);
    return -1;
  }
  // (memcpy's pointers must be valid even for no bytes: an empty text
  // encodes to nothing, and its caller may pass no buffer.)
  if (!out.empty() && out.size() <= capacity) {
    std::memcpy(ids, out.data(), out.size() * sizeof(int));
  }
  return static_cast<long>(out.size());
}

size_t linattn_spm_piece(void* processor, int id, char* out, size_t capacity) {
  const std::string bytes = PieceBytes(
      *static_cast<sentencepiece::SentencePieceProcessor*>(processor), id);
  if (!bytes.empty() && bytes.size() <= capacity) {
    std::memcpy(out, bytes.data(), bytes.size());
  }
  return bytes.size();
}

long linattn_spm_decode(void* processor, const int* ids, size_t count,
                        char* out, size_t capacity, char* error,
                        size_t error_size) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(processor);
  std::string text;
  const auto status = sp->Decode(std::vector<int>(ids, ids + count), &text);
  if (!status.ok()) {
    SetError(status.ToString(), error, error_size);
    return -1;
  }
  if (!text.empty() && text.size() <= capacity) {
    std::memcpy(out, text.data(), text.size());
  }
  return static_cast<long>(text.size());
}

}  // extern "C"
