// The grammar of structured output: a JSON-schema subset compiled into a tree of value nodes that
// JsonMatcher walks byte by byte. One definition, linked by the router (local mode) and by the nodes
// that sample in cluster mode (last prefill stage, decode rank), so every sampler constrains the same way.
//
// Supported (anything else is refused, naming the keyword and where it is):
//   type (a name or a list of names: object, array, string, number, integer, boolean, null),
//   properties, required, additionalProperties (true/false), items, enum, const,
//   minItems/maxItems, minLength/maxLength; annotations (title, description, $schema, default,
//   examples, $comment) are ignored.
// Output is compact JSON (no whitespace outside strings). Object properties come in declaration order;
// optional ones may be left out; when `properties` is given only those keys are produced (which also
// validates where additionalProperties would allow more). An object schema without properties (and
// json_object mode) takes any keys with any values.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/core/status.h"

namespace k3::grammar {

enum ValueKind : uint32_t {
  kObject = 1u << 0, kArray = 1u << 1, kString = 1u << 2, kNumber = 1u << 3,
  kInteger = 1u << 4, kBoolean = 1u << 5, kNull = 1u << 6,
  kAnyKind = kObject | kArray | kString | kNumber | kBoolean | kNull,
};

// Limits that keep every state finishable and the matcher's state small.
inline constexpr int kMaxDepth = 12;          // nesting of objects/arrays in a schema
inline constexpr int kMaxAnyDepth = 5;        // nesting where any value is allowed (json_object mode)
inline constexpr int kMaxAlternatives = 64;   // properties per object, values per enum
inline constexpr int kMaxIntDigits = 15, kMaxFracDigits = 15, kMaxExpDigits = 2;

struct Property {
  std::string key;      // the key as it appears in the output, JSON-encoded with its quotes: "\"name\""
  int node = 0;
  bool required = false;
};

struct SchemaNode {
  uint32_t kinds = kAnyKind;
  std::vector<std::string> literals;  // enum/const: compact JSON texts; non-empty makes this node an enum
  std::vector<Property> props;        // object: declared properties, in output order
  bool free_keys = true;              // object without properties: any key, values of node kAnyNode
  int items = 0;                      // array: node of the items
  int64_t min_items = 0, max_items = -1;
  int64_t min_length = 0, max_length = -1;  // string, in code points (-1: unbounded)
};

class JsonGrammar {
 public:
  static constexpr int kAnyNode = 0;   // any JSON value
  static constexpr int kAnyString = 1; // any string (free object keys)

  // json_object mode: the document is any JSON object.
  static JsonGrammar any_object();
  // json_schema mode. On failure the Status names the keyword; *error_path (when given) gets where it
  // is, as a dotted path from the schema root ("" for the root, "properties.a.items").
  // The schema keeps its key order (ordered_json): properties are produced in declaration order.
  static Result<JsonGrammar> from_schema(const nlohmann::ordered_json& schema, std::string* error_path = nullptr);
  // The same from the schema's JSON text (what travels to the nodes in cluster mode).
  static Result<JsonGrammar> from_schema_text(std::string_view text, std::string* error_path = nullptr);

  const SchemaNode& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
  int root() const { return root_; }

 private:
  JsonGrammar();
  friend class SchemaCompiler;
  std::vector<SchemaNode> nodes_;
  int root_ = 0;
};

}  // namespace k3::grammar
