// A trie over byte strings: which stored strings begin at a position
// (Unigram's lattice, added tokens' leftmost-longest matching).
#ifndef LINATTN_CORE_MODEL_TOKENIZER_JSON_BYTE_TRIE_H_
#define LINATTN_CORE_MODEL_TOKENIZER_JSON_BYTE_TRIE_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace linattn::tokenizer_json {

class ByteTrie {
 public:
  ByteTrie() : nodes_(1) {}
  // Stores `key` with `value` (a later Insert of the same key replaces it).
  void Insert(absl::string_view key, int32_t value) {
    int32_t n = 0;
    for (unsigned char b : key) {
      auto& kids = nodes_[n].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), b,
                                 [](const std::pair<uint8_t, int32_t>& k,
                                    uint8_t v) { return k.first < v; });
      if (it != kids.end() && it->first == b) {
        n = it->second;
        continue;
      }
      const auto child = static_cast<int32_t>(nodes_.size());
      kids.insert(it, {b, child});
      nodes_.emplace_back();
      n = child;
    }
    nodes_[n].value = value;
  }
  // Calls fn(length, value) for every stored key that is a prefix of
  // text.substr(from), shortest first.
  template <typename Fn>
  void Prefixes(absl::string_view text, size_t from, Fn fn) const {
    int32_t n = 0;
    for (size_t i = from; i < text.size(); ++i) {
      n = Child(n, static_cast<uint8_t>(text[i]));
      if (n < 0) return;
      if (nodes_[n].value >= 0) fn(i + 1 - from, nodes_[n].value);
    }
  }
  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    int32_t value = -1;
    std::vector<std::pair<uint8_t, int32_t>> children;
  };
  int32_t Child(int32_t n, uint8_t b) const {
    const auto& kids = nodes_[n].children;
    if (kids.size() < 8) {
      for (const auto& k : kids) {
        if (k.first == b) return k.second;
      }
      return -1;
    }
    auto it = std::lower_bound(kids.begin(), kids.end(), b,
                               [](const std::pair<uint8_t, int32_t>& k,
                                  uint8_t v) { return k.first < v; });
    return it != kids.end() && it->first == b ? it->second : -1;
  }
  std::vector<Node> nodes_;
};

}  // namespace linattn::tokenizer_json

#endif  // LINATTN_CORE_MODEL_TOKENIZER_JSON_BYTE_TRIE_H_
