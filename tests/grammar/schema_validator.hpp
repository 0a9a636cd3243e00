// A small validator for the JSON Schema subset the grammar compiles (type, properties, required,
// additionalProperties, items, minItems, maxItems, enum, const, anyOf, $defs / $ref), written
// apart from the compiler so that the tests check generated values against the schema's meaning.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>

namespace ep::testing {

inline bool schema_valid(const nlohmann::json &root, const nlohmann::json &schema, const nlohmann::json &v) {
  using json = nlohmann::json;
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"].get<std::string>();
    return schema_valid(root, root.at(json::json_pointer(ref.substr(1))), v);
  }
  if (schema.contains("anyOf")) {
    for (const json &a : schema["anyOf"])
      if (schema_valid(root, a, v)) return true;
    return false;
  }
  if (schema.contains("const") && v != schema["const"]) return false;
  if (schema.contains("enum")) {
    bool found = false;
    for (const json &e : schema["enum"]) found = found || e == v;
    if (!found) return false;
  }
  if (schema.contains("type")) {
    const json types = schema["type"].is_array() ? schema["type"] : json::array({schema["type"]});
    bool ok = false;
    for (const json &t : types) {
      const std::string s = t.get<std::string>();
      ok = ok || (s == "null" && v.is_null()) || (s == "boolean" && v.is_boolean()) || (s == "string" && v.is_string()) ||
           (s == "array" && v.is_array()) || (s == "object" && v.is_object()) || (s == "number" && v.is_number()) ||
           (s == "integer" && (v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())));
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    const json props = schema.value("properties", json::object());
    for (const auto &[k, x] : v.items()) {
      if (props.contains(k)) {
        if (!schema_valid(root, props[k], x)) return false;
      } else if (schema.contains("additionalProperties") && !schema["additionalProperties"].get<bool>()) {
        return false;
      }
    }
    for (const json &r : schema.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
  }
  if (v.is_array()) {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return false;
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return false;
    if (schema.contains("items"))
      for (const json &x : v)
        if (!schema_valid(root, schema["items"], x)) return false;
  }
  return true;
}

inline bool schema_valid(const nlohmann::json &schema, const nlohmann::json &v) { return schema_valid(schema, schema, v); }

}  // namespace ep::testing
