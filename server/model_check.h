// linattn-server --check: loads the models of --model as the server would
// and prints what each directory holds (architecture, weights, tokenizer,
// chat template), then exits — 0 when every model can be served with its
// chat endpoints, 1 when one cannot (the reason printed).
#ifndef LINATTN_SERVER_MODEL_CHECK_H_
#define LINATTN_SERVER_MODEL_CHECK_H_

#include <cstdio>

#include "absl/status/status.h"
#include "core/model/model.h"
#include "server/server.h"

namespace linattn {

// The report on `out`; the exit status.
int CheckModels(const ServerOptions& options, std::FILE* out);

// What a model that loads still needs before the server serves it:
// FAILED_PRECONDITION for a hybrid (softmax-attention layers), whose keys
// and values the sessions' memory budget does not count yet as they grow.
absl::Status ServedModelSupported(const Model& model);

}  // namespace linattn

#endif  // LINATTN_SERVER_MODEL_CHECK_H_
