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

}  // namespace linattn

#endif  // LINATTN_SERVER_MODEL_CHECK_H_
