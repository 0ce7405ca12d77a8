// llmc/run/memory_plan.cpp: the memory plan of a run (llmc/run/memory_plan.h): the model's counted construction, the
// optimizer's state sizes over this rank's elements and the cuBLASLt workspace, arranged as the rows --dry-run prints.
#include "llmc/run/memory_plan.h"

#include <algorithm>

#include "llmc/core/common.h"
#include "llmc/distributed/zero.h"
#include "llmc/model/model.h"
#include "llmc/precision/gemm.h"
#include "llmc/run/cli.h"

namespace llmc {

size_t MemoryPlan::total() const {
  size_t bytes = 0;
  for (const Row& r : rows) bytes += r.bytes;
  return bytes;
}

size_t MemoryPlan::bytes(const std::string& row_name) const {
  for (const Row& r : rows)
    if (row_name == r.name) return r.bytes;
  throw_error("internal error: the memory plan has no row '%s'", row_name.c_str());
}

MemoryPlan plan_memory(const RunConfig& cfg, int world_size) {
  const TrainConfig& t = cfg.train;
  const ModelMemory model = plan_model_memory(cfg.model, t.micro_batch, t.seq_len, t.recompute, cfg.precision);
  const ParamTable table = build_param_table(cfg.model);

  MemoryPlan plan;
  plan.world_size = world_size;
  plan.sharded = world_size > 1 && cfg.parallel.zero_stage == 1;
  // As ZeroAdamW hands AdamW its ranges: this rank's pieces of the shard layout under ZeRO-1, else the whole table
  // (every rank owns as many elements: equal pieces and the replicated tail).
  plan.optimizer_elements = table.total_elements;
  if (plan.sharded) {
    const ShardLayout layout = make_shard_layout(table, world_size);
    plan.optimizer_elements = 0;
    for (int rank = 0; rank < world_size; rank++)
      plan.optimizer_elements = std::max(plan.optimizer_elements, layout.owned_elements(rank));
  }
  const size_t n = plan.optimizer_elements;
  const StateFormat& format = cfg.optimizer.state_format;
  const PrecisionMemory& p = model.precision;
  const char* shard = plan.sharded ? ", this rank's ZeRO-1 shard" : "";
  const bool quantized = p.total() > 0;

  plan.rows.push_back({"weights", "bf16 working copy of the parameter table", model.weights});
  plan.rows.push_back({"master weights", strformat("fp32%s", shard), n * sizeof(float)});
  plan.rows.push_back({"gradients", "fp32, the whole table", model.gradients});
  plan.rows.push_back({"optimizer states", strformat("AdamW m and v, optimizer.state_format %s%s", format.name, shard),
                       format.m.bytes(n) + format.v.bytes(n)});
  plan.rows.push_back({"precision state",
                       quantized ? "quantised weight caches, scales and amax histories of the recipe"
                                 : "none (no quantised linear)",
                       p.weight_caches + p.scaling});
  // The model's own saved buffers: BF16, and under nonlinear_fp8 the FP8 copies of the norm / activation inputs.
  const char* model_saved = cfg.precision.nonlinear_fp8 ? "bf16 and fp8 1x16 norm / activation inputs" : "bf16";
  plan.rows.push_back({"saved activations",
                       p.saved_inputs > 0
                           ? strformat("for backward at %d x %d tokens (recompute %d): %s %s + quantised linear "
                                       "inputs %s", t.micro_batch, t.seq_len, t.recompute, model_saved,
                                       format_gib(model.activation(ActivationUse::Saved)).c_str(),
                                       format_gib(p.saved_inputs).c_str())
                       : cfg.precision.nonlinear_fp8
                           ? strformat("for backward at %d x %d tokens (recompute %d): %s", t.micro_batch, t.seq_len,
                                       t.recompute, model_saved)
                           : strformat("for backward at %d x %d tokens (recompute %d)", t.micro_batch, t.seq_len,
                                       t.recompute),
                       model.activation(ActivationUse::Saved) + p.saved_inputs});
  plan.rows.push_back({"logits and losses", "bf16 logits (dlogits in backward), fp32 per-token losses",
                       model.activation(ActivationUse::Logits)});
  plan.rows.push_back({"transient buffers",
                       quantized ? strformat("unsaved forward outputs, backward gradients, reduction and attention "
                                             "scratch, token ids; quantised operands %s",
                                             format_gib(p.scratch).c_str())
                                 : "unsaved forward outputs, backward gradients, reduction and attention scratch, "
                                   "token ids",
                       model.activation(ActivationUse::Working) + p.scratch});
  plan.rows.push_back({"cuBLASLt workspace", "shared by every GEMM", kGemmWorkspaceBytes});
  return plan;
}

std::string format_gib(size_t bytes) { return strformat("%.2f GiB", static_cast<double>(bytes) / 1073741824.0); }

std::string format_memory_plan(const MemoryPlan& plan, const std::string& indent) {
  size_t width = 0;
  for (const MemoryPlan::Row& r : plan.rows) width = std::max(width, std::string(r.name).size());
  auto line = [&](const char* name, size_t bytes, const std::string& detail) {
    return strformat("%s%-*s %10s  %18s B%s\n", indent.c_str(), static_cast<int>(width), name,
                     format_gib(bytes).c_str(), with_thousands(bytes).c_str(),
                     detail.empty() ? "" : ("  " + detail).c_str());
  };
  std::string out;
  for (const MemoryPlan::Row& r : plan.rows) out += line(r.name, r.bytes, r.detail);
  out += line("total", plan.total(),
              plan.world_size > 1 ? strformat("per GPU, each of %d ranks", plan.world_size) : "on one GPU");
  return out;
}

}  // namespace llmc
