// `linattn generate`: stream a model's continuation of a prompt from a
// server's GenerationService to a terminal, piece by piece as it arrives.
#ifndef LINATTN_CLIENTS_CLI_GENERATE_H_
#define LINATTN_CLIENTS_CLI_GENERATE_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "clients/common/connection.h"

namespace linattn {

struct GenerateOptions {
  std::string server;
  std::string prompt;
  std::string model;       // empty = the server's first model
  std::string session_id;  // continue this session instead of a new one
  bool keep = false;       // keep the new session (its id goes to `info`)
  uint32_t max_tokens = 64;
  // Sampling defaults: llama.cpp's long-standing ones (temperature 0.8,
  // top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.1 over the last 64
  // tokens), under which the built-in model writes readable verse
  // (docs/models.md, "The built-in model"); a fixed seed, so the same prompt
  // gives the same text. --temperature 0 --repeat-penalty 1 is plain greedy.
  float temperature = 0.8f;
  uint32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repeat_penalty = 1.1f;
  int32_t repeat_last_n = 64;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool usage = false;  // print token counts and speed to `info` at the end
  ConnectionOptions connection;  // how to reach `server`
};

// Writes the prompt's continuation to `out` as it streams (flushed per
// piece), then a newline. Errors carry the server's code and message.
absl::Status Generate(const GenerateOptions& options, std::ostream& out,
                      std::ostream& info);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_CLI_GENERATE_H_
