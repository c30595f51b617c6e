// Ops by name over named tensors: the one place that maps an op name to its params struct, its
// input/output tensor names (the ops.h field names), dtypes and attributes. Used by the k3-op tool
// and by backend-vs-backend test harnesses.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/core/tensor.h"
#include "kernels/backend.h"

namespace k3 {

// Where a tensor field lives on the backend: the compute dtype (CPU F32, CUDA BF16), always F32
// (state, gates, softmax statistics, router scores), or I32 indices.
enum class OpFieldKind { Act, F32, I32 };

struct OpFieldInfo {
  std::string name;
  OpFieldKind kind = OpFieldKind::Act;
  bool optional = false;  // inputs only
  bool inout = false;     // read as input, written back as an output of the same name
};

struct OpAttrInfo {
  std::string name;
  std::string default_value;  // empty: required (or derived from the inputs, see `note`)
  std::string note;
};

struct OpInfo {
  std::string name;
  std::string summary;                // one line
  std::vector<OpFieldInfo> inputs;    // "candidates.N" stands for candidates.0, candidates.1, ...
  std::vector<OpFieldInfo> outputs;
  std::vector<OpAttrInfo> attrs;
};

// Every op, in ops.h order.
const std::vector<OpInfo>& op_infos();
const OpInfo* find_op(const std::string& name);

// Runs `op` on host tensors `inputs` (any float dtype for float fields, I32 for indices) with
// string attributes, on `backend`: uploads inputs, allocates outputs (shapes derived from inputs +
// attrs), runs, downloads. `outputs` receives every output field and the updated value of every
// in/out tensor, as host F32 (I32 for indices). Unknown op, unknown/missing input, unknown or
// malformed attribute and any op error come back as a Status naming it; `outputs` is then untouched.
Status run_named_op(Backend& backend, const std::string& op, const std::map<std::string, Tensor>& inputs,
                    const std::map<std::string, std::string>& attrs, std::map<std::string, Tensor>* outputs);

}  // namespace k3
