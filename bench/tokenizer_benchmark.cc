// tokenizer.json speed: how long a file takes to load, and how fast text
// encodes on one core, against the targets (load < 1 s for a 200k-entry
// vocabulary with 200k merges; encoding ≥ 5 MB/s). One JSON object per
// line on stdout; bench/tokenizer_bench.sh writes the inputs and runs it.
//
//   tokenizer_benchmark --tokenizer FILE --text FILE [--chunk BYTES]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/string_view.h"
#include "core/model/tokenizer_json/tokenizer_json.h"
#include "nlohmann/json.hpp"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tokenizer_benchmark: tokenizer.json load and encode speed"};
  std::string tokenizer_path, text_path;
  size_t chunk = 4096;
  int loads = 3;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_option("--text", text_path, "UTF-8 text to encode")->required();
  app.add_option("--chunk", chunk,
                 "bytes per Encode call (a prompt's size), cut at line ends")
      ->capture_default_str();
  app.add_option("--loads", loads, "loads timed (the best is reported)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(text_path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  double best_load = 1e9;
  std::unique_ptr<linattn::Tokenizer> t;
  for (int i = 0; i < loads; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto loaded = linattn::LoadTokenizerJson(tokenizer_path);
    const double s = Seconds(start);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n",
                   std::string(loaded.status().message()).c_str());
      return 1;
    }
    best_load = std::min(best_load, s);
    t = std::move(*loaded);  // the last load is the one that encodes: cold
  }
  // Prompts: the text in pieces of about `chunk` bytes, cut after a line.
  size_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.size(), pos + chunk);
    const size_t nl = text.find('\n', end);
    end = nl == std::string::npos ? text.size() : nl + 1;
    auto ids = t->Encode(absl::string_view(text).substr(pos, end - pos));
    if (!ids.ok()) {
      std::fprintf(stderr, "%s\n", std::string(ids.status().message()).c_str());
      return 1;
    }
    tokens += ids->size();
    pos = end;
  }
  const double encode_s = Seconds(start);
  const double mb_per_s = static_cast<double>(text.size()) / 1e6 / encode_s;
  nlohmann::json row = {
      {"tokenizer", tokenizer_path},   {"ids", t->size()},
      {"load_seconds", best_load},     {"load_target_seconds", 1.0},
      {"text_bytes", text.size()},     {"tokens", tokens},
      {"encode_seconds", encode_s},    {"encode_mb_per_s", mb_per_s},
      {"encode_target_mb_per_s", 5.0}, {"encode_vs_target", mb_per_s / 5.0}};
  std::printf("%s\n", row.dump().c_str());
  return 0;
}
