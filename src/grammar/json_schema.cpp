#include "grammar/json_schema.hpp"

#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

namespace ep::grammar {

using json = nlohmann::json;

std::string escape_json_string(std::string_view text) {
  std::string quoted = json(std::string(text)).dump();
  return quoted.substr(1, quoted.size() - 2);
}

namespace {

// "" for the root, as JSON pointers write it; used in messages as "/properties/a".
std::string show(const std::string &pointer) { return pointer.empty() ? "/" : pointer; }

std::string pointer_token(const std::string &key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

uint8_t type_bit(const json &t, const std::string &where) {
  if (!t.is_string()) fail(Status::invalid_argument, "JSON schema {}: \"type\" entries must be strings, found {}", where, t.dump());
  const std::string &s = t.get_ref<const std::string &>();
  if (s == "null") return kNull;
  if (s == "boolean") return kBoolean;
  if (s == "integer") return kInteger;
  if (s == "number") return kNumber;
  if (s == "string") return kString;
  if (s == "array") return kArray;
  if (s == "object") return kObject;
  fail(Status::invalid_argument, "JSON schema {}: unknown \"type\" \"{}\" (expected null, boolean, integer, number, string, array or object)",
       where, s);
}

uint8_t value_type(const json &v) {
  switch (v.type()) {
    case json::value_t::null: return kNull;
    case json::value_t::boolean: return kBoolean;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return kInteger | kNumber;
    case json::value_t::number_float: {
      const double d = v.get<double>();
      return std::isfinite(d) && std::floor(d) == d ? (kInteger | kNumber) : kNumber;
    }
    case json::value_t::string: return kString;
    case json::value_t::array: return kArray;
    case json::value_t::object: return kObject;
    default: return 0;
  }
}

}  // namespace

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json &root) : root_(root) {}

  JsonGrammar run() {
    g_.nodes_.push_back(any_node());
    g_.any_ = 0;
    g_.root_ = compile(root_, "");
    for (Node &n : g_.nodes_)
      if (n.items < 0) n.items = g_.any_;
    check_any_of_cycles();
    g_.finish();
    return std::move(g_);
  }

  static Node any_node() {
    Node n;
    n.types = kAnyType;
    n.items = 0;
    return n;
  }

 private:
  const json &root_;
  JsonGrammar g_;
  std::map<std::string, int32_t> by_pointer_;  // every schema compiled so far, by its JSON pointer
  std::set<std::string> refs_open_;            // $refs being resolved (a cycle of them is an error)
  int depth_ = 0;                              // compile() calls in progress

  int32_t add(Node n) {
    if (g_.nodes_.size() >= kMaxSchemaNodes)
      fail(Status::invalid_argument, "JSON schema: more than {} schemas (the grammar's limit)", kMaxSchemaNodes);
    g_.nodes_.push_back(std::move(n));
    return static_cast<int32_t>(g_.nodes_.size() - 1);
  }

  const json &resolve(const std::string &ref, const std::string &where) {
    if (ref.empty() || ref[0] != '#')
      fail(Status::invalid_argument, "JSON schema {}/$ref: \"{}\" is not a reference inside this schema (expected \"#\" or \"#/...\")", show(where),
           ref);
    const std::string ptr = ref.substr(1);
    try {
      const json::json_pointer p(ptr);
      if (!root_.contains(p)) fail(Status::invalid_argument, "JSON schema {}/$ref: \"{}\" names nothing in the schema", show(where), ref);
      return root_.at(p);
    } catch (const json::exception &e) {
      fail(Status::invalid_argument, "JSON schema {}/$ref: \"{}\" is no JSON pointer ({})", show(where), ref, e.what());
    }
  }

  int32_t compile(const json &s, const std::string &ptr) {
    if (const auto it = by_pointer_.find(ptr); it != by_pointer_.end()) return it->second;
    // Bounded recursion: a request's schema must not be able to exhaust the stack.
    struct Depth {
      int &d;
      explicit Depth(int &depth) : d(depth) { ++d; }
      ~Depth() { --d; }
    } depth(depth_);
    if (depth_ > kMaxSchemaDepth)
      fail(Status::invalid_argument, "JSON schema {}: schemas nested (through $ref too) deeper than {}", show(ptr), kMaxSchemaDepth);
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(Status::invalid_argument, "JSON schema {}: the schema false admits no value", show(ptr));
      return by_pointer_[ptr] = g_.any_;
    }
    if (!s.is_object()) fail(Status::invalid_argument, "JSON schema {}: a schema must be an object or a boolean, found {}", show(ptr), s.dump());
    static const std::set<std::string> annotations = {"title", "description", "$comment", "examples", "default", "$schema", "deprecated",
                                                      "readOnly", "writeOnly"};
    static const std::set<std::string> known = {"type",  "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                                                "enum",  "const",      "anyOf",    "$defs",                "definitions", "$ref"};
    for (const auto &[key, value] : s.items()) {
      if (annotations.count(key) || known.count(key)) continue;
      fail(Status::invalid_argument, "JSON schema {}: keyword \"{}\" is outside the supported subset (docs/grammar.md)", show(ptr + "/" + pointer_token(key)),
           key);
    }
    auto only_beside = [&](const char *keyword, std::initializer_list<const char *> allowed) {
      for (const auto &item : s.items()) {
        const std::string &key = item.key();
        if (key == keyword || annotations.count(key) || key == "$defs" || key == "definitions") continue;
        if (std::find_if(allowed.begin(), allowed.end(), [&](const char *a) { return key == a; }) != allowed.end()) continue;
        fail(Status::invalid_argument, "JSON schema {}: keyword \"{}\" beside \"{}\" is not supported", show(ptr + "/" + pointer_token(key)), key,
             keyword);
      }
    };
    // $defs are compiled where a $ref reaches them (by their pointer); unused ones are still checked.
    for (const char *defs : {"$defs", "definitions"}) {
      if (!s.contains(defs)) continue;
      const json &d = s.at(defs);
      if (!d.is_object()) fail(Status::invalid_argument, "JSON schema {}/{}: expected an object of schemas", show(ptr), defs);
    }
    if (s.contains("$ref")) {
      only_beside("$ref", {});
      const json &r = s.at("$ref");
      if (!r.is_string()) fail(Status::invalid_argument, "JSON schema {}/$ref: expected a string, found {}", show(ptr), r.dump());
      const std::string target = r.get<std::string>().substr(1);
      const json &t = resolve(r.get<std::string>(), ptr);
      if (!refs_open_.insert(ptr).second)
        fail(Status::invalid_argument, "JSON schema {}/$ref: a chain of references comes back here with no schema between", show(ptr));
      const int32_t id = compile(t, target);
      refs_open_.erase(ptr);
      by_pointer_[ptr] = id;
      compile_defs(s, ptr);
      return id;
    }
    // Reserve the node now, so that a $ref back to it (recursion) finds it.
    const int32_t id = add(Node{});
    by_pointer_[ptr] = id;
    Node n;
    if (s.contains("anyOf")) {
      only_beside("anyOf", {});
      const json &a = s.at("anyOf");
      if (!a.is_array() || a.empty())
        fail(Status::invalid_argument, "JSON schema {}/anyOf: expected a non-empty array of schemas, found {}", show(ptr), a.dump());
      for (size_t i = 0; i < a.size(); ++i) n.any_of.push_back(compile(a[i], ptr + "/anyOf/" + std::to_string(i)));
      g_.nodes_[static_cast<size_t>(id)] = std::move(n);
      compile_defs(s, ptr);
      return id;
    }
    n.types = kAnyType;
    if (s.contains("type")) {
      const json &t = s.at("type");
      n.types = 0;
      if (t.is_array()) {
        if (t.empty()) fail(Status::invalid_argument, "JSON schema {}/type: an empty list admits no value", show(ptr));
        for (const json &e : t) n.types |= type_bit(e, show(ptr) + "/type");
      } else {
        n.types = type_bit(t, show(ptr) + "/type");
      }
    }
    if (s.contains("enum") || s.contains("const")) {
      const char *kw = s.contains("const") ? "const" : "enum";
      only_beside(kw, {"type"});
      std::vector<json> values;
      if (s.contains("const")) {
        values.push_back(s.at("const"));
      } else {
        const json &e = s.at("enum");
        if (!e.is_array() || e.empty())
          fail(Status::invalid_argument, "JSON schema {}/enum: expected a non-empty array, found {}", show(ptr), e.dump());
        values.assign(e.begin(), e.end());
      }
      std::set<std::string> texts;
      for (const json &v : values)
        if (value_type(v) & n.types) texts.insert(v.dump());
      if (texts.empty())
        fail(Status::invalid_argument, "JSON schema {}/{}: no value is of the schema's \"type\"", show(ptr), kw);
      n.literals.assign(texts.begin(), texts.end());
      n.types = 0;
      g_.nodes_[static_cast<size_t>(id)] = std::move(n);
      compile_defs(s, ptr);
      return id;
    }
    if (s.contains("properties")) {
      const json &p = s.at("properties");
      if (!p.is_object()) fail(Status::invalid_argument, "JSON schema {}/properties: expected an object, found {}", show(ptr), p.dump());
      if (p.size() > kMaxProperties)
        fail(Status::invalid_argument, "JSON schema {}/properties: {} properties, more than the {} one object may name", show(ptr), p.size(),
             kMaxProperties);
      for (const auto &[key, value] : p.items())
        n.properties.push_back({escape_json_string(key), compile(value, ptr + "/properties/" + pointer_token(key)), false});
      std::sort(n.properties.begin(), n.properties.end(), [](const Property &a, const Property &b) { return a.key < b.key; });
    }
    if (s.contains("required")) {
      const json &r = s.at("required");
      if (!r.is_array()) fail(Status::invalid_argument, "JSON schema {}/required: expected an array of names, found {}", show(ptr), r.dump());
      for (size_t i = 0; i < r.size(); ++i) {
        if (!r[i].is_string())
          fail(Status::invalid_argument, "JSON schema {}/required/{}: expected a string, found {}", show(ptr), i, r[i].dump());
        const std::string key = escape_json_string(r[i].get<std::string>());
        auto it = std::find_if(n.properties.begin(), n.properties.end(), [&](const Property &q) { return q.key == key; });
        if (it == n.properties.end())
          fail(Status::invalid_argument, "JSON schema {}/required/{}: \"{}\" is not one of the \"properties\"", show(ptr), i,
               r[i].get<std::string>());
        it->required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const json &a = s.at("additionalProperties");
      if (!a.is_boolean())
        fail(Status::invalid_argument, "JSON schema {}/additionalProperties: only true or false are supported, found a schema", show(ptr));
      n.additional = a.get<bool>();
    }
    auto count = [&](const char *kw) -> uint32_t {
      const json &v = s.at(kw);
      if (!v.is_number_unsigned() || v.get<uint64_t>() > UINT32_MAX)
        fail(Status::invalid_argument, "JSON schema {}/{}: expected a non-negative integer, found {}", show(ptr), kw, v.dump());
      return static_cast<uint32_t>(v.get<uint64_t>());
    };
    if (s.contains("items")) {
      const json &it = s.at("items");
      if (!it.is_object() && !it.is_boolean())
        fail(Status::invalid_argument, "JSON schema {}/items: expected one schema (tuple items are not supported), found {}", show(ptr), it.dump());
      n.items = compile(it, ptr + "/items");
    }
    if (s.contains("minItems")) n.min_items = count("minItems");
    if (s.contains("maxItems")) n.max_items = count("maxItems");
    if (n.min_items > n.max_items)
      fail(Status::invalid_argument, "JSON schema {}/minItems: {} is more than maxItems {}", show(ptr), n.min_items, n.max_items);
    g_.nodes_[static_cast<size_t>(id)] = std::move(n);
    compile_defs(s, ptr);
    return id;
  }

  void compile_defs(const json &s, const std::string &ptr) {
    for (const char *defs : {"$defs", "definitions"}) {
      if (!s.contains(defs)) continue;
      for (const auto &[key, value] : s.at(defs).items()) compile(value, ptr + "/" + defs + "/" + pointer_token(key));
    }
  }

  // An anyOf whose alternatives lead back to it through anyOf alone would expand forever.
  void check_any_of_cycles() {
    std::vector<int> mark(g_.nodes_.size(), 0);  // 0 new, 1 on the path, 2 done
    std::function<void(int32_t)> visit = [&](int32_t id) {
      if (mark[static_cast<size_t>(id)] == 2) return;
      if (mark[static_cast<size_t>(id)] == 1) {
        std::string where = "?";
        for (const auto &[p, i] : by_pointer_)
          if (i == id) where = show(p);
        fail(Status::invalid_argument, "JSON schema {}/anyOf: an alternative refers back to it with no value between", where);
      }
      mark[static_cast<size_t>(id)] = 1;
      for (int32_t a : g_.nodes_[static_cast<size_t>(id)].any_of) visit(a);
      mark[static_cast<size_t>(id)] = 2;
    };
    for (size_t i = 0; i < g_.nodes_.size(); ++i) visit(static_cast<int32_t>(i));
  }
};

void JsonGrammar::finish() {
  leaves_.assign(nodes_.size(), {});
  required_.assign(nodes_.size(), 0);
  // anyOf has no cycles (checked): the flattening ends; each node's leaves are made once (a
  // schema of shared anyOf alternatives is a DAG, which unmemoized recursion would walk
  // exponentially).
  std::vector<bool> done(nodes_.size(), false);
  std::function<void(int32_t)> flatten = [&](int32_t id) {
    const auto i = static_cast<size_t>(id);
    if (done[i]) return;
    const Node &n = nodes_[i];
    if (n.any_of.empty()) {
      leaves_[i] = {id};
    } else {
      for (int32_t a : n.any_of) {
        flatten(a);
        for (int32_t l : leaves_[static_cast<size_t>(a)])
          if (std::find(leaves_[i].begin(), leaves_[i].end(), l) == leaves_[i].end()) leaves_[i].push_back(l);
      }
    }
    done[i] = true;
  };
  for (size_t i = 0; i < nodes_.size(); ++i) {
    flatten(static_cast<int32_t>(i));
    const std::vector<Property> &p = nodes_[i].properties;
    for (size_t j = 0; j < p.size(); ++j)
      if (p[j].required) required_[i] |= uint64_t{1} << j;
  }
}

JsonGrammar JsonGrammar::any_object() {
  JsonGrammar g;
  g.nodes_.push_back(SchemaCompiler::any_node());
  Node root;
  root.types = kObject;
  root.items = 0;
  g.nodes_.push_back(root);
  g.any_ = 0;
  g.root_ = 1;
  g.finish();
  return g;
}

JsonGrammar JsonGrammar::any_value() {
  JsonGrammar g;
  g.nodes_.push_back(SchemaCompiler::any_node());
  g.finish();
  return g;
}

JsonGrammar JsonGrammar::from_schema(std::string_view schema) {
  json root;
  try {
    root = json::parse(schema);
  } catch (const json::parse_error &e) {
    fail(Status::invalid_argument, "JSON schema: not JSON ({})", e.what());
  }
  return SchemaCompiler(root).run();
}

}  // namespace ep::grammar
