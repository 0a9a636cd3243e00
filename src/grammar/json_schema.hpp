// The JSON values a constrained generation may produce, as a graph of nodes: "any JSON object"
// (OpenAI's json_object mode) or the nodes a JSON Schema compiles to, for the subset OpenAI's
// structured outputs accept. docs/grammar.md lists the keywords and the limits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ep::grammar {

/// The JSON types a node allows, one bit each.
enum TypeBits : uint8_t {
  kNull = 1,
  kBoolean = 2,
  kInteger = 4,  ///< digits only: no fraction, no exponent
  kNumber = 8,   ///< any JSON number (kInteger then adds nothing)
  kString = 16,
  kArray = 32,
  kObject = 64,
  kAnyType = 127,
};

/// The most properties one object node may name (a 64-bit mask tracks those written).
inline constexpr size_t kMaxProperties = 64;
/// The most schemas (nodes) one JSON Schema may compile to, and the deepest nesting of schemas
/// (through $ref too): a schema from a request must not exhaust memory or the stack.
inline constexpr size_t kMaxSchemaNodes = 4096;
inline constexpr int kMaxSchemaDepth = 128;

/// One named property of an object node. @c key is the name as the JSON text spells it between
/// its quotes (nlohmann's escaping: \" \\ \b \f \n \r \t, \u00XX for the other controls, other
/// bytes as they are), the bytes the automaton matches.
struct Property {
  std::string key;
  int32_t node = -1;
  bool required = false;
};

/// One node. Exactly one of three forms: @c any_of non-empty (the value is one of those nodes);
/// @c literals non-empty (the value is one of these compact JSON texts: const and enum); else
/// @c types with the object and array parts below.
struct Node {
  std::vector<int32_t> any_of;
  std::vector<std::string> literals;  ///< sorted, distinct
  uint8_t types = 0;
  std::vector<Property> properties;   ///< sorted by key, at most kMaxProperties
  bool additional = true;             ///< keys other than properties' (their values: any JSON)
  int32_t items = -1;                 ///< node of every item
  uint32_t min_items = 0, max_items = UINT32_MAX;
};

/// The compiled value graph: nodes by index, the root, and the node of "any JSON value".
class JsonGrammar {
 public:
  /// Any JSON object (OpenAI's response_format json_object).
  static JsonGrammar any_object();
  /// Any JSON value.
  static JsonGrammar any_value();
  /// Compiles @p schema (a JSON Schema as text). Status::invalid_argument naming the JSON
  /// pointer and the keyword for text that is no JSON, a keyword outside the subset, a value of
  /// the wrong kind, a $ref that does not resolve, or a schema no value satisfies.
  static JsonGrammar from_schema(std::string_view schema);

  const Node &node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  size_t size() const noexcept { return nodes_.size(); }
  int32_t root() const noexcept { return root_; }
  int32_t any() const noexcept { return any_; }
  /// The nodes @p id stands for: itself, or its anyOf alternatives flattened (no anyOf among them).
  const std::vector<int32_t> &leaves(int32_t id) const { return leaves_[static_cast<size_t>(id)]; }
  /// The bits of @p id's required properties.
  uint64_t required_mask(int32_t id) const { return required_[static_cast<size_t>(id)]; }

 private:
  friend class SchemaCompiler;
  void finish();
  std::vector<Node> nodes_;
  int32_t root_ = 0, any_ = 0;
  std::vector<std::vector<int32_t>> leaves_;
  std::vector<uint64_t> required_;
};

/// @p text between JSON quotes, as nlohmann writes it (what Property::key holds).
std::string escape_json_string(std::string_view text);

}  // namespace ep::grammar
