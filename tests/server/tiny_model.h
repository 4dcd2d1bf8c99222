// The repository's tiny model (models/tiny), loaded once, for tests that
// need a model's tokenizer, name and fingerprint but run no session.
#ifndef LINATTN_TESTS_SERVER_TINY_MODEL_H_
#define LINATTN_TESTS_SERVER_TINY_MODEL_H_

#include <memory>

#include "core/model/model.h"

namespace linattn {

inline std::shared_ptr<const Model> TinyModel() {
  static auto model = Model::Load(LINATTN_SOURCE_DIR "/models/tiny").value();
  return model;
}

}  // namespace linattn

#endif  // LINATTN_TESTS_SERVER_TINY_MODEL_H_
