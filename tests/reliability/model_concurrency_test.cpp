// Several sessions generating and scoring on one model from several threads give exactly the
// results of running the same sessions one after another (include/expertpack/model.h: the
// model serialises its forward passes). Run under ThreadSanitizer by scripts/dev/tsan, where any
// data race in the model, the expert store or the reader is a failure.
#include "rel_support.hpp"

#include <atomic>
#include <random>
#include <thread>

using namespace ep;

namespace {

struct Job {
  std::vector<int32_t> prompt;
  float temperature = 0.0f;
  uint64_t seed = 0;
};

struct Result {
  ep_status gen_status = EP_OK, score_status = EP_OK;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  std::string error;  // ep_last_error() of the first failure (thread-local, so taken here)
};

Result run_job(ep_model *m, const Job &j, uint32_t vocab) {
  Result r;
  r.gen_status = rel::generate(m, j.prompt, 6, r.tokens, j.temperature, j.seed);
  if (r.gen_status != EP_OK) r.error = ep_last_error();
  r.score_status = rel::score(m, j.prompt, vocab, r.logits);
  if (r.score_status != EP_OK && r.error.empty()) r.error = ep_last_error();
  return r;
}

uint32_t threads_to_use() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw >= 4 ? 4u : 3u;  // at least 3 even on 2 cores: interleaving is what is tested
}

}  // namespace

TEST_CASE("sessions on one model from several threads equal the same sessions run in turn", "[reliability][threads]") {
  test::TempDir dir;
  const std::string gguf = rel::write_small_model(dir / "m.gguf");
  const std::string packs = dir / "packs";

  // Learn the slot size, then run with every expert cached and with only top_k slots (every
  // step evicts, so concurrent sessions fight over slots).
  uint64_t slot_bytes = 0;
  uint32_t vocab = 0, top_k = 0;
  {
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(packs);
    REQUIRE(ep_model_open(&h.model, gguf.c_str(), &o) == EP_OK);
    ep_store_stats s;
    ep_store_stats_init(&s);
    REQUIRE(ep_model_store_stats(&s, h.model) == EP_OK);
    slot_bytes = s.slot_bytes;
    ep_model_properties p;
    ep_model_properties_init(&p);
    REQUIRE(ep_model_info(&p, h.model) == EP_OK);
    vocab = p.vocab_size;
    top_k = p.experts_per_token;
  }
  REQUIRE(slot_bytes > 0);

  std::mt19937 rng(2024);
  std::vector<Job> jobs;
  for (int i = 0; i < 8; ++i) {
    Job j;
    const int len = 2 + static_cast<int>(rng() % 10);
    for (int k = 0; k < len; ++k) j.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    if (i % 3 == 2) {
      j.temperature = 0.8f;
      j.seed = 100 + static_cast<uint64_t>(i);
    }
    jobs.push_back(std::move(j));
  }

  for (const uint64_t budget : {uint64_t{0}, slot_bytes * top_k}) {
    INFO("cache budget " << budget << " bytes");
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(packs, budget);
    REQUIRE(ep_model_open(&h.model, gguf.c_str(), &o) == EP_OK);

    std::vector<Result> serial;
    for (const Job &j : jobs) {
      serial.push_back(run_job(h.model, j, vocab));
      REQUIRE(serial.back().gen_status == EP_OK);
      REQUIRE(serial.back().score_status == EP_OK);
      REQUIRE(serial.back().tokens.size() == 6);
    }

    // Every thread runs every job, in its own order: many sessions interleave.
    const uint32_t n_threads = threads_to_use();
    std::vector<std::vector<std::pair<size_t, Result>>> got(n_threads);
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < n_threads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<size_t> order;
        for (size_t i = 0; i < jobs.size(); ++i) order.push_back(i);
        std::shuffle(order.begin(), order.end(), std::mt19937(77 + t));
        for (size_t i : order) got[t].emplace_back(i, run_job(h.model, jobs[i], vocab));
      });
    }
    for (auto &th : threads) th.join();

    size_t compared = 0;
    for (uint32_t t = 0; t < n_threads; ++t) {
      for (const auto &[i, r] : got[t]) {
        INFO("thread " << t << " job " << i << (r.error.empty() ? "" : ": ") << r.error);
        CHECK(r.gen_status == EP_OK);
        CHECK(r.score_status == EP_OK);
        CHECK(r.tokens == serial[i].tokens);
        CHECK(rel::same_bits(r.logits, serial[i].logits));
        ++compared;
      }
    }
    CHECK(compared == n_threads * jobs.size());

    ep_store_stats s;
    ep_store_stats_init(&s);
    REQUIRE(ep_model_store_stats(&s, h.model) == EP_OK);
    CHECK(s.io_errors == 0);
    if (budget) {
      CHECK(s.cache_slots == top_k);
      CHECK(s.cache_evictions > 0);
    }
  }
}

TEST_CASE("several models in parallel, each used by two threads", "[reliability][threads]") {
  test::TempDir dir;
  const std::string packs = dir / "packs";
  const std::string a = rel::write_small_model(dir / "a.gguf", 21);
  const std::string b = rel::write_small_model(dir / "b.gguf", 22);
  const std::vector<int32_t> prompt = {5, 17, 42, 8};
  std::vector<int32_t> want_a, want_b;
  {
    rel::ModelHandle ha, hb;
    const ep_model_options o = rel::options_in(packs);
    REQUIRE(ep_model_open(&ha.model, a.c_str(), &o) == EP_OK);
    REQUIRE(ep_model_open(&hb.model, b.c_str(), &o) == EP_OK);
    REQUIRE(rel::generate(ha.model, prompt, 8, want_a) == EP_OK);
    REQUIRE(rel::generate(hb.model, prompt, 8, want_b) == EP_OK);
  }
  // The packs exist now: opening in parallel only reads them.
  std::atomic<int> mismatches{0}, errors{0};
  std::vector<std::thread> threads;
  for (int m = 0; m < 2; ++m) {
    threads.emplace_back([&, m] {
      rel::ModelHandle h;
      const ep_model_options o = rel::options_in(packs);
      if (ep_model_open(&h.model, (m ? b : a).c_str(), &o) != EP_OK) {
        ++errors;
        return;
      }
      std::vector<std::thread> inner;
      for (int t = 0; t < 2; ++t) {
        inner.emplace_back([&] {
          for (int i = 0; i < 3; ++i) {
            std::vector<int32_t> got;
            if (rel::generate(h.model, prompt, 8, got) != EP_OK) ++errors;
            else if (got != (m ? want_b : want_a)) ++mismatches;
          }
        });
      }
      for (auto &t : inner) t.join();
    });
  }
  for (auto &t : threads) t.join();
  CHECK(errors == 0);
  CHECK(mismatches == 0);
  CHECK(want_a != want_b);  // two different models: the comparison can tell them apart
}
