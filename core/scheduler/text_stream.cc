#include "core/scheduler/text_stream.h"

#include <algorithm>

namespace linattn {

TextStream::Piece TextStream::Next(absl::string_view bytes, bool last) {
  held_ += utf8_.Push(bytes);
  if (last) held_ += utf8_.Flush();
  Piece piece;
  // The earliest occurrence of any stop string ends the text before it.
  size_t stop_at = std::string::npos;
  for (const std::string& stop : stops_) {
    stop_at = std::min(stop_at, held_.find(stop));
  }
  if (stop_at != std::string::npos) {
    piece.stopped = true;
    piece.text = held_.substr(0, stop_at);
    held_.clear();
    return piece;
  }
  if (last) {
    piece.text = std::move(held_);
    held_.clear();
    return piece;
  }
  // All but the longest tail that is a proper prefix of a stop string.
  size_t keep = held_.size();
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > 0; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = std::min(keep, held_.size() - n);
        break;
      }
    }
  }
  piece.text = held_.substr(0, keep);
  held_.erase(0, keep);
  return piece;
}

}  // namespace linattn
