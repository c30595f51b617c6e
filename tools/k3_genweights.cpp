// k3-genweights: writes a complete random model directory (config.json, model.safetensors, tokenizer)
// for a preset or a config file. The init scheme is described in docs/MODEL_INIT.md.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/core/parse.h"
#include "common/io/progress_meter.h"
#include "common/io/safetensors_shards.h"
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

int fail(const Status& s) {
  std::fprintf(stderr, "k3-genweights: %s\n", s.to_string().c_str());
  return 1;
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  return buf;
}

// Files are written into this folder inside --out and moved into place at the end, config.json
// last, so an interrupted run never leaves a directory that looks like a complete model.
constexpr const char* kStagingName = ".k3-genweights-partial";

Status prepare_out_dir(const fs::path& dir, bool force) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) return invalid_argument("--out '" + dir.string() + "' exists and is not a directory");
    if (!fs::is_empty(dir, ec) && !force)
      return invalid_argument("--out '" + dir.string() + "' is not empty; pass --force to overwrite the model files in it");
  } else if (!fs::create_directories(dir, ec)) {
    return io_error("cannot create '" + dir.string() + "': " + ec.message());
  }
  const fs::path staging = dir / kStagingName;
  fs::remove_all(staging, ec);  // left by an interrupted run
  if (!fs::create_directory(staging, ec)) return io_error("cannot create '" + staging.string() + "': " + ec.message());
  return Status::ok();
}

// Removes the staging folder when the run ends early with an error (after a commit it is gone).
struct StagingCleanup {
  fs::path staging;
  ~StagingCleanup() {
    std::error_code ec;
    fs::remove_all(staging, ec);
  }
};

bool is_model_weights_file(const std::string& name) {
  return name == kSingleSafetensorsName || name == kSafetensorsIndexName ||
         (name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
          name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
}

// Moves the staged files into `dir`: first the old config.json and weights go (a stale index would
// take precedence over a new model.safetensors, stale shards would linger), then every staged file
// but config.json, then config.json.
Status commit_staged(const fs::path& dir) {
  const fs::path staging = dir / kStagingName;
  std::error_code ec;
  fs::remove(dir / "config.json", ec);
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && is_model_weights_file(entry.path().filename().string())) fs::remove(entry.path(), ec);
  std::vector<fs::path> staged;
  for (const auto& entry : fs::directory_iterator(staging, ec)) staged.push_back(entry.path());
  if (ec) return io_error("cannot list '" + staging.string() + "': " + ec.message());
  std::stable_partition(staged.begin(), staged.end(), [](const fs::path& p) { return p.filename() != "config.json"; });
  for (const fs::path& from : staged) {
    fs::rename(from, dir / from.filename(), ec);
    if (ec) return io_error("cannot move '" + from.string() + "' into '" + dir.string() + "': " + ec.message());
  }
  fs::remove(staging, ec);
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

// The files of the model in writing order; a model that fits one shard is a single model.safetensors.
std::vector<SafetensorsShard> plan_weights(const ModelConfig& cfg, DType dtype, uint64_t max_shard_bytes) {
  std::vector<SafetensorsLayoutEntry> layout;
  for (const TensorSpec& s : expected_tensors(cfg)) layout.push_back({s.name, init_dtype(s, dtype), s.shape});
  sort_layout_for_alignment(layout);  // each shard keeps the order, so its tensors stay aligned too
  return plan_safetensors_shards(layout, max_shard_bytes);
}

uint64_t planned_bytes(const std::vector<SafetensorsShard>& shards, const std::map<std::string, std::string>& meta) {
  uint64_t n = 0;
  for (const auto& shard : shards) n += safetensors_file_size(shard.layout, meta);
  return n;
}

// Streams the tensors shard by shard: one tensor's data is in memory at a time.
Status write_weights(const fs::path& dir, const ModelConfig& cfg, uint64_t seed, DType dtype,
                     const std::vector<SafetensorsShard>& shards, ProgressMeter& progress) {
  std::map<std::string, const TensorSpec*> by_name;
  const std::vector<TensorSpec> specs = expected_tensors(cfg);
  for (const TensorSpec& s : specs) by_name[s.name] = &s;
  const auto meta = file_metadata(seed, dtype);
  for (const SafetensorsShard& shard : shards) {
    K3_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create((dir / shard.file_name).string(), shard.layout, meta));
    progress.add(w.total_bytes() - safetensors_data_bytes(shard.layout));  // the header
    for (const SafetensorsLayoutEntry& e : w.layout()) {
      Tensor t = random_tensor(cfg, *by_name.at(e.name), seed, dtype);
      K3_TRY(w.write(e.name, t));
      progress.add(t.nbytes());
    }
    K3_TRY(w.finish());
  }
  if (shards.size() > 1) K3_TRY(write_text(dir / kSafetensorsIndexName, safetensors_index_json(shards)));
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "k3-genweights: write a random model directory: K3 (kimi_k3) or, with the kimi-linear-* presets or a\n"
      "kimi_linear config, Kimi Linear in the Hugging Face layout (docs/MODELS.md).\n"
      "Writes OUT/config.json, the weights and a small generated tokenizer (OUT/tiktoken.model,\n"
      "OUT/tokenizer_config.json). Weights that fit in --shard-size (default 5GB) go to OUT/model.safetensors;\n"
      "larger ones are split, in order, into OUT/model-00001-of-0000N.safetensors ... plus\n"
      "OUT/model.safetensors.index.json, as Hugging Face writes them. For the k3-tiny presets the vocabulary\n"
      "size, eos and bos ids are taken from that tokenizer; for other configs vocab_size must cover it and\n"
      "missing eos/bos ids are taken from it. Weights are deterministic for a given seed: each tensor is drawn\n"
      "from its own generator seeded by (seed, tensor name); see docs/MODEL_INIT.md for the distributions.\n"
      "Matrices and norm weights use --dtype; in K3 models A_log, dt_bias, the conv taps and the router\n"
      "correction bias are always F32 (Kimi Linear: --dtype too). Models larger than 4 GiB (k3-small, k3,\n"
      "kimi-linear-48b) need --allow-large.\n"
      "Progress goes to stderr: a bar on a terminal, a line every 5 % otherwise (--quiet: none).\n"
      "Files are written into OUT/.k3-genweights-partial and moved into OUT at the end, config.json last,\n"
      "so an interrupted run never leaves a half-written model with a config.json (a new OUT has none; with\n"
      "--force the previous model stays as it was). A non-empty OUT is refused unless --force."};
  std::string preset, config_file, out_dir, dtype_text = "bf16", shard_size_text = "5GB";
  uint64_t seed = 0;
  bool force = false, allow_large = false, vocab_from_tokenizer = false, quiet = false, config_only = false;
  std::string preset_help = "preset name:";
  for (const auto& n : preset_names()) preset_help += " " + n;
  auto* o_preset = app.add_option("--preset", preset, preset_help);
  auto* o_config = app.add_option("--config", config_file, "config.json in the published K3 or Kimi Linear format (validated)");
  o_preset->excludes(o_config);
  app.add_option("--out", out_dir, "output directory (created if missing)")->required();
  app.add_option("--seed", seed, "random seed (default 0)");
  app.add_option("--dtype", dtype_text, "storage dtype of matrices and norm weights: bf16 (default) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--shard-size", shard_size_text,
                 "largest tensor data per weights file, e.g. 5GB (default), 500MB, 2GiB or a byte count; "
                 "KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024. A tensor larger than this gets a file of its own");
  app.add_flag("--force", force, "write into a non-empty --out, replacing the model files there");
  app.add_flag("--allow-large", allow_large, "allow writing a model larger than 4 GiB");
  app.add_flag("--quiet", quiet, "no progress output");
  app.add_flag("--config-only", config_only,
               "write config.json and the tokenizer files but no weights (for a model served as "
               "synthetic:PRESET[:SEED], which draws the same weights where it is loaded)");
  app.add_flag("--vocab-from-tokenizer", vocab_from_tokenizer,
               "set vocab_size, eos and bos from the generated tokenizer (implied for k3-tiny presets)");
  CLI11_PARSE(app, argc, argv);
  if (preset.empty() == config_file.empty()) return fail(invalid_argument("exactly one of --preset, --config is required"));
  auto shard_size = parse_byte_size(shard_size_text, "--shard-size");
  if (!shard_size.is_ok()) return fail(shard_size.status());

  try {
    auto cfg = preset.empty() ? load_model_config(config_file) : preset_config(preset);
    if (!cfg.is_ok()) return fail(cfg.status());
    const bool tiny_preset = preset.rfind("k3-tiny", 0) == 0 || preset == "kimi-linear-tiny";
    const DType dtype = dtype_text == "f32" ? DType::F32 : DType::BF16;

    // The tensor list does not depend on the tokenizer (vocab_size is checked, not changed, for
    // non-tiny configs), so the size check runs before anything is written.
    const uint64_t bytes = planned_bytes(plan_weights(*cfg, dtype, *shard_size), file_metadata(seed, dtype));
    if (bytes > kLargeBytes && !allow_large && !config_only)
      return fail(invalid_argument("refusing to write " + gib(bytes) + " without --allow-large"));

    const fs::path dir(out_dir);
    const fs::path staging = dir / kStagingName;
    if (auto s = prepare_out_dir(dir, force); !s.is_ok()) return fail(s);
    const StagingCleanup cleanup{staging};
    if (auto s = adopt_tokenizer(staging.string(), vocab_from_tokenizer || tiny_preset, *cfg); !s.is_ok()) return fail(s);
    if (auto s = validate(*cfg); !s.is_ok()) return fail(s);
    // Planned again: adopting the tokenizer may have changed vocab_size (k3-tiny presets).
    const std::vector<SafetensorsShard> shards =
        config_only ? std::vector<SafetensorsShard>{} : plan_weights(*cfg, dtype, *shard_size);
    const uint64_t total = planned_bytes(shards, file_metadata(seed, dtype));
    if (!quiet && !config_only)
      std::fprintf(stderr, "k3-genweights: writing %llu bytes (%s) of weights in %zu file%s\n",
                   static_cast<unsigned long long>(total), gib(total).c_str(), shards.size(), shards.size() > 1 ? "s" : "");
    ProgressMeter progress("k3-genweights:", total, ProgressMeter::mode_for(stderr, quiet || config_only));
    if (auto s = write_weights(staging, *cfg, seed, dtype, shards, progress); !s.is_ok()) return fail(s);
    progress.finish();
    if (auto s = write_text(staging / "config.json", model_config_to_json(*cfg)); !s.is_ok()) return fail(s);
    if (auto s = commit_staged(dir); !s.is_ok()) return fail(s);
    if (!quiet)
      std::fprintf(stderr, "k3-genweights: wrote %s (vocab %d, %zu tensors, %zu weights file%s, seed %llu)\n",
                   dir.string().c_str(), cfg->vocab_size, expected_tensors(*cfg).size(), shards.size(),
                   shards.size() > 1 ? "s" : "", static_cast<unsigned long long>(seed));
  } catch (const std::exception& e) {
    return fail(internal_error(e.what()));
  }
  return 0;
}
