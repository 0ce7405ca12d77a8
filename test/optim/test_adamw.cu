// test/optim/test_adamw: the AdamW update kernel (llmc/optim/adamw_update.h) against its CPU reference
// (test/reference/optim_ref.h) for every moment storage (fp32, bf16), the skipped step, the clip scale, and the one
// dispatch from a run-time StateFormat to its kernel. Each run draws a fresh seed (printed; set LLM8_TEST_SEED to
// replay).
//
// The kernel does the reference's FP32 operations in the same order without FMA contraction, IEEE division and sqrt,
// and the same round-to-nearest-even encodings, so master, m, v and params are expected to match bit for bit.
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "llmc/core/common.h"
#include "llmc/optim/adamw_update.h"
#include "llmc/optim/moment_storage.cuh"
#include "test/reference/optim_ref.h"
#include "test/support/gpu_test_util.cuh"

namespace {

using namespace gpu_test;
using llmc::bf16;

constexpr const char* kProgram = "test_adamw";

std::mt19937_64 rng_for_test() { return make_rng(kProgram); }

// Host codes of random values, as Storage stores them (the kernel and the reference read the same codes).
template <class Storage>
std::vector<typename Storage::Code> random_codes(size_t n, std::mt19937_64& rng, float lo, float hi) {
  const std::vector<float> x = random_floats(n, rng, lo, hi);
  std::vector<typename Storage::Code> codes(n);
  for (size_t i = 0; i < n; i++) codes[i] = Storage::encode(x[i]);
  return codes;
}

template <class Storage>
const llmc::StateFormat& format_of() {
  return Storage::kFormat == llmc::StateFormat::Id::FP32 ? llmc::StateFormat::fp32() : llmc::StateFormat::bf16();
}

template <class Storage>
class AdamWKernel : public ::testing::Test {};
using Storages = ::testing::Types<llmc::Fp32Moments, llmc::Bf16Moments>;
TYPED_TEST_SUITE(AdamWKernel, Storages);

struct KernelCase {
  size_t n;
  int t;
  bool misaligned;  // offset every pointer by one element: the scalar kernel
};

// The kernel (through the typed launcher, and through the StateFormat dispatch on a copy) against the reference.
TYPED_TEST(AdamWKernel, MatchesReference) {
  using Storage = TypeParam;
  using Code = typename Storage::Code;
  const KernelCase cases[] = {{1, 1, false},    {3, 2, false},    {4, 1, false},
                              {1001, 10, false}, {1001, 10, true}, {(size_t{1} << 20) + 3, 1000, false},
                              {(size_t{1} << 20) + 3, 3, true}};
  for (const KernelCase& p : cases) {
    SCOPED_TRACE(llmc::strformat("n %zu t %d misaligned %d", p.n, p.t, p.misaligned));
    auto rng = rng_for_test();
    const size_t n = p.n, off = p.misaligned ? 1 : 0;
    std::vector<float> master = random_floats(n, rng, -1, 1), grads = random_floats(n, rng, -0.1f, 0.1f);
    std::vector<Code> m = random_codes<Storage>(n, rng, -0.01f, 0.01f), v = random_codes<Storage>(n, rng, 0, 1e-4f);
    const float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.7f;

    // Two copies on the device: one for the typed launcher, one for the StateFormat dispatch.
    struct Run {
      DeviceBuffer<float> master, grads;
      DeviceBuffer<Code> m, v;
      DeviceBuffer<bf16> params;
      explicit Run(size_t count) : master(count), grads(count), m(count), v(count), params(count) {}
    };
    auto upload = [&](Run& r) {
      CUDA_CHECK(cudaMemcpy(r.master.ptr + off, master.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(r.grads.ptr + off, grads.data(), n * sizeof(float), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(r.m.ptr + off, m.data(), n * sizeof(Code), cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(r.v.ptr + off, v.data(), n * sizeof(Code), cudaMemcpyHostToDevice));
      r.params.poison();
    };
    Run typed(n + off), dispatched(n + off);
    upload(typed);
    upload(dispatched);
    DeviceBuffer<float> d_scale(std::vector<float>{grad_scale});
    llmc::adamw_update(typed.master.ptr + off, typed.params.ptr + off, typed.grads.ptr + off, typed.m.ptr + off,
                       typed.v.ptr + off, n, lr, beta1, beta2, eps, wd, p.t, d_scale.ptr, 0);
    llmc::adamw_update(format_of<Storage>(), dispatched.master.ptr + off, dispatched.params.ptr + off,
                       dispatched.grads.ptr + off, dispatched.m.ptr + off, dispatched.v.ptr + off, n, lr, beta1,
                       beta2, eps, wd, p.t, d_scale.ptr, 0);
    CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<float> ref_params(n);
    llmc::adamw_update_cpu<Storage>(master.data(), ref_params.data(), grads.data(), m.data(), v.data(), n, lr, beta1,
                                    beta2, eps, wd, p.t, grad_scale);
    for (Run* r : {&typed, &dispatched}) {
      const char* which = r == &typed ? "typed launcher" : "StateFormat dispatch";
      SCOPED_TRACE(which);
      auto tail = [&](const auto& all) { return std::vector<typename std::decay_t<decltype(all)>::value_type>(
                                             all.begin() + static_cast<long>(off), all.end()); };
      EXPECT_TRUE(bitwise_equal("master", tail(r->master.download()), master));
      EXPECT_TRUE(bitwise_equal("m", tail(r->m.download()), m));
      EXPECT_TRUE(bitwise_equal("v", tail(r->v.download()), v));
      EXPECT_TRUE(within("params = bf16_rn(master)", to_float(tail(r->params.download())), ref_params,
                         std::vector<double>(n, 0.0)));
    }
  }
}

// The divergence guard: with grad_scale = NaN (a non-finite gradient norm) AdamW changes nothing at all, in the
// kernel and in the reference.
TYPED_TEST(AdamWKernel, NonFiniteGradScaleLeavesEverythingUnchanged) {
  using Storage = TypeParam;
  using Code = typename Storage::Code;
  auto rng = rng_for_test();
  const size_t n = 4099;  // vectorised body and scalar tail
  const std::vector<float> master = random_floats(n, rng, -1, 1), grads = random_floats(n, rng, -1, 1);
  const std::vector<Code> m = random_codes<Storage>(n, rng, -1, 1), v = random_codes<Storage>(n, rng, 0, 1);
  for (float scale : {NAN, INFINITY}) {
    DeviceBuffer<float> d_master(master), d_grads(grads), d_scale(std::vector<float>{scale});
    DeviceBuffer<Code> d_m(m), d_v(v);
    DeviceBuffer<bf16> d_params(n);
    CUDA_CHECK(cudaMemset(d_params.ptr, 0x3c, n * sizeof(bf16)));
    const std::vector<bf16> params_before = d_params.download();
    llmc::adamw_update(d_master.ptr, d_params.ptr, d_grads.ptr, d_m.ptr, d_v.ptr, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                       3, d_scale.ptr, 0);
    EXPECT_TRUE(bitwise_equal("master", d_master.download(), master)) << scale;
    EXPECT_TRUE(bitwise_equal("m", d_m.download(), m)) << scale;
    EXPECT_TRUE(bitwise_equal("v", d_v.download(), v)) << scale;
    EXPECT_TRUE(bitwise_equal("params", d_params.download(), params_before)) << scale;

    std::vector<float> ref_master = master, ref_params(n, -7.0f);
    std::vector<Code> ref_m = m, ref_v = v;
    llmc::adamw_update_cpu<Storage>(ref_master.data(), ref_params.data(), grads.data(), ref_m.data(), ref_v.data(),
                                    n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, scale);
    EXPECT_TRUE(bitwise_equal("reference master", ref_master, master)) << scale;
    EXPECT_TRUE(bitwise_equal("reference m", ref_m, m)) << scale;
    EXPECT_TRUE(bitwise_equal("reference params", ref_params, std::vector<float>(n, -7.0f))) << scale;
  }
}

// BF16 moments are the FP32 update's moments rounded to nearest even: one step from the same (bf16-representable)
// state gives m_bf16 = bf16_rn(m_fp32) and v_bf16 = bf16_rn(v_fp32), and the same master (the update reads the same
// values), which a truncating or a non-rounding storage would fail.
TEST(AdamWBf16, MomentsAreTheRoundedFp32Moments) {
  auto rng = rng_for_test();
  const size_t n = 100003;
  const std::vector<float> master = random_floats(n, rng, -1, 1), grads = random_floats(n, rng, -0.1f, 0.1f);
  const std::vector<bf16> m16 = random_codes<llmc::Bf16Moments>(n, rng, -0.01f, 0.01f),
                          v16 = random_codes<llmc::Bf16Moments>(n, rng, 0, 1e-4f);
  DeviceBuffer<float> d_scale(std::vector<float>{1.0f}), a_master(master), b_master(master), d_grads(grads);
  DeviceBuffer<float> a_m(to_float(m16)), a_v(to_float(v16));
  DeviceBuffer<bf16> b_m(m16), b_v(v16), a_params(n), b_params(n);
  llmc::adamw_update(a_master.ptr, a_params.ptr, d_grads.ptr, a_m.ptr, a_v.ptr, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                     d_scale.ptr, 0);
  llmc::adamw_update(b_master.ptr, b_params.ptr, d_grads.ptr, b_m.ptr, b_v.ptr, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                     d_scale.ptr, 0);
  EXPECT_TRUE(bitwise_equal("master", b_master.download(), a_master.download()));
  EXPECT_TRUE(bitwise_equal("params", b_params.download(), a_params.download()));
  std::vector<float> rounded_m = a_m.download(), rounded_v = a_v.download();
  for (float& x : rounded_m) x = round_bf16(x);
  for (float& x : rounded_v) x = round_bf16(x);
  EXPECT_TRUE(bitwise_equal("m", to_float(b_m.download()), rounded_m));
  EXPECT_TRUE(bitwise_equal("v", to_float(b_v.download()), rounded_v));
}

TEST(ClipScale, FollowsTheDocumentedRule) {
  struct Case {
    float norm, clip, want;
  };
  const Case cases[] = {{2.0f, 1.0f, 0.5f}, {0.5f, 1.0f, 1.0f}, {1.0f, 1.0f, 1.0f}, {3.0f, 0.0f, 1.0f},
                        {3.0f, -1.0f, 1.0f}};
  for (const Case& c : cases) {
    DeviceBuffer<float> d_norm(std::vector<float>{c.norm}), d_scale(1);
    d_scale.poison();
    llmc::clip_scale_from_norm(d_scale.ptr, d_norm.ptr, c.clip, 0);
    EXPECT_EQ(d_scale.download()[0], c.want) << "norm " << c.norm << " clip " << c.clip;
  }
  // A non-finite norm marks the step as skipped (NaN), with or without clipping.
  for (float norm : {INFINITY, NAN})
    for (float clip : {1.0f, 0.0f}) {
      DeviceBuffer<float> d_norm(std::vector<float>{norm}), d_scale(std::vector<float>{1.0f});
      llmc::clip_scale_from_norm(d_scale.ptr, d_norm.ptr, clip, 0);
      EXPECT_TRUE(std::isnan(d_scale.download()[0])) << "norm " << norm << " clip " << clip;
    }
}

}  // namespace
