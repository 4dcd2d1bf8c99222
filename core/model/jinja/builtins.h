// What templates call by name: Jinja's filters and tests, the methods of
// Python's str, dict and list that templates use, the globals Hugging Face
// provides (range, dict, namespace, raise_exception, strftime_now), and
// attribute and item lookup as Jinja's sandbox does them.
#ifndef LINATTN_CORE_MODEL_JINJA_BUILTINS_H_
#define LINATTN_CORE_MODEL_JINJA_BUILTINS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/jinja/value.h"

namespace linattn::jinja {

// Whether a filter or test of this name is implemented (the parser refuses
// the others).
bool IsFilter(absl::string_view name);
bool IsTest(absl::string_view name);

// value | name(args); errors are INVALID_ARGUMENT without a position (the
// renderer adds it).
absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& value,
                                  const CallArgs& args);
absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& value,
                               const CallArgs& args);

// value.name: a dict's method, else its key; a namespace's attribute; a
// string's or list's method; otherwise undefined. Undefined `value` is an
// error (Jinja's UndefinedError).
absl::StatusOr<Value> GetAttr(const Value& value, const std::string& name);
// value[key]: a dict's key, a list's, tuple's or string's index (negative
// from the end), else for a string key the attribute, else undefined.
absl::StatusOr<Value> GetItem(const Value& value, const Value& key);
// value[start:stop:step] of a list, tuple or string.
absl::StatusOr<Value> Slice(const Value& value, const Value& start,
                            const Value& stop, const Value& step);
// The items `for` walks: a list's or tuple's items, a dict's keys, a
// string's characters; undefined walks nothing.
absl::StatusOr<std::vector<Value>> Iterate(const Value& value);

// The globals every template sees.
Dict Globals();

// Binds a call's arguments to parameter names (positional first, then by
// keyword); absent ones are undefined. INVALID_ARGUMENT for too many
// positional arguments or an unknown keyword, naming `what`.
absl::StatusOr<std::vector<Value>> BindArgs(
    absl::string_view what, const CallArgs& args,
    const std::vector<absl::string_view>& names);

// The error an undefined value raises when used.
absl::Status UndefinedError(const Value& undefined);

}  // namespace linattn::jinja

#endif  // LINATTN_CORE_MODEL_JINJA_BUILTINS_H_
