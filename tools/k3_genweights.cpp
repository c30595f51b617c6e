// k3-genweights: writes a complete random model directory (config.json, model.safetensors, tokenizer)
// for a preset or a config file. The init scheme is described in docs/MODEL_INIT.md.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/io/safetensors_writer.h"
#include "common/config/config.h"
#include "common/model/weights.h"
#include "common/model/weights_init.h"
#include "common/tokenizer/tiny_tokenizer.h"
#include "common/tokenizer/tokenizer.h"

using namespace k3;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kLargeBytes = 4ull << 30;      // above this, --allow-large is required
constexpr uint64_t kProgressBytes = 256ull << 20;  // above this, progress goes to stderr

int fail(const Status& s) {
  std::fprintf(stderr, "k3-genweights: %s\n", s.to_string().c_str());
  return 1;
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

Status prepare_out_dir(const fs::path& dir, bool force) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) return invalid_argument("--out '" + dir.string() + "' exists and is not a directory");
    if (!fs::is_empty(dir, ec) && !force)
      return invalid_argument("--out '" + dir.string() + "' is not empty; pass --force to overwrite the model files in it");
    // A stale shard index would take precedence over the new model.safetensors when loading.
    fs::remove(dir / "model.safetensors.index.json", ec);
    return Status::ok();
  }
  if (!fs::create_directories(dir, ec)) return io_error("cannot create '" + dir.string() + "': " + ec.message());
  return Status::ok();
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return io_error("cannot write '" + path.string() + "'");
  return Status::ok();
}

// Takes vocabulary and special ids from the tokenizer just written into `dir`.
Status adopt_tokenizer(const std::string& dir, bool vocab_from_tokenizer, ModelConfig& cfg) {
  K3_ASSIGN_OR_RETURN(int written_vocab, write_tiny_tokenizer(dir));
  K3_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(dir));
  if (tok.vocab_size() != written_vocab)
    return internal_error("tokenizer reports vocab " + std::to_string(tok.vocab_size()) + " but wrote " +
                          std::to_string(written_vocab));
  if (vocab_from_tokenizer) {
    cfg.vocab_size = written_vocab;
    cfg.eos_token_ids.clear();
    cfg.bos_token_id = -1;
  } else if (cfg.vocab_size < written_vocab) {
    return invalid_argument("vocab_size " + std::to_string(cfg.vocab_size) + " is smaller than the generated tokenizer's " +
                            std::to_string(written_vocab) + " tokens (use --vocab-from-tokenizer)");
  }
  if (cfg.eos_token_ids.empty())
    for (int32_t id : tok.eos_ids()) cfg.eos_token_ids.push_back(id);
  if (cfg.bos_token_id < 0 && tok.bos_id()) cfg.bos_token_id = *tok.bos_id();
  return Status::ok();
}

std::map<std::string, std::string> file_metadata(uint64_t seed, DType dtype) {
  return {{"format", "pt"}, {"generator", "k3-genweights"}, {"seed", std::to_string(seed)}, {"dtype", dtype_name(dtype)}};
}

Status write_weights(const std::string& path, const ModelConfig& cfg, uint64_t seed, DType dtype) {
  std::vector<TensorSpec> specs = expected_tensors(cfg);
  std::map<std::string, const TensorSpec*> by_name;
  std::vector<SafetensorsLayoutEntry> layout;
  for (const TensorSpec& s : specs) {
    by_name[s.name] = &s;
    layout.push_back({s.name, init_dtype(s, dtype), s.shape});
  }
  sort_layout_for_alignment(layout);
  K3_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(path, layout, file_metadata(seed, dtype)));
  const bool progress = w.total_bytes() > kProgressBytes;
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  uint64_t done = 0;
  for (size_t i = 0; i < w.layout().size(); ++i) {
    const SafetensorsLayoutEntry& e = w.layout()[i];
    Tensor t = random_tensor(cfg, *by_name.at(e.name), seed, dtype);
    K3_TRY(w.write(e.name, t));
    done += t.nbytes();
    const auto now = std::chrono::steady_clock::now();
    if (progress && (now - last > std::chrono::seconds(2) || i + 1 == w.layout().size())) {
      last = now;
      std::fprintf(stderr, "k3-genweights: %zu/%zu tensors, %s of %s, %.0f s\n", i + 1, w.layout().size(),
                   gib(done).c_str(), gib(w.total_bytes()).c_str(),
                   std::chrono::duration<double>(now - start).count());
    }
  }
  return w.finish();
}

uint64_t planned_bytes(const ModelConfig& cfg, uint64_t seed, DType dtype) {
  std::vector<SafetensorsLayoutEntry> layout;
  for (const TensorSpec& s : expected_tensors(cfg)) layout.push_back({s.name, init_dtype(s, dtype), s.shape});
  sort_layout_for_alignment(layout);
  return safetensors_file_size(layout, file_metadata(seed, dtype));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "k3-genweights: write a random K3-architecture model directory.\n"
      "Writes OUT/config.json, OUT/model.safetensors and a small generated tokenizer (OUT/tiktoken.model,\n"
      "OUT/tokenizer_config.json). For the k3-tiny presets the vocabulary size, eos and bos ids are taken\n"
      "from that tokenizer; for other configs vocab_size must cover it and missing eos/bos ids are taken\n"
      "from it. Weights are deterministic for a given seed: each tensor is drawn from its own\n"
      "generator seeded by (seed, tensor name); see docs/MODEL_INIT.md for the distributions.\n"
      "Matrices and norm weights use --dtype; A_log, dt_bias, the conv taps and the router correction bias\n"
      "are always F32. Models larger than 4 GiB (k3-small, k3) need --allow-large; progress goes to stderr.\n"
      "A non-empty OUT is refused unless --force."};
  std::string preset, config_file, out_dir, dtype_text = "bf16";
  uint64_t seed = 0;
  bool force = false, allow_large = false, vocab_from_tokenizer = false;
  std::string preset_help = "preset name:";
  for (const auto& n : preset_names()) preset_help += " " + n;
  auto* o_preset = app.add_option("--preset", preset, preset_help);
  auto* o_config = app.add_option("--config", config_file, "config.json in the published K3 format (validated)");
  o_preset->excludes(o_config);
  app.add_option("--out", out_dir, "output directory (created if missing)")->required();
  app.add_option("--seed", seed, "random seed (default 0)");
  app.add_option("--dtype", dtype_text, "storage dtype of matrices and norm weights: bf16 (default) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_flag("--force", force, "write into a non-empty --out, replacing the model files there");
  app.add_flag("--allow-large", allow_large, "allow writing a model file larger than 4 GiB");
  app.add_flag("--vocab-from-tokenizer", vocab_from_tokenizer,
               "set vocab_size, eos and bos from the generated tokenizer (implied for k3-tiny presets)");
  CLI11_PARSE(app, argc, argv);
  if (preset.empty() == config_file.empty()) return fail(invalid_argument("exactly one of --preset, --config is required"));

  try {
    auto cfg = preset.empty() ? load_model_config(config_file) : preset_config(preset);
    if (!cfg.is_ok()) return fail(cfg.status());
    const bool tiny_preset = preset.rfind("k3-tiny", 0) == 0;
    const DType dtype = dtype_text == "f32" ? DType::F32 : DType::BF16;

    const uint64_t bytes = planned_bytes(*cfg, seed, dtype);
    std::fprintf(stderr, "k3-genweights: model.safetensors will be %llu bytes (%s)\n",
                 static_cast<unsigned long long>(bytes), gib(bytes).c_str());
    if (bytes > kLargeBytes && !allow_large)
      return fail(invalid_argument("refusing to write " + gib(bytes) + " without --allow-large"));

    const fs::path dir(out_dir);
    if (auto s = prepare_out_dir(dir, force); !s.is_ok()) return fail(s);
    if (auto s = adopt_tokenizer(dir.string(), vocab_from_tokenizer || tiny_preset, *cfg); !s.is_ok()) return fail(s);
    if (auto s = validate(*cfg); !s.is_ok()) return fail(s);
    if (auto s = write_weights((dir / "model.safetensors").string(), *cfg, seed, dtype); !s.is_ok()) return fail(s);
    // config.json last: a directory with a config is a complete model.
    if (auto s = write_text(dir / "config.json", model_config_to_json(*cfg)); !s.is_ok()) return fail(s);
    std::fprintf(stderr, "k3-genweights: wrote %s (vocab %d, %zu tensors, seed %llu)\n", dir.string().c_str(),
                 cfg->vocab_size, expected_tensors(*cfg).size(), static_cast<unsigned long long>(seed));
  } catch (const std::exception& e) {
    return fail(internal_error(e.what()));
  }
  return 0;
}
