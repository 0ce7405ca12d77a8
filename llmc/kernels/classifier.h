// llmc/kernels/classifier.h: fused softmax + cross-entropy (+ dlogits) and the device-side mean of the per-token
// losses.
// Implemented in llmc/kernels/classifier.cu; the CPU reference is in test/reference/kernels_ref.h. Conventions
// (layouts, accumulation, determinism, streams) in llmc/kernels/conventions.h.
#pragma once

#include "llmc/kernels/conventions.h"

namespace llmc {

// fused softmax + cross-entropy + dlogits; the probabilities are never written to memory.
//   logits (N, Vp) bf16 with the real vocabulary in columns [0, V); targets (N) in [0, V), or -1 = ignore.
//   losses (N) FP32: -log softmax(logits[n, :V])[targets[n]] (0 for ignored rows).
//   If write_dlogits: logits is overwritten in place with dloss * (softmax - onehot(target)); columns [V, Vp) and
//   ignored rows get 0.
void fused_classifier(bf16* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                      bool write_dlogits, cudaStream_t stream);
// total[0] (one double, device) += weight * the mean of losses over the rows whose target is >= 0 (nothing is added
// when every target is ignored). One block, a fixed summation order: deterministic. Lets the trainer sum a step's
// micro-batch losses on the device and read them once per step instead of waiting for every forward.
void accumulate_mean_loss(double* total, const float* losses, const int* targets, int N, double weight,
                          cudaStream_t stream);
// The mean of host losses over the non-ignored targets (0 when there are none), summed in FP64 (Model::mean_loss;
// the tests take it as the reference of accumulate_mean_loss).
double mean_loss_host(const float* losses, const int* targets, int N);

}  // namespace llmc
