#include "runtime/exec/baseline_count.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace choreo::exec {

namespace {

/// Every token sequence seen so far, as a trie: the longest prefix of a new sequence that some earlier one
/// shares is the depth at which the walk leaves the trie.
class PrefixTrie {
 public:
  /// The length of the longest prefix of `tokens` shared with an inserted sequence.
  size_t longest_prefix(const std::vector<model::Token>& tokens) const {
    const Node* node = &root_;
    size_t depth = 0;
    for (model::Token t : tokens) {
      auto it = node->children.find(t);
      if (it == node->children.end()) break;
      node = it->second.get();
      ++depth;
    }
    return depth;
  }

  void insert(const std::vector<model::Token>& tokens) {
    Node* node = &root_;
    for (model::Token t : tokens) {
      std::unique_ptr<Node>& child = node->children[t];
      if (!child) child = std::make_unique<Node>();
      node = child.get();
    }
  }

 private:
  struct Node {
    std::unordered_map<model::Token, std::unique_ptr<Node>> children;
  };
  Node root_;
};

}  // namespace

BaselineCount prefix_baseline(const RunResult& result, int32_t bos) {
  BaselineCount out;
  // One cache per model: a server never reuses one model's prefix for another (MessageRecord::model).
  std::map<std::string, PrefixTrie> tries;
  // A name may be bound again later (a `repeat` without an index): parents mean the latest one so far.
  std::unordered_map<std::string, const MessageRecord*> latest;
  // The decodes of one engine batch (same submission time) are concurrent requests: each reuses only what
  // earlier batches left in the cache, as on a server that batches them.
  std::vector<std::pair<std::string, std::vector<model::Token>>> batch;  // (model, sequence)
  double batch_start = -1;
  auto flush = [&] {
    for (const auto& [model, sequence] : batch) tries[model].insert(sequence);
    batch.clear();
  };
  for (const MessageRecord& m : result.messages) {
    if (m.kind == "decode") {
      if (m.start_ms != batch_start) flush();
      batch_start = m.start_ms;
      std::vector<model::Token> sequence;
      if (bos >= 0) sequence.push_back(bos);
      for (const std::string& parent : m.parents) {
        auto it = latest.find(parent);
        if (it != latest.end()) sequence.insert(sequence.end(), it->second->tokens.begin(), it->second->tokens.end());
      }
      const size_t own = m.tokens.size() - size_t(m.n_generated);
      sequence.insert(sequence.end(), m.tokens.begin(), m.tokens.begin() + long(own));
      const size_t reused = tries[m.model].longest_prefix(sequence);
      ++out.calls;
      out.reused += int64_t(reused);
      out.computed += int64_t(sequence.size() - reused);
      out.computed += std::max(m.n_generated - 1, 0);  // every generated token but the last is fed back
      // The cache holds what was computed: the prompt and every generated token but the last.
      if (m.n_generated > 1) sequence.insert(sequence.end(), m.tokens.begin() + long(own), m.tokens.end() - 1);
      batch.emplace_back(m.model, std::move(sequence));
    }
    latest[m.name] = &m;
  }
  flush();
  return out;
}

}  // namespace choreo::exec
