// The built-in model (models/tiny), loaded once per test program. Programs
// that include this define LINATTN_BUILTIN_MODEL_DIR (tests/CMakeLists.txt).
#ifndef LINATTN_TESTS_SCHEDULER_BUILTIN_MODEL_H_
#define LINATTN_TESTS_SCHEDULER_BUILTIN_MODEL_H_

#include <memory>

#include "core/model/model.h"

namespace linattn::testing {

inline std::shared_ptr<const Model> Builtin() {
  static std::shared_ptr<const Model> model =
      Model::Load(LINATTN_BUILTIN_MODEL_DIR).value();
  return model;
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_SCHEDULER_BUILTIN_MODEL_H_
