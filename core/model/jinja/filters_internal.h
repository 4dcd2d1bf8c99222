// The filters' shared pieces (filters.cc, filters_sequence.cc): the
// argument list a filter receives (bound to its parameter names, absent
// ones undefined) and the helpers both files use.
#ifndef LINATTN_CORE_MODEL_JINJA_FILTERS_INTERNAL_H_
#define LINATTN_CORE_MODEL_JINJA_FILTERS_INTERNAL_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/jinja/value.h"

namespace linattn::jinja::filters {

using Args = std::vector<Value>;

absl::Status TypeError(absl::string_view what, const Value& v);
// `v`, or `fallback` when it is undefined.
Value Or(const Value& v, Value fallback);
// Jinja's make_attrgetter: "a.b.0" walks attributes and indices.
absl::StatusOr<Value> AttrPath(const Value& v, const Value& path);
// What a filter walks: Iterate, with undefined as empty.
absl::StatusOr<std::vector<Value>> Items(const Value& v);

// The filters over sequences (filters_sequence.cc).
absl::StatusOr<Value> Join(const Value& v, const Args& a);
absl::StatusOr<Value> First(const Value& v, const Args& a);
absl::StatusOr<Value> Last(const Value& v, const Args& a);
absl::StatusOr<Value> ListFilter(const Value& v, const Args& a);
absl::StatusOr<Value> Reverse(const Value& v, const Args& a);
absl::StatusOr<Value> ItemsFilter(const Value& v, const Args& a);
absl::StatusOr<Value> DictSort(const Value& v, const Args& a);
absl::StatusOr<Value> Sort(const Value& v, const Args& a);
absl::StatusOr<Value> Unique(const Value& v, const Args& a);
absl::StatusOr<Value> Select(const Value& v, const Args& a);
absl::StatusOr<Value> Reject(const Value& v, const Args& a);
absl::StatusOr<Value> SelectAttr(const Value& v, const Args& a);
absl::StatusOr<Value> RejectAttr(const Value& v, const Args& a);
absl::StatusOr<Value> Sum(const Value& v, const Args& a);
absl::StatusOr<Value> Min(const Value& v, const Args& a);
absl::StatusOr<Value> Max(const Value& v, const Args& a);
absl::StatusOr<Value> Map(const Value& v, const Args& a);

}  // namespace linattn::jinja::filters

#endif  // LINATTN_CORE_MODEL_JINJA_FILTERS_INTERNAL_H_
