// TextStream: the text of one Generate, token by token.
//
// Token bytes go in; what comes out is complete UTF-8 (a character split
// across tokens waits for its last byte, ill-formed bytes become U+FFFD)
// with stop strings applied: the text ends before the earliest occurrence
// of any of them, and a tail that could still grow into one is held back
// until it either does or cannot. The last piece (Next with last = true)
// releases everything held.
//
// Not thread-safe; one per request.
#ifndef LINATTN_CORE_SCHEDULER_TEXT_STREAM_H_
#define LINATTN_CORE_SCHEDULER_TEXT_STREAM_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/util/utf8.h"

namespace linattn {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops = {})
      : stops_(std::move(stops)) {}

  struct Piece {
    std::string text;      // what may be sent now
    bool stopped = false;  // a stop string appeared; `text` ends before it
  };
  // The text after one more token's bytes; `last` when the token ends the
  // generation (its bytes may be empty, as an end-of-sequence token's).
  Piece Next(absl::string_view bytes, bool last);

 private:
  const std::vector<std::string> stops_;
  Utf8Stream utf8_;
  std::string held_;  // complete text not yet sent
};

}  // namespace linattn

#endif  // LINATTN_CORE_SCHEDULER_TEXT_STREAM_H_
