#include "core/model/tokenizer_json/pieces.h"

#include <algorithm>

namespace linattn::tokenizer_json {

void SplitPiece(const Piece& piece, const Cover& cover, SplitBehavior behavior,
                std::vector<Piece>* out) {
  // (span, removed), as NormalizedString::split computes them.
  std::vector<std::pair<Span, bool>> parts;
  parts.reserve(cover.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& [span, is_match] : cover) parts.push_back({span, false});
      break;
    case SplitBehavior::kRemoved:
      parts = cover;
      break;
    case SplitBehavior::kContiguous:
      for (const auto& [span, is_match] : cover) {
        if (is_match == previous_match && !parts.empty()) {
          parts.back().first.second = span.second;
        } else {
          parts.push_back({span, false});
        }
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& [span, is_match] : cover) {
        if (is_match && !previous_match && !parts.empty()) {
          parts.back().first.second = span.second;
        } else {
          parts.push_back({span, false});
        }
        previous_match = is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = cover.rbegin(); it != cover.rend(); ++it) {
        const auto& [span, is_match] = *it;
        if (is_match && !previous_match && !parts.empty()) {
          parts.back().first.first = span.first;
        } else {
          parts.push_back({span, false});
        }
        previous_match = is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
  }
  for (const auto& [span, removed] : parts) {
    if (removed || span.first == span.second) continue;
    Piece p;
    p.text = piece.text.substr(span.first, span.second - span.first);
    p.at_origin = piece.at_origin && span.first < piece.origin_bytes;
    p.origin_bytes =
        p.at_origin ? std::min(piece.origin_bytes - span.first, p.text.size())
                    : 0;
    out->push_back(std::move(p));
  }
}

}  // namespace linattn::tokenizer_json
