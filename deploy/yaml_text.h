// JSON values written as block-style YAML for the rendered manifests (Kubernetes reads YAML; people
// read these files): maps and lists in block style, multi-line strings as literal blocks, every
// other string double-quoted with JSON escapes (a valid YAML double-quoted scalar), so no value is
// ever re-typed by a YAML reader ("on", "0700", "1e3" stay strings).
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace k3::deploy {

std::string yaml_text(const nlohmann::ordered_json& value);

}  // namespace k3::deploy
