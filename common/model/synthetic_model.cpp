// `--model synthetic:PRESET[:SEED]`: a generated model named on the command line instead of a
// directory, for models too large to write to disk (kimi-linear-48b is 98 GB in bf16).
#include <charconv>

#include "common/model/weights.h"

namespace k3 {
namespace {
constexpr std::string_view kPrefix = "synthetic:";
}  // namespace

bool is_synthetic_model(const std::string& model) { return model.rfind(kPrefix, 0) == 0; }

Result<SyntheticModelName> parse_synthetic_model(const std::string& model) {
  if (!is_synthetic_model(model)) return invalid_argument("'" + model + "' is not of the form synthetic:PRESET[:SEED]");
  const std::string rest = model.substr(kPrefix.size());
  SyntheticModelName out;
  const size_t colon = rest.find(':');
  out.preset = rest.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string seed = rest.substr(colon + 1);
    const auto [end, ec] = std::from_chars(seed.data(), seed.data() + seed.size(), out.seed);
    if (seed.empty() || ec != std::errc() || end != seed.data() + seed.size())
      return invalid_argument("model '" + model + "': the seed after the preset must be an unsigned integer, got '" +
                              seed + "'");
  }
  if (auto cfg = preset_config(out.preset); !cfg.is_ok())
    return invalid_argument("model '" + model + "': " + cfg.status().message());
  return out;
}

Result<ModelConfig> load_model_config_of(const std::string& model) {
  if (!is_synthetic_model(model)) return load_model_config(model + "/config.json");
  K3_ASSIGN_OR_RETURN(SyntheticModelName name, parse_synthetic_model(model));
  return preset_config(name.preset);
}

}  // namespace k3
