// The sampling extras on the GPU (repetition penalty over a token window, min_p, logit bias) pick
// exactly the CPU reference's token, its log-probabilities and alternatives agree with the CPU's,
// and the logits are left untouched. sample_rows (every row of a batched step in one launch) gives
// each row's single-row sample(), bit for bit, and the CPU's tokens.
#include "backend/cpu_backend.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "core/status.hpp"
#include "backend/sample_rows_cases.hpp"
#include "support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace ep::backend;
using ep::backend::cuda::CudaBackend;
using ep::format::GgmlType;

TEST_CASE("sampling extras on the GPU pick the CPU's token", "[gpu][sampling]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(77);
  const int64_t n = 129280;  // DeepSeek-V4 vocabulary
  std::vector<float> logits(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (float &v : logits) v = u(rng);
  // recent tokens: the current top tokens (so the penalty matters), repeats and out-of-range ids
  std::vector<int32_t> recent;
  for (int64_t i = 0; i < n; ++i)
    if (logits[static_cast<size_t>(i)] > 7.9f) recent.push_back(static_cast<int32_t>(i));
  recent.push_back(recent.front());
  recent.push_back(-3);
  recent.push_back(static_cast<int32_t>(n + 5));
  for (int i = 0; i < 50; ++i) recent.push_back(static_cast<int32_t>(rng() % n));
  void *dev = gpu.allocate(static_cast<uint64_t>(n) * 4);
  gpu.upload(dev, logits.data(), static_cast<uint64_t>(n) * 4);
  const Tensor lc = Tensor::make(logits.data(), GgmlType::f32, Device::cpu, {n});
  const Tensor lg = Tensor::make(dev, GgmlType::f32, Device::cuda, {n});
  std::vector<SamplingParams> params;
  for (float penalty : {1.0f, 1.3f, 3.0f})
    for (float min_p : {0.0f, 0.05f, 0.5f})
      for (float temp : {0.0f, 0.8f, 1.5f}) {
        SamplingParams p;
        p.temperature = temp;
        p.top_k = temp > 1.0f ? 200 : 0;
        p.top_p = temp > 1.0f ? 0.9f : 1.0f;
        p.seed = 9;
        p.min_p = min_p;
        p.repetition_penalty = penalty;
        p.penalty_tokens = recent;
        params.push_back(p);
      }
  int mismatches = 0, total = 0, greedy_changed = 0;
  const int32_t plain_greedy = cpu.sample(lc, SamplingParams{}, 0);
  for (const auto &p : params)
    for (uint64_t c = 0; c < 8; ++c) {
      const int32_t a = cpu.sample(lc, p, c), b = gpu.sample(lg, p, c);
      mismatches += a != b;
      ++total;
      if (p.temperature == 0.0f && p.repetition_penalty > 1.0f) greedy_changed += a != plain_greedy;
    }
  INFO(mismatches << " of " << total << " draws differ");
  CHECK(mismatches == 0);
  CHECK(greedy_changed > 0);  // the penalty moved greedy off a recent token
  std::vector<float> back(static_cast<size_t>(n));
  gpu.download(back.data(), dev, static_cast<uint64_t>(n) * 4);
  CHECK(back == logits);
  gpu.deallocate(dev);
}

TEST_CASE("the GPU sampler's log-probabilities and alternatives equal the CPU's, with a logit bias", "[gpu][sampling]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(78);
  const int64_t n = 129280;  // DeepSeek-V4 vocabulary
  std::vector<float> logits(static_cast<size_t>(n));
  std::normal_distribution<float> g(0.0f, 4.0f);
  for (float &v : logits) v = g(rng);
  void *dev = gpu.allocate(static_cast<uint64_t>(n) * 4);
  gpu.upload(dev, logits.data(), static_cast<uint64_t>(n) * 4);
  const Tensor lc = Tensor::make(logits.data(), GgmlType::f32, Device::cpu, {n});
  const Tensor lg = Tensor::make(dev, GgmlType::f32, Device::cuda, {n});
  const int32_t argmax = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  int compared = 0;
  for (int32_t top_n : {0, 1, 5, 20})
    for (float temp : {0.0f, 0.9f})
      for (int bias_case = 0; bias_case < 3; ++bias_case) {
        SamplingParams p;
        p.temperature = temp;
        p.top_p = temp > 0.0f ? 0.9f : 1.0f;
        p.seed = 5;
        if (bias_case == 1) p.logit_bias = {{17, 100.0f}};                      // forces token 17
        if (bias_case == 2) p.logit_bias = {{argmax, -100.0f}, {3, 2.5f}};      // forbids the top token
        for (uint64_t c = 0; c < 4; ++c) {
          TokenLogprobs a, b;
          a.top_n = b.top_n = top_n;
          const int32_t ta = cpu.sample(lc, p, c, &a), tb = gpu.sample(lg, p, c, &b);
          INFO("top_n " << top_n << " temperature " << temp << " bias case " << bias_case << " draw " << c);
          REQUIRE(ta == tb);
          if (bias_case == 1) CHECK(tb == 17);
          if (bias_case == 2) CHECK(tb != argmax);
          CHECK(std::fabs(a.logprob - b.logprob) < 1e-5f);
          REQUIRE(b.top_ids.size() == static_cast<size_t>(top_n));
          CHECK(a.top_ids == b.top_ids);
          for (int32_t i = 0; i < top_n; ++i) CHECK(std::fabs(a.top_logprobs[i] - b.top_logprobs[i]) < 1e-5f);
          if (top_n > 0) CHECK(b.top_ids[0] == argmax);  // the raw distribution's, whatever the bias
          ++compared;
        }
      }
  CHECK(compared == 96);
  std::vector<float> back(static_cast<size_t>(n));
  gpu.download(back.data(), dev, static_cast<uint64_t>(n) * 4);
  CHECK(back == logits);
  gpu.deallocate(dev);
}

TEST_CASE("a token mask on the GPU picks the CPU's token", "[gpu][sampling]") {
  CudaBackend gpu;
  CpuBackend cpu;
  std::mt19937 rng(5);
  const int64_t n = 129280;
  std::vector<float> logits(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (float &v : logits) v = u(rng);
  // A mask of a few hundred tokens, shorter than the row (the tail is masked out), that leaves
  // out the row's maximum.
  std::vector<uint32_t> mask(static_cast<size_t>(n / 32 - 10), 0);
  for (int i = 0; i < 300; ++i) {
    const auto t = static_cast<size_t>(rng() % (mask.size() * 32));
    mask[t / 32] |= uint32_t{1} << (t % 32);
  }
  const auto top = static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (top / 32 < mask.size()) mask[top / 32] &= ~(uint32_t{1} << (top % 32));
  void *dev = gpu.allocate(static_cast<uint64_t>(n) * 4);
  gpu.upload(dev, logits.data(), static_cast<uint64_t>(n) * 4);
  const Tensor lc = Tensor::make(logits.data(), GgmlType::f32, Device::cpu, {n});
  const Tensor lg = Tensor::make(dev, GgmlType::f32, Device::cuda, {n});
  int mismatches = 0, outside = 0;
  for (float temp : {0.0f, 0.7f, 1.5f})
    for (int32_t top_k : {0, 20})
      for (uint64_t c = 0; c < 16; ++c) {
        SamplingParams p;
        p.temperature = temp;
        p.top_k = top_k;
        p.seed = 11;
        p.allowed = mask;
        const int32_t a = cpu.sample(lc, p, c), b = gpu.sample(lg, p, c);
        mismatches += a != b;
        outside += !(static_cast<size_t>(b) / 32 < mask.size() && (mask[static_cast<size_t>(b) / 32] >> (b % 32) & 1));
      }
  CHECK(mismatches == 0);
  CHECK(outside == 0);
  std::vector<float> back(static_cast<size_t>(n));
  gpu.download(back.data(), dev, static_cast<uint64_t>(n) * 4);
  CHECK(back == logits);
  gpu.deallocate(dev);
}

TEST_CASE("sample_rows on the GPU: one launch over every row gives each row's single-row sample()", "[gpu][sampling]") {
  CudaBackend gpu;
  CpuBackend cpu;
  const int64_t n = 129280;  // DeepSeek-V4 vocabulary
  const std::vector<ep::test::SampleCase> cases = ep::test::sample_cases(n, 32, 123);
  const size_t rows_n = cases.size();
  // Each row in its own allocation, as each session keeps its own last row.
  std::vector<void *> dev(rows_n);
  std::vector<Tensor> lg(rows_n);
  for (size_t i = 0; i < rows_n; ++i) {
    dev[i] = gpu.allocate(static_cast<uint64_t>(n) * 4);
    gpu.upload(dev[i], cases[i].logits.data(), static_cast<uint64_t>(n) * 4);
    lg[i] = Tensor::make(dev[i], GgmlType::f32, Device::cuda, {n});
  }
  std::vector<int32_t> single(rows_n), reference(rows_n);
  std::vector<TokenLogprobs> single_lp(rows_n), batched_lp(rows_n), cpu_lp(rows_n);
  std::vector<SampleRow> rows(rows_n);
  for (size_t i = 0; i < rows_n; ++i) {
    const ep::test::SampleCase &c = cases[i];
    single_lp[i] = ep::test::poisoned_logprobs(c.top_n);
    cpu_lp[i] = ep::test::poisoned_logprobs(c.top_n);
    batched_lp[i] = ep::test::poisoned_logprobs(c.top_n);
    single[i] = gpu.sample(lg[i], c.params, c.counter, c.top_n >= 0 ? &single_lp[i] : nullptr);
    const Tensor lc = Tensor::make(const_cast<float *>(c.logits.data()), GgmlType::f32, Device::cpu, {n});
    reference[i] = cpu.sample(lc, c.params, c.counter, c.top_n >= 0 ? &cpu_lp[i] : nullptr);
    rows[i] = SampleRow{lg[i], &c.params, c.counter, c.top_n >= 0 ? &batched_lp[i] : nullptr};
  }
  std::vector<int32_t> batched(rows_n, -7);
  gpu.sample_rows(rows, batched);
  for (size_t i = 0; i < rows_n; ++i) {
    const ep::test::SampleCase &c = cases[i];
    INFO("row " << i << " kind " << c.kind);
    CHECK(batched[i] == single[i]);
    CHECK(batched[i] == reference[i]);
    if (c.top_n < 0) continue;
    // the single-row launch's arithmetic: the same bits
    CHECK(std::memcmp(&batched_lp[i].logprob, &single_lp[i].logprob, 4) == 0);
    CHECK(std::fabs(batched_lp[i].logprob - cpu_lp[i].logprob) < 1e-5f);
    REQUIRE(batched_lp[i].top_ids.size() == static_cast<size_t>(c.top_n));
    CHECK(batched_lp[i].top_ids == single_lp[i].top_ids);
    CHECK(batched_lp[i].top_ids == cpu_lp[i].top_ids);
    REQUIRE(batched_lp[i].top_logprobs.size() == single_lp[i].top_logprobs.size());
    for (size_t j = 0; j < batched_lp[i].top_logprobs.size(); ++j)
      CHECK(std::memcmp(&batched_lp[i].top_logprobs[j], &single_lp[i].top_logprobs[j], 4) == 0);
  }
  // a refused row is named before anything runs
  std::vector<SamplingParams> bad;
  for (const auto &c : cases) bad.push_back(c.params);
  bad[3].logit_bias = {{static_cast<int32_t>(n), 1.0f}};
  for (size_t i = 0; i < rows_n; ++i) rows[i].params = &bad[i];
  std::vector<int32_t> untouched(rows_n, -7);
  try {
    gpu.sample_rows(rows, untouched);
    FAIL("sample_rows accepted a logit bias outside the row");
  } catch (const ep::Error &e) {
    CHECK(std::string(e.what()).find("rows[3]") != std::string::npos);
  }
  CHECK(untouched == std::vector<int32_t>(rows_n, -7));
  // the logits are left as they were
  for (size_t i = 0; i < rows_n; ++i) {
    std::vector<float> back(static_cast<size_t>(n));
    gpu.download(back.data(), dev[i], static_cast<uint64_t>(n) * 4);
    CHECK(back == cases[i].logits);
    gpu.deallocate(dev[i]);
  }
}
