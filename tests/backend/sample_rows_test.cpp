// CpuBackend::sample_rows() against one sample() call per row: random logits with mixed settings
// (greedy, temperature + top_p / top_k / min_p, repetition penalty, logit bias, a token mask,
// log-probabilities), the same tokens and log-probabilities bit for bit; refusals name the row
// and write nothing.
#include "backend/cpu_backend.hpp"
#include "core/status.hpp"
#include "sample_rows_cases.hpp"
#include "support/catch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace ep::backend;
using ep::format::GgmlType;

namespace {

uint32_t bits(float f) {
  uint32_t b = 0;
  std::memcpy(&b, &f, 4);
  return b;
}

Tensor row_of(const ep::test::SampleCase &c) {
  return Tensor::make(const_cast<float *>(c.logits.data()), GgmlType::f32, Device::cpu, {static_cast<int64_t>(c.logits.size())});
}

}  // namespace

TEST_CASE("sample_rows: every row as sample() draws it alone, bit for bit", "[sampling]") {
  CpuBackend cpu;
  const int64_t vocab = 32000;
  const std::vector<ep::test::SampleCase> cases = ep::test::sample_cases(vocab, 40, 41);
  const size_t n = cases.size();
  std::vector<int32_t> want(n);
  std::vector<TokenLogprobs> want_lp(n), got_lp(n);
  std::vector<SampleRow> rows(n);
  for (size_t i = 0; i < n; ++i) {
    const ep::test::SampleCase &c = cases[i];
    want_lp[i] = ep::test::poisoned_logprobs(c.top_n);
    want[i] = cpu.sample(row_of(c), c.params, c.counter, c.top_n >= 0 ? &want_lp[i] : nullptr);
    got_lp[i] = ep::test::poisoned_logprobs(c.top_n);
    rows[i] = SampleRow{row_of(c), &c.params, c.counter, c.top_n >= 0 ? &got_lp[i] : nullptr};
  }
  std::vector<int32_t> got(n, -7);
  cpu.sample_rows(rows, got);
  int not_greedy = 0, masked_out = 0;
  for (size_t i = 0; i < n; ++i) {
    const ep::test::SampleCase &c = cases[i];
    INFO("row " << i << " kind " << c.kind);
    CHECK(got[i] == want[i]);
    const auto argmax = static_cast<int32_t>(std::max_element(c.logits.begin(), c.logits.end()) - c.logits.begin());
    not_greedy += got[i] != argmax;
    if (!c.mask.empty())
      masked_out += !(static_cast<size_t>(got[i]) / 32 < c.mask.size() && (c.mask[static_cast<size_t>(got[i]) / 32] >> (got[i] % 32) & 1));
    if (c.top_n < 0) continue;
    CHECK(bits(got_lp[i].logprob) == bits(want_lp[i].logprob));
    CHECK(std::isfinite(got_lp[i].logprob));
    REQUIRE(got_lp[i].top_ids.size() == static_cast<size_t>(c.top_n));
    CHECK(got_lp[i].top_ids == want_lp[i].top_ids);
    REQUIRE(got_lp[i].top_logprobs.size() == want_lp[i].top_logprobs.size());
    for (size_t j = 0; j < got_lp[i].top_logprobs.size(); ++j) CHECK(bits(got_lp[i].top_logprobs[j]) == bits(want_lp[i].top_logprobs[j]));
  }
  // The cases do what they are for: most rows leave greedy's token, none leaves its mask.
  CHECK(not_greedy >= static_cast<int>(n / 2));
  CHECK(masked_out == 0);
}

TEST_CASE("sample_rows: a refused row is named and nothing is written", "[sampling]") {
  CpuBackend cpu;
  const int64_t vocab = 4096;
  const std::vector<ep::test::SampleCase> cases = ep::test::sample_cases(vocab, 3, 9);
  std::vector<SamplingParams> params;
  for (const auto &c : cases) params.push_back(c.params);
  std::vector<TokenLogprobs> lps(3);
  std::vector<SampleRow> rows(3);
  auto reset = [&] {
    for (size_t i = 0; i < 3; ++i) {
      lps[i] = ep::test::poisoned_logprobs(2);
      rows[i] = SampleRow{row_of(cases[i]), &params[i], cases[i].counter, &lps[i]};
    }
  };
  auto refused = [&](ep::Status status, const std::string &needle) {
    std::vector<int32_t> out(rows.size(), -7);
    try {
      cpu.sample_rows(rows, out);
      FAIL("sample_rows accepted the call");
    } catch (const ep::Error &e) {
      INFO(e.what());
      CHECK(e.status() == status);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
    CHECK(out == std::vector<int32_t>(rows.size(), -7));
    for (const TokenLogprobs &lp : lps) CHECK(std::isnan(lp.logprob));
  };
  reset();
  params[2].logit_bias = {{static_cast<int32_t>(vocab), 1.0f}};
  refused(ep::Status::invalid_argument, "rows[2]");
  params[2] = cases[2].params;
  reset();
  lps[1].top_n = kMaxTopLogprobs + 1;
  refused(ep::Status::invalid_argument, "rows[1]");
  reset();
  const std::vector<uint32_t> nothing(4, 0u);
  params[0].allowed = nothing;
  refused(ep::Status::invalid_argument, "rows[0]");
  params[0] = cases[0].params;
  reset();
  rows[1].logits = Tensor::make(const_cast<float *>(cases[1].logits.data()), GgmlType::f32, Device::cpu, {vocab / 2, 2});
  refused(ep::Status::shape, "rows[1]");
  reset();
  rows[2].params = nullptr;
  refused(ep::Status::invalid_argument, "rows[2]");
  reset();
  std::vector<int32_t> short_out(2, -7);
  CHECK_THROWS_AS(cpu.sample_rows(rows, short_out), ep::Error);
  // and the call with every row valid runs
  reset();
  std::vector<int32_t> out(3, -7);
  cpu.sample_rows(rows, out);
  for (int32_t t : out) CHECK((t >= 0 && t < vocab));
}
