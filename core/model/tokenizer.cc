#include "core/model/tokenizer.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/model/sentencepiece_shim.h"

namespace linattn {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  uint32_t size() const override { return 256; }
  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      ids[i] = static_cast<uint8_t>(text[i]);
    }
    return ids;
  }
  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || id > 255) return "";
    return std::string(1, static_cast<char>(id));
  }
};

// liblinattn_sentencepiece.so, loaded once (see sentencepiece_shim.h).
struct SentencePieceModule {
  decltype(&linattn_spm_load) load = nullptr;
  decltype(&linattn_spm_free) free = nullptr;
  decltype(&linattn_spm_size) size = nullptr;
  decltype(&linattn_spm_encode) encode = nullptr;
  decltype(&linattn_spm_piece) piece = nullptr;
  decltype(&linattn_spm_decode) decode = nullptr;
};

bool ProtobufLoaded() {
  bool found = false;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name != nullptr &&
            std::strstr(info->dlpi_name, "libprotobuf") != nullptr) {
          *static_cast<bool*>(data) = true;
        }
        return 0;
      },
      &found);
  return found;
}

absl::StatusOr<const SentencePieceModule*> LoadModule() {
  static const absl::StatusOr<SentencePieceModule> module =
      []() -> absl::StatusOr<SentencePieceModule> {
    const char* kName = "liblinattn_sentencepiece.so";
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("LINATTN_SENTENCEPIECE_MODULE")) {
      candidates.push_back(env);
    }
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
      std::string dir(self, n);
      dir.resize(dir.rfind('/') + 1);
      candidates.push_back(dir + kName);
      candidates.push_back(dir + "../lib/linattn/" + kName);
    }
    // RTLD_DEEPBIND keeps libsentencepiece's protobuf apart from the
    // process's; it is only needed (and only used) when libprotobuf is
    // already loaded, since sanitizer runtimes refuse it.
    const int flags =
        RTLD_NOW | RTLD_LOCAL | (ProtobufLoaded() ? RTLD_DEEPBIND : 0);
    std::string tried;
    for (const std::string& path : candidates) {
      void* handle = dlopen(path.c_str(), flags);
      if (handle == nullptr) {
        absl::StrAppend(&tried, "\n  ", path, ": ", dlerror());
        continue;
      }
      SentencePieceModule m;
      m.load =
          reinterpret_cast<decltype(m.load)>(dlsym(handle, "linattn_spm_load"));
      m.free =
          reinterpret_cast<decltype(m.free)>(dlsym(handle, "linattn_spm_free"));
      m.size =
          reinterpret_cast<decltype(m.size)>(dlsym(handle, "linattn_spm_size"));
      m.encode = reinterpret_cast<decltype(m.encode)>(
          dlsym(handle, "linattn_spm_encode"));
      m.piece = reinterpret_cast<decltype(m.piece)>(
          dlsym(handle, "linattn_spm_piece"));
      m.decode = reinterpret_cast<decltype(m.decode)>(
          dlsym(handle, "linattn_spm_decode"));
      if (!m.load || !m.free || !m.size || !m.encode || !m.piece || !m.decode) {
        absl::StrAppend(&tried, "\n  ", path, ": missing symbols");
        continue;
      }
      return m;  // never unloaded
    }
    return absl::FailedPreconditionError(
        absl::StrCat("tokenizer.model: the SentencePiece module ", kName,
                     " cannot be loaded:", tried));
  }();
  if (!module.ok()) return module.status();
  return &*module;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const SentencePieceModule* module, void* processor)
      : module_(module), processor_(processor) {
    const int n = module_->size(processor_);
    pieces_.reserve(n);
    std::string buffer(64, '\0');
    for (int id = 0; id < n; ++id) {
      size_t len = module_->piece(processor_, id, buffer.data(), buffer.size());
      if (len > buffer.size()) {
        buffer.resize(len);
        module_->piece(processor_, id, buffer.data(), buffer.size());
      }
      pieces_.emplace_back(buffer.data(), len);
    }
  }
  ~SentencePieceTokenizer() override { module_->free(processor_); }

  std::string kind() const override { return "sentencepiece"; }
  uint32_t size() const override {
    return static_cast<uint32_t>(pieces_.size());
  }
  absl::StatusOr<std::vector<int32_t>> Encode(
      absl::string_view text) const override {
    std::vector<int> ids(text.size() + 16);
    char error[512] = {0};
    for (;;) {
      long n = module_->encode(processor_, text.data(), text.size(), ids.data(),
                               ids.size(), error, sizeof(error));
      if (n < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("text: the tokenizer refused it: ", error));
      }
      if (static_cast<size_t>(n) <= ids.size()) {
        return std::vector<int32_t>(ids.begin(), ids.begin() + n);
      }
      ids.resize(n);
    }
  }
  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return "";
    return pieces_[id];
  }
  std::string Decode(std::span<const int32_t> ids) const override {
    std::vector<int> known;
    known.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && static_cast<size_t>(id) < pieces_.size()) {
        known.push_back(id);
      }
    }
    std::string text(64, '\0');
    char error[512] = {0};
    for (;;) {
      long n = module_->decode(processor_, known.data(), known.size(),
                               text.data(), text.size(), error, sizeof(error));
      if (n < 0) return Pieces(ids);
      if (static_cast<size_t>(n) <= text.size()) {
        text.resize(n);
        return text;
      }
      text.resize(n);
    }
  }

 private:
  const SentencePieceModule* module_;
  void* processor_;
  std::vector<std::string> pieces_;
};

}  // namespace

std::string Tokenizer::Pieces(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) out += TokenBytes(id);
  return out;
}

std::unique_ptr<Tokenizer> NewByteTokenizer() {
  return std::make_unique<ByteTokenizer>();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& path) {
  if (!std::ifstream(path).good()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  }
  auto module = LoadModule();
  if (!module.ok()) return module.status();
  char error[512] = {0};
  void* processor = (*module)->load(path.c_str(), error, sizeof(error));
  if (processor == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model: ", error));
  }
  return std::make_unique<SentencePieceTokenizer>(*module, processor);
}

}  // namespace linattn
