// k3-prefill: one pipeline stage of a prefill instance (see prefill_stage.h for the request flow).
// stdout protocol (one line each, flushed; tests and the launcher read them):
//   LISTEN <endpoint>        stages > 0: where stage s-1 must send activations (--next-endpoint)
//   READY <control name>     the stage is up (model loaded, driver connected)
//   DECODE_READY             every decode instance's registration (worker address, rkeys) arrived
//   HELD <sources> <computing>  whenever the driver's held sources or the requests in compute change
//   TIMING <id> compute|writes|writes_done <begin_us> <end_us> [<bytes>]  with --timing: a request's spans on
//                            this stage (writes: one per write batch, with its bytes; writes_done: the whole
//                            transfer)
#include <CLI/CLI.hpp>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>

#include "common/config/config.h"
#include "common/model/weights.h"
#include "common/tokenizer/tokenizer.h"
#include "common/protocol/metrics_endpoint.h"
#include "prefill_node/partition.h"
#include "prefill_node/prefill_stage.h"
#include "transfer/advertise_endpoint.h"
#include "transfer/control_keys.h"
#include "transfer/net_interface.h"

#include "common/core/node_process.h"
#include "common/io/load_progress.h"
#include "kernels/backend_flags.h"

using namespace k3;

namespace {

void say(const std::string& s) { say_line(s); }
int fail(const Status& s) { return fail_status("k3-prefill", s); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k3-prefill: one pipeline-parallel prefill stage. Computes its layer range of every prompt chunk by "
               "chunk, passes activations to the next stage, and sends its own layers' KV/state to the decode "
               "instance over UCX (control over ZeroMQ). Start one process per stage."};
  std::string model_dir, partition_text, log_level = "warn";
  prefill::PrefillStageOptions o;
  int stages = 0, hb_ms = 200, hb_misses = 3;   // the router's defaults: it expects a heartbeat this often
  long addrs_ms = 300000;
  app.add_option("--model", model_dir, "model directory (config.json, model.safetensors)")->required();
  app.add_option("--stage", o.stage, "this process's stage index, 0-based (default 0)")->check(CLI::NonNegativeNumber);
  app.add_option("--stages", stages, "number of stages (default: the --partition length, else 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--partition", partition_text,
                 "layers per stage, e.g. 4,4 (length = stages, sum = model layers; default: even split)");
  app.add_option("--chunk-size", o.chunk_size, "prompt tokens per pipeline chunk (default 256)")->check(CLI::PositiveNumber);
  bool no_stream = false;
  app.add_flag("--no-stream", no_stream,
               "write a request's KV/state only after its whole prompt is computed (default: each chunk's rows "
               "while the next chunk computes, the KDA state after the last)");
  app.add_option("--max-inflight-chunks", o.max_inflight_chunks,
                 "streaming: write batches (one per chunk) in flight on this stage before compute waits (default 4)");
  app.add_option("--max-requests", o.cache.max_seqs, "requests computing at once on this stage (cache slots, default 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--cache-pages", o.cache.num_pages, "local MLA cache pages per layer (default 256)")->check(CLI::PositiveNumber);
  double cache_region_mib = 0;
  app.add_option("--cache-region-mib", cache_region_mib,
                 "MiB of the stage's unified cache region that KDA slots (requests and prefix checkpoints) and MLA pages "
                 "share (0 = room for every slot and page at once; less lets the boundary follow demand)")
      ->check(CLI::NonNegativeNumber);
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "HOST:PORT where GET /metrics serves everything this stage counts (transfer, source arena, prefix "
                 "cache; port 0 picks one, printed as METRICS <url>); default off");
  double source_arena_mib = -1;
  app.add_option("--source-arena-mib", source_arena_mib,
                 "MiB allocated and registered once for the KV/state images this stage writes to decode (default "
                 "1024 on a GPU, 256 on the host; an image that does not fit gets memory of its own; 0 = none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--transfer-busy-poll-us", o.transfer_busy_poll_us,
                 "microseconds each wait for a write list polls UCX before sleeping on its event fd (default 1000 "
                 "on a GPU, where the fd wake-up is a large part of a list's time; 0 on the host)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--cache-page-size", o.cache.page_size, "tokens per local MLA cache page (default 16)")
      ->check(CLI::PositiveNumber);
  app.add_option("--transfer-page-size", o.transfer_page_size,
                 "tokens per page of the decode pool (must equal k3-decode --page-size; default 16)")
      ->check(CLI::PositiveNumber);
  app.add_option("--instance", o.instance_id, "prefill instance id (control name prefill/<id>/<stage>; default p)");
  // Repeatable in pairs: the i-th --decode-instance is reached at the i-th --decode-endpoint. The router
  // names the decode instance of each request, so one stage can feed every decode instance it is given.
  std::vector<std::string> decode_instances, decode_endpoints;
  app.add_option("--decode-instance", decode_instances,
                 "decode instance id this stage may feed (repeat, one per --decode-endpoint; default d)");
  app.add_option("--decode-endpoint", decode_endpoints,
                 "decode's control endpoint, as k3-decode prints it (repeat for each decode instance)")->required();
  app.add_option("--router-endpoint", o.router_endpoint, "router control endpoint (PREFILL / ABORT come from there)");
  app.add_option("--listen", o.listen_endpoint,
                 "stages > 0: bind for activations from the previous stage, e.g. tcp://127.0.0.1:* (port picked, "
                 "printed as LISTEN)");
  app.add_option("--next-endpoint", o.next_endpoint, "stages before the last: the next stage's LISTEN endpoint");
  int prefix_slots = 0;
  double prefix_budget_mb = 0;
  app.add_option("--prefix-cache-slots", prefix_slots,
                 "prefix cache: KDA checkpoint slots beside --max-requests (0 = cache off, the default); every stage "
                 "of the instance needs the same --prefix-* flags")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefix-block", o.prefix.block_tokens,
                 "prefix cache: checkpoint alignment in tokens, a multiple of 64 and of --cache-page-size (default 64); "
                 "--chunk-size must be a multiple of 64")
      ->check(CLI::PositiveNumber);
  app.add_option("--prefix-checkpoint-every", o.prefix.checkpoint_every, "prefix cache: blocks between checkpoints (default 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--prefix-budget-mb", prefix_budget_mb,
                 "prefix cache: memory budget of the whole instance in MiB, counted over all layers (0 = the pools bound it)")
      ->check(CLI::NonNegativeNumber);
  std::string interface = "127.0.0.1", key_file, public_keys_file, advertise_host;
  app.add_option("--advertise-host", advertise_host,
                 "stages > 0: host (address or name) the previous stage reaches --listen at, printed in LISTEN with the "
                 "bound port (default: the bound host; required when --listen is tcp://0.0.0.0:...)");
  bool insecure = false;
  app.add_option("--interface", interface,
                 "IPv4 address of the interface the UCX data plane uses (default 127.0.0.1); --listen should "
                 "bind the same address");
  app.add_option("--control-key", key_file, transfer::kControlKeyHelp);
  app.add_option("--control-public-keys", public_keys_file, transfer::kControlPublicKeysHelp);
  app.add_flag("--insecure-control-plane", insecure, transfer::kInsecureControlHelp);
  BackendFlags backend_flags;
  add_backend_flags(app, backend_flags);
  app.add_option("--heartbeat-ms", hb_ms, "control heartbeat interval; the router's --heartbeat-ms or less (default 200, the router's default)")->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-misses", hb_misses, "missed heartbeats before a peer is dead (default 3)")
      ->check(CLI::PositiveNumber);
  app.add_option("--addrs-timeout-ms", addrs_ms, "COMPUTE_DONE -> ADDRS wait before the request expires (default 300000)")
      ->check(CLI::PositiveNumber);
  app.add_option("--log-level", log_level, "spdlog level: trace, debug, info, warn (default), error");
  bool timing = false;
  app.add_flag("--timing", timing,
               "print TIMING lines: each request's compute and write spans on this stage (steady-clock us; "
               "k3-bench overlap reads them)");
  CLI11_PARSE(app, argc, argv);
  o.stream = !no_stream;
  if (timing)
    o.on_timing = [](const prefill::StageTiming& t) {
      say("TIMING " + std::to_string(t.request_id) + " " + prefill::span_name(t.span) + " " + std::to_string(t.begin_us) +
          " " + std::to_string(t.end_us) +
          (t.span == prefill::StageTiming::Span::Writes ? " " + std::to_string(t.bytes) : std::string()));
    };
  spdlog::set_level(spdlog::level::from_str(log_level));
  // Checked before anything is loaded, as k3-decode does: a bad address costs no weight upload.
  std::optional<protocol::ListenAddress> metrics_at;
  if (!metrics_listen.empty()) {
    auto at = protocol::parse_listen_address(metrics_listen, "--metrics-listen");
    if (!at.is_ok()) return fail(at.status());
    metrics_at = *at;
  }
  if (prefix_slots > 0) {
    o.cache.checkpoint_slots = prefix_slots;
    o.prefix.enabled = true;
    o.prefix.budget_bytes = static_cast<uint64_t>(prefix_budget_mb * 1024 * 1024);
  }

  if (decode_instances.empty() && decode_endpoints.size() == 1) decode_instances.push_back("d");
  if (decode_instances.size() != decode_endpoints.size())
    return fail(invalid_argument("--decode-instance given " + std::to_string(decode_instances.size()) +
                                 " time(s) but --decode-endpoint " + std::to_string(decode_endpoints.size()) +
                                 " time(s): give one instance per endpoint"));
  for (size_t i = 0; i < decode_endpoints.size(); ++i) o.decodes.push_back({decode_instances[i], decode_endpoints[i]});
  auto keys = transfer::control_keys_from_flags(key_file, public_keys_file, insecure);
  if (!keys.is_ok()) return fail(keys.status());
  o.control_keys = *keys;
  auto device = transfer::net_device_of(interface);
  if (!device.is_ok()) return fail(device.status());
  o.ucx_net_devices = *device;

  auto cfg = load_model_config(model_dir + "/config.json");
  if (!cfg.is_ok()) return fail(cfg.status());
  if (stages == 0) stages = partition_text.empty() ? 1 : static_cast<int>(std::count(partition_text.begin(), partition_text.end(), ',')) + 1;
  auto partition = prefill::parse_partition(partition_text, stages, cfg->num_hidden_layers);
  if (!partition.is_ok()) return fail(partition.status());
  o.partition = *partition;
  o.heartbeat = {std::chrono::milliseconds(hb_ms), hb_misses};
  o.timeouts.addrs_wait = transfer::Millis(addrs_ms);
  if (o.stage >= stages) return fail(invalid_argument("--stage " + std::to_string(o.stage) + " >= --stages " + std::to_string(stages)));

  if (o.stage == stages - 1) {  // the last stage samples the first token: structured output needs the vocabulary
    auto tok = Tokenizer::load(model_dir);
    if (!tok.is_ok()) return fail(Status(tok.status().code(), "tokenizer (for structured output): " + tok.status().message()));
    o.vocab = grammar::TokenVocab::from_tokenizer(*tok);
  }
  const int begin = prefill::stage_begin(o.partition, o.stage);
  auto weights = load_weights(model_dir, *cfg, begin, begin + o.partition[o.stage]);
  if (!weights.is_ok()) return fail(weights.status());
  auto bc = backend_flags.resolve();
  if (!bc.is_ok()) return fail(bc.status());
  o.cuda_device = bc->device;
  o.cache.region_bytes = static_cast<uint64_t>(cache_region_mib * (1 << 20));
  if (source_arena_mib >= 0) o.source_arena_bytes = static_cast<int64_t>(source_arena_mib * (1 << 20));
  auto backend = make_backend(*bc);
  if (!backend.is_ok()) return fail(backend.status());
  zmq::context_t zctx;
  LoadProgress load("k3-prefill prefill/" + o.instance_id + "/" + std::to_string(o.stage) + ": weights");
  weights->set_upload_observer(load.observer());
  auto stage = prefill::PrefillStage::create(o, **backend, *cfg, *weights, zctx);
  if (!stage.is_ok()) return fail(stage.status());
  load.finish();
  prefill::PrefillStage& s = **stage;

  const std::atomic<bool>& g_stop = install_stop_signals();
  std::unique_ptr<protocol::MetricsEndpoint> metrics_endpoint;
  if (metrics_at) {
    auto ep = protocol::MetricsEndpoint::start(*metrics_at, s.metrics());
    if (!ep.is_ok()) return fail(ep.status());
    metrics_endpoint = std::move(ep).value();
    say("METRICS " + metrics_endpoint->url());
  }
  if (o.stage > 0) {
    auto advertised = transfer::advertised_endpoint(s.listen_endpoint(), advertise_host);
    if (!advertised.is_ok()) return fail(advertised.status());
    say("LISTEN " + *advertised);
  }
  say("READY prefill/" + o.instance_id + "/" + std::to_string(o.stage));
  bool announced = false;
  size_t held = 0, computing = 0;
  // A HEARTBEAT with the stage's prefix cache every heartbeat interval: the router's KV-aware placement
  // and its /metrics read it (a lost one only delays them: the next carries the same state).
  auto last_report = std::chrono::steady_clock::now() - o.heartbeat.interval;
  uint64_t report_seq = 0;
  while (!g_stop) {
    if (Status st = s.run_once(std::chrono::milliseconds(50)); !st.is_ok()) return fail(st);
    if (!o.router_endpoint.empty() && std::chrono::steady_clock::now() - last_report >= o.heartbeat.interval) {
      last_report = std::chrono::steady_clock::now();
      (void)s.driver().send_to_router(protocol::Heartbeat{.role = protocol::Role::Prefill, .instance_id = o.instance_id,
                                                          .stage = static_cast<uint32_t>(o.stage), .seq = ++report_seq,
                                                          .num_running = static_cast<uint32_t>(s.requests_in_compute()),
                                                          .prefix = s.prefix_report()});
    }
    if (!announced && s.decode_ready()) {
      announced = true;
      say("DECODE_READY");
    }
    if (s.sources_held() != held || s.requests_in_compute() != computing) {
      held = s.sources_held();
      computing = s.requests_in_compute();
      say("HELD " + std::to_string(held) + " " + std::to_string(computing));
    }
  }
  say("STOPPED");
  return 0;
}
