// The parsed form of a template: expression and statement nodes, each with the byte offset it
// starts at so render errors can name a line and column.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/jinja/value.h"

namespace k3::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,   // literal
    Name,      // name
    ListLit,   // args: items
    DictLit,   // kwargs-like pairs in `entries`
    Attr,      // a.name
    Item,      // a[b]
    Slice,     // a[args[0]:args[1]:args[2]] (null entries: omitted)
    Call,      // a(args, kwargs)
    Filter,    // a | name(args, kwargs)
    Test,      // a is [not] name(args)  (negated: name starts the node, `negate`)
    Unary,     // name is "-", "+" or "not"; a
    Binary,    // name is the operator; a, b
    And,       // a and b
    Or,        // a or b
    Ternary,   // a if b else c (c may be null)
  };
  Kind kind;
  size_t pos;
  Value literal;
  std::string name;
  bool negate = false;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::pair<ExprPtr, ExprPtr>> entries;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Block };
  Kind kind;
  size_t pos;
  std::string text;                  // Text: the text; Macro: its name
  ExprPtr expr;                      // Output, Set: the value; For: the iterable
  ExprPtr cond;                      // For: the `if` filter (may be null)
  std::vector<std::string> targets;  // For / Set / SetBlock: names (one, or a tuple)
  std::string attr;                  // Set on a namespace: `set targets[0].attr = ...`
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: condition and body, in order
  Body body;                         // For, SetBlock, Macro, Block: the body
  Body else_body;                    // If, For
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro: names and defaults (may be null)
};

}  // namespace k3::jinja
