// k3-op: run one kernel op on named tensors from a safetensors file.
//   k3-op --op NAME --in in.safetensors --out out.safetensors [--backend cpu|cuda] [--threads N]
// Input tensor names are the ops.h field names (see docs/OPS.md or --list); attributes come from
// the input file's __metadata__ as strings; every output (and every updated in/out tensor) is
// written to --out under its field name.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "common/io/safetensors.h"
#include "common/io/safetensors_writer.h"
#include "kernels/backend.h"
#include "kernels/op_registry.h"

namespace {

const char* kind_name(k3::OpFieldKind k) {
  switch (k) {
    case k3::OpFieldKind::Act: return "act";
    case k3::OpFieldKind::F32: return "F32";
    case k3::OpFieldKind::I32: return "I32";
  }
  return "?";
}

void print_ops() {
  for (const auto& op : k3::op_infos()) {
    std::printf("%s: %s\n  in:", op.name.c_str(), op.summary.c_str());
    for (const auto& f : op.inputs)
      std::printf(" %s(%s%s%s)", f.name.c_str(), kind_name(f.kind), f.optional ? ",optional" : "",
                  f.inout ? ",in/out" : "");
    std::printf("\n  out:");
    for (const auto& f : op.outputs) std::printf(" %s(%s)", f.name.c_str(), kind_name(f.kind));
    std::printf("\n  attrs:");
    if (op.attrs.empty()) std::printf(" none");
    for (const auto& a : op.attrs)
      std::printf(" %s=%s", a.name.c_str(), a.default_value.empty() ? (a.note.empty() ? "required" : a.note.c_str())
                                                                     : a.default_value.c_str());
    std::printf("\n");
  }
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "k3-op: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"k3-op: run one kernel op on tensors from a safetensors file"};
  std::string op, in_path, out_path, backend_name = "cpu";
  int threads = 0, device = 0;
  bool list = false;
  app.add_flag("--list", list, "print every op with its inputs, outputs and attributes");
  app.add_option("--op", op, "op name (see --list)");
  app.add_option("--in", in_path, "input safetensors: tensors named by field, attributes in __metadata__");
  app.add_option("--out", out_path, "output safetensors");
  app.add_option("--backend", backend_name, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", threads, "CPU threads (0: K3_THREADS or all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--device", device, "CUDA device ordinal")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  if (list) {
    print_ops();
    return 0;
  }
  if (op.empty() || in_path.empty() || out_path.empty()) return fail("--op, --in and --out are required (or --list)");
  if (!k3::find_op(op)) {
    std::string names;
    for (const auto& info : k3::op_infos()) names += (names.empty() ? "" : ", ") + info.name;
    return fail("unknown op '" + op + "' (ops: " + names + ")");
  }

  try {
    std::unique_ptr<k3::Backend> backend;
    if (backend_name == "cpu") {
      backend = k3::make_cpu_backend({.threads = threads});
    } else {
      std::string why;
      backend = k3::make_cuda_backend(device, &why);
      if (!backend) return fail("cuda backend unavailable: " + why);
    }
    auto file = k3::SafetensorsFile::open(in_path);
    if (!file) return fail(file.status().to_string());
    std::map<std::string, k3::Tensor> inputs;
    for (const auto& entry : file->entries()) {
      auto t = file->tensor(entry.name);
      if (!t) return fail(t.status().to_string());
      inputs[entry.name] = *t;
    }
    std::map<std::string, k3::Tensor> outputs;
    if (auto s = k3::run_named_op(*backend, op, inputs, file->metadata(), &outputs); !s) return fail(s.to_string());
    std::vector<std::pair<std::string, k3::Tensor>> tensors(outputs.begin(), outputs.end());
    if (auto s = k3::write_safetensors(out_path, tensors, {{"op", op}, {"backend", backend->name()}}); !s)
      return fail(s.to_string());
    for (const auto& [name, t] : outputs)
      std::printf("%s %s %s\n", name.c_str(), k3::dtype_name(t.dtype()), k3::shape_str(t.shape()).c_str());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
