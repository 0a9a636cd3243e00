// ep-server end to end on the trained demo model (models/demo-kjv.gguf, DeepSeek-V4, CPU): the
// OpenAI endpoints against the C API's own generation, continuous batching (concurrent greedy
// requests answer as they do alone, and steps run several sequences), conversations that
// continue the kept state of their previous turn (fewer expert bytes read), the prefix cache
// (hits, eviction, concurrent requests, each answering as without it), and robustness:
// bad requests, disconnecting clients, a busy model, shutdown while a request runs. Every
// server is stopped with SIGTERM and must exit 0 (under ASan/LSan: no leak).
#include "grammar/schema_validator.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "server_process.hpp"

#include "reasoning.hpp"
#include "testkit/kimi_gguf.hpp"

#include <expertpack/expertpack.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::string kModel = EP_DEMO_MODEL;

struct Reply {
  int status = 0;
  json body;
  httplib::Headers headers;
  std::string header(const std::string &k) const {
    const auto it = headers.find(k);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct StreamReply {
  int status = 0;
  std::string content_type, raw;
  std::vector<std::string> data;  // each event's data, in order
};

class Http {
 public:
  explicit Http(int port, std::string key = {}) : cli_("127.0.0.1", port), key_(std::move(key)) {
    cli_.set_read_timeout(600, 0);
    cli_.set_write_timeout(60, 0);
  }
  void set_read_timeout(std::chrono::milliseconds t) {
    cli_.set_read_timeout(static_cast<time_t>(t.count() / 1000), static_cast<time_t>((t.count() % 1000) * 1000));
  }

  Reply get(const std::string &path) { return reply(cli_.Get(path.c_str(), headers())); }
  Reply post(const std::string &path, const json &body) { return post_raw(path, body.dump(), "application/json"); }
  Reply post_raw(const std::string &path, const std::string &body, const std::string &type) {
    return reply(cli_.Post(path.c_str(), headers(), body, type.c_str()));
  }

  /// A streamed request; with @p stop_after > 0 the client closes the connection after that many
  /// events, and when @p keep_going says no (asked, with the count of events so far, whenever
  /// bytes arrive).
  StreamReply stream(const std::string &path, json body, size_t stop_after = 0,
                     const std::function<bool(size_t events)> &keep_going = {}) {
    body["stream"] = true;
    StreamReply out;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = headers();
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string pending;
    req.content_receiver = [&](const char *data, size_t n, uint64_t, uint64_t) {
      out.raw.append(data, n);
      pending.append(data, n);
      for (size_t at; (at = pending.find("\n\n")) != std::string::npos;) {
        const std::string event = pending.substr(0, at);
        pending.erase(0, at + 2);
        if (event.rfind("data: ", 0) == 0) out.data.push_back(event.substr(6));
        else out.data.push_back("<not a data event: " + event + ">");
      }
      return (stop_after == 0 || out.data.size() < stop_after) && (!keep_going || keep_going(out.data.size()));
    };
    const httplib::Result r = cli_.send(req);
    if (r) {
      out.status = r->status;
      out.content_type = r->get_header_value("Content-Type");
    }
    return out;
  }

 private:
  httplib::Headers headers() const {
    httplib::Headers h;
    if (!key_.empty()) h.emplace("Authorization", "Bearer " + key_);
    return h;
  }
  static Reply reply(const httplib::Result &r) {
    Reply out;
    if (!r) return out;
    out.status = r->status;
    out.headers = r->headers;
    out.body = json::parse(r->body, nullptr, false);
    if (out.body.is_discarded()) out.body = r->body;
    return out;
  }
  httplib::Client cli_;
  std::string key_;
};

/// One value of a /metrics text (-1 when the series is missing).
double metric_in(const std::string &text, const std::string &series) {
  size_t at = 0;
  while ((at = text.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + series.size() + 1));
    at += series.size();
  }
  return -1;
}

/// One value of the server's /metrics (-1 when the series is missing).
double metric(Http &http, const std::string &series) {
  const Reply r = http.get("/metrics");
  return metric_in(r.body.is_string() ? r.body.get<std::string>() : std::string(), series);
}

/// Waits until a metric reaches @p want (the scheduler updates them after its step).
bool wait_metric(Http &http, const std::string &series, double want, std::chrono::seconds timeout = 120s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (metric(http, series) >= want) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

std::vector<std::string> server_args(const ep::test::TempDir &dir, std::vector<std::string> more) {
  std::vector<std::string> a = {"--model", kModel, "--device", "cpu", "--pack-dir", dir / "packs", "--cpu-threads", "2"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

json chat_body(const std::vector<std::pair<std::string, std::string>> &messages, int max_tokens) {
  json ms = json::array();
  for (const auto &[role, content] : messages) ms.push_back({{"role", role}, {"content", content}});
  return {{"model", "demo-kjv"}, {"messages", ms}, {"temperature", 0}, {"max_tokens", max_tokens}};
}

/// The C API's own greedy answers, for comparison with the server's.
class Reference {
 public:
  Reference() {
    ep_model_options o;
    ep_model_options_init(&o);
    o.device = EP_DEVICE_CPU;
    o.resident_experts = 1;
    REQUIRE(ep_model_open(&model_, kModel.c_str(), &o) == EP_OK);
    REQUIRE(ep_tokenizer_open_model(&tok_, model_) == EP_OK);
  }
  ~Reference() {
    ep_tokenizer_close(tok_);
    ep_model_close(model_);
  }
  std::string chat(const std::vector<std::pair<std::string, std::string>> &messages, uint32_t max_tokens) {
    std::vector<ep_chat_message> ms;
    for (const auto &[role, content] : messages) ms.push_back({role.c_str(), content.c_str(), nullptr});
    return run([&](ep_session *s, const ep_generate_options *g, std::string *out) {
      return ep_generate_chat(nullptr, s, tok_, ms.data(), ms.size(), nullptr, g, append, out);
    }, max_tokens);
  }
  std::string text(const std::string &prompt, uint32_t max_tokens) {
    return run([&](ep_session *s, const ep_generate_options *g, std::string *out) {
      return ep_generate_text(nullptr, s, tok_, prompt.c_str(), g, append, out);
    }, max_tokens);
  }

 private:
  static int append(const char *piece, size_t n, void *payload) {
    static_cast<std::string *>(payload)->append(piece, n);
    return 0;
  }
  template <class F>
  std::string run(F f, uint32_t max_tokens) {
    ep_session *s = nullptr;
    REQUIRE(ep_session_open(&s, model_) == EP_OK);
    ep_generate_options g;
    ep_generate_options_init(&g);
    g.max_new_tokens = max_tokens;
    std::string out;
    REQUIRE(f(s, &g, &out) == EP_OK);
    ep_session_close(s);
    return out;
  }
  ep_model *model_ = nullptr;
  ep_tokenizer *tok_ = nullptr;
};

std::string chat_text(const Reply &r) { return r.body.at("choices").at(0).at("message").at("content").get<std::string>(); }
std::string completion_text(const Reply &r) { return r.body.at("choices").at(0).at("text").get<std::string>(); }

/// The text of a streamed answer, checking the framing of every chunk on the way.
std::string streamed_text(const StreamReply &s, bool chat, json *usage = nullptr, std::string *finish = nullptr) {
  REQUIRE(s.status == 200);
  REQUIRE(s.content_type.rfind("text/event-stream", 0) == 0);
  REQUIRE(!s.data.empty());
  CHECK(s.data.back() == "[DONE]");
  std::string text;
  for (size_t i = 0; i + 1 < s.data.size(); ++i) {
    const json c = json::parse(s.data[i]);
    INFO(s.data[i]);
    REQUIRE(c.contains("choices"));
    CHECK(c.at("object") == (chat ? "chat.completion.chunk" : "text_completion"));
    if (c.at("choices").empty()) {  // the usage chunk (stream_options.include_usage)
      if (usage) *usage = c.at("usage");
      continue;
    }
    const json &ch = c.at("choices").at(0);
    if (chat) {
      if (i == 0) CHECK(ch.at("delta").at("role") == "assistant");
      if (ch.at("delta").contains("content")) text += ch.at("delta").at("content").get<std::string>();
    } else {
      text += ch.at("text").get<std::string>();
    }
    if (!ch.at("finish_reason").is_null() && finish) *finish = ch.at("finish_reason").get<std::string>();
  }
  return text;
}

void check_error(const Reply &r, int status, const std::string &code = {}, const std::string &param = {}) {
  INFO(r.body.dump());
  CHECK(r.status == status);
  REQUIRE(r.body.is_object());
  REQUIRE(r.body.contains("error"));
  const json &e = r.body.at("error");
  CHECK(e.at("message").is_string());
  CHECK(!e.at("message").get<std::string>().empty());
  CHECK(e.at("type").is_string());
  CHECK((e.at("param").is_string() || e.at("param").is_null()));
  CHECK(e.contains("code"));
  if (!code.empty()) CHECK(e.at("code") == code);
  if (!param.empty()) CHECK(e.at("param") == param);
}

const std::vector<std::pair<std::string, std::string>> kJohn = {{"user", "John 3:16"}};

}  // namespace

TEST_CASE("ep-server: the OpenAI endpoints answer as the C API generates", "[api]") {
  ep::test::TempDir dir;
  Reference ref;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--parallel", "2"}));
  Http http(server.port());

  const Reply health = http.get("/health");
  CHECK(health.status == 200);
  CHECK(health.body.at("status") == "ok");
  const Reply models = http.get("/v1/models");
  REQUIRE(models.status == 200);
  CHECK(models.body.at("object") == "list");
  CHECK(models.body.at("data").at(0).at("id") == "demo-kjv");
  CHECK(http.get("/v1/models/demo-kjv").status == 200);
  check_error(http.get("/v1/models/other"), 404, "model_not_found");

  SECTION("chat, whole and streamed") {
    const std::string want = ref.chat(kJohn, 24);
    REQUIRE(!want.empty());
    const Reply r = http.post("/v1/chat/completions", chat_body(kJohn, 24));
    REQUIRE(r.status == 200);
    CHECK(r.body.at("object") == "chat.completion");
    CHECK(r.body.at("model") == "demo-kjv");
    CHECK(r.body.at("id").get<std::string>().rfind("chatcmpl-", 0) == 0);
    CHECK(chat_text(r) == want);
    CHECK(r.body.at("choices").at(0).at("message").at("role") == "assistant");
    const json &u = r.body.at("usage");
    CHECK(u.at("completion_tokens") == 24);
    CHECK(r.body.at("choices").at(0).at("finish_reason") == "length");
    CHECK(u.at("total_tokens").get<int>() == u.at("prompt_tokens").get<int>() + u.at("completion_tokens").get<int>());
    CHECK(u.at("prompt_tokens_details").at("cached_tokens").is_number_integer());

    json body = chat_body(kJohn, 24);
    body["stream_options"] = {{"include_usage", true}};
    json usage;
    std::string finish;
    const StreamReply s = http.stream("/v1/chat/completions", body);
    CHECK(streamed_text(s, true, &usage, &finish) == want);
    CHECK(finish == "length");
    REQUIRE(usage.is_object());
    CHECK(usage.at("completion_tokens") == 24);
    CHECK(usage.at("prompt_tokens") == u.at("prompt_tokens"));
    // Every chunk but the usage chunk carries "usage": null when usage is asked for.
    for (size_t i = 0; i + 2 < s.data.size(); ++i) CHECK(json::parse(s.data[i]).at("usage").is_null());
    // Without include_usage there is no usage chunk.
    const StreamReply plain = http.stream("/v1/chat/completions", chat_body(kJohn, 24));
    json none;
    CHECK(streamed_text(plain, true, &none) == want);
    CHECK(none.is_null());
  }

  SECTION("completions, whole and streamed, with a stop string") {
    const std::string prompt = "And God said";
    const std::string want = ref.text(prompt, 20);
    REQUIRE(want.size() > 12);
    json body = {{"model", "demo-kjv"}, {"prompt", prompt}, {"temperature", 0}, {"max_tokens", 20}};
    const Reply r = http.post("/v1/completions", body);
    REQUIRE(r.status == 200);
    CHECK(r.body.at("object") == "text_completion");
    CHECK(completion_text(r) == want);
    CHECK(streamed_text(http.stream("/v1/completions", body), false) == want);
    // A stop string from the middle of the text ends it there.
    const std::string stop = want.substr(want.size() / 2, 4);
    body["stop"] = json::array({stop});
    const Reply stopped = http.post("/v1/completions", body);
    REQUIRE(stopped.status == 200);
    CHECK(completion_text(stopped) == want.substr(0, want.find(stop)));
    CHECK(stopped.body.at("choices").at(0).at("finish_reason") == "stop");
    std::string finish;
    CHECK(streamed_text(http.stream("/v1/completions", body), false, nullptr, &finish) == want.substr(0, want.find(stop)));
    CHECK(finish == "stop");
    // A token-id prompt is taken as it is.
    const Reply ids = http.post("/v1/completions", {{"prompt", json::array({0, 5, 6, 7})}, {"max_tokens", 3}, {"temperature", 0}});
    REQUIRE(ids.status == 200);
    CHECK(ids.body.at("usage").at("prompt_tokens") == 4);
  }

  SECTION("sampling with a seed repeats; the end of the turn stops a chat") {
    json body = chat_body(kJohn, 16);
    body["temperature"] = 0.9;
    body["top_p"] = 0.95;
    body["seed"] = 1234;
    const Reply a = http.post("/v1/chat/completions", body);
    const Reply b = http.post("/v1/chat/completions", body);
    REQUIRE(a.status == 200);
    REQUIRE(b.status == 200);
    CHECK(chat_text(a) == chat_text(b));
    // The demo model ends its answers with the end-of-sentence token well within 200 tokens.
    const Reply full = http.post("/v1/chat/completions", chat_body(kJohn, 200));
    REQUIRE(full.status == 200);
    CHECK(full.body.at("choices").at(0).at("finish_reason") == "stop");
    CHECK(full.body.at("usage").at("completion_tokens").get<int>() < 200);
    CHECK(chat_text(full) == ref.chat(kJohn, 200));
  }

  SECTION("thinking on: the answer is split into reasoning_content and content") {
    json body = chat_body(kJohn, 24);
    body["thinking"] = true;
    const Reply r = http.post("/v1/chat/completions", body);
    REQUIRE(r.status == 200);
    const json &msg = r.body.at("choices").at(0).at("message");
    const int reasoning = r.body.at("usage").at("completion_tokens_details").at("reasoning_tokens").get<int>();
    CHECK(reasoning <= 24);
    if (reasoning > 0) CHECK(msg.contains("reasoning_content"));
    // One token fewer in the prompt than with thinking off: "<think>" opens, without "</think>".
    const Reply off = http.post("/v1/chat/completions", chat_body(kJohn, 1));
    CHECK(r.body.at("usage").at("prompt_tokens").get<int>() + 1 == off.body.at("usage").at("prompt_tokens").get<int>());
  }

  const std::string m = http.get("/metrics").body.get<std::string>();
  CHECK(m.find("ep_server_steps_total ") != std::string::npos);
  CHECK(m.find("ep_store_pack_read_bytes_total ") != std::string::npos);
  CHECK(m.find("ep_server_http_requests_total{endpoint=\"health\",status=\"200\"} 1\n") != std::string::npos);
  CHECK(m.find("ep_server_http_requests_total{endpoint=\"models\",status=\"404\"} 1\n") != std::string::npos);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: eight concurrent greedy requests answer as each does alone", "[batching]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--parallel", "8", "--prefix-cache-mib", "0"}));
  Http http(server.port());
  // Chats and completions of different lengths; one prompt longer than a prefill chunk, so its
  // chunks run in the same steps as the others' decoding; one runs long (ignore_eos) so the
  // others overlap it.
  std::string long_prompt;
  for (int i = 0; i < 12; ++i) long_prompt += "And the LORD spake unto Moses, saying, ";
  std::vector<std::pair<std::string, json>> requests = {
      {"/v1/chat/completions", chat_body({{"user", "John 3:16"}}, 20)},
      {"/v1/chat/completions", chat_body({{"user", "Psalms 23:1"}}, 16)},
      {"/v1/chat/completions", chat_body({{"user", "Genesis 1:1"}, {"assistant", "In the beginning"}, {"user", "Exodus 3:14"}}, 24)},
      {"/v1/completions", {{"prompt", "And God said"}, {"temperature", 0}, {"max_tokens", 18}}},
      {"/v1/completions", {{"prompt", "In the beginning"}, {"temperature", 0}, {"max_tokens", 12}}},
      {"/v1/completions", {{"prompt", long_prompt}, {"temperature", 0}, {"max_tokens", 10}}},
      {"/v1/completions", {{"prompt", "Blessed are the"}, {"temperature", 0}, {"max_tokens", 160}, {"ignore_eos", true}}},
      {"/v1/chat/completions", chat_body({{"user", "Revelation 22:21"}}, 14)},
  };
  auto answer = [](Http &h, const std::pair<std::string, json> &req) {
    const Reply r = h.post(req.first, req.second);
    REQUIRE(r.status == 200);
    return r.body.at("choices").at(0).contains("message") ? chat_text(r) : completion_text(r);
  };
  std::vector<std::string> alone;
  for (const auto &req : requests) alone.push_back(answer(http, req));
  REQUIRE(metric(http, "ep_server_steps_batched_total") == 0);  // one at a time: nothing was batched

  // The long-running request (6) first; the seven others together once it runs, so that their
  // prefills (one of them several chunks long) meet its decoding in the same steps however the
  // machine schedules the client threads.
  constexpr size_t kFirst = 6;
  std::vector<std::string> together(requests.size());
  std::vector<int> ok(requests.size(), 0);
  auto send = [&](size_t i) {
    Http h(server.port());
    const Reply r = h.post(requests[i].first, requests[i].second);
    ok[i] = r.status;
    if (r.status == 200) together[i] = r.body.at("choices").at(0).contains("message") ? chat_text(r) : completion_text(r);
  };
  std::vector<std::thread> clients;
  clients.emplace_back(send, kFirst);
  REQUIRE(wait_metric(http, "ep_server_requests_running", 1, 60s));
  std::barrier start(static_cast<std::ptrdiff_t>(requests.size() - 1));
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i == kFirst) continue;
    clients.emplace_back([&, i] {
      start.arrive_and_wait();
      send(i);
    });
  }
  for (auto &t : clients) t.join();
  const json metrics_text = http.get("/metrics").body;
  INFO("the server's log:\n" << server.log() << "\nits metrics:\n" << (metrics_text.is_string() ? metrics_text.get<std::string>() : metrics_text.dump()));
  for (size_t i = 0; i < requests.size(); ++i) {
    INFO("request " << i << ": " << requests[i].second.dump());
    CHECK(ok[i] == 200);
    CHECK(together[i] == alone[i]);
  }
  CHECK(metric(http, "ep_server_steps_batched_total") > 0);
  CHECK(metric(http, "ep_server_step_sequences_max") > 1);
  CHECK(metric(http, "ep_server_steps_mixed_total") > 0);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: ep-run's model options (host tier, prefetch, policy) apply and leave the answers unchanged", "[options]") {
  ep::test::TempDir dir;
  const std::vector<std::pair<std::string, json>> requests = {
      {"/v1/chat/completions", chat_body({{"user", "John 3:16"}}, 16)},
      {"/v1/completions", {{"prompt", "And God said"}, {"temperature", 0}, {"max_tokens", 16}}},
      {"/v1/chat/completions", chat_body({{"user", "Psalms 23:1"}}, 16)},
  };
  auto answers = [&](std::vector<std::string> args, bool tiered) {
    // A cache of a few slots: evictions (demotions) happen, and there is room to prefetch into.
    args.insert(args.end(), {"--parallel", "1", "--prefix-cache-mib", "0", "--cache-mib", "0.3"});
    ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, args));
    Http http(server.port());
    std::vector<std::string> out;
    for (const auto &req : requests) {
      const Reply r = http.post(req.first, req.second);
      REQUIRE(r.status == 200);
      out.push_back(r.body.at("choices").at(0).contains("message") ? chat_text(r) : completion_text(r));
    }
    INFO("the server's log:\n" << server.log());
    if (tiered) {
      CHECK(metric(http, "ep_store_host_slots") > 0);
      CHECK(metric(http, "ep_store_demotions_total") > 0);
      CHECK(metric(http, "ep_store_host_hits_total") > 0);
      CHECK(metric(http, "ep_store_prefetch_issued_total") > 0);
    } else {
      CHECK(metric(http, "ep_store_host_slots") == 0);
      CHECK(metric(http, "ep_store_prefetch_issued_total") == 0);
    }
    CHECK(server.stop() == 0);
    return out;
  };
  const std::vector<std::string> plain = answers({}, false);
  const std::vector<std::string> tiered = answers({"--host-cache-mib", "1", "--prefetch", "--no-overlap"}, true);
  CHECK(tiered == plain);
  const std::vector<std::string> lru = answers({"--policy", "lru"}, false);
  CHECK(lru == plain);
  // A policy that does not exist stops the server at open, naming it.
  try {
    ep::test::ServerProcess bad(EP_SERVER_EXE, server_args(dir, {"--policy", "fifo-of-doom"}), std::chrono::seconds(30));
    FAIL("ep-server started with --policy fifo-of-doom");
  } catch (const std::runtime_error &e) {
    CHECK(std::string(e.what()).find("fifo-of-doom") != std::string::npos);
  }
}

namespace {

/// A system prompt of several hundred tokens (several prefix-cache blocks of 64).
std::string long_system(const std::string &verse) {
  std::string s = "Answer with the verse asked for, in the words of the King James Version.";
  for (int i = 0; i < 8; ++i) s += " " + verse;
  return s;
}

json seeded(json body, uint64_t seed) {
  body["temperature"] = 0.9;
  body["seed"] = seed;
  return body;
}

int cached_tokens(const Reply &r) { return r.body.at("usage").at("prompt_tokens_details").at("cached_tokens").get<int>(); }

}  // namespace

TEST_CASE("ep-server: requests sharing a prefix continue its kept state and answer as without the cache", "[prefix]") {
  ep::test::TempDir dir;
  const std::string system = long_system("In the beginning God created the heaven and the earth, and the earth was without form, and void.");
  // One user's request, a second user's with the same system prompt (the prefix is kept where the
  // two part), a third's (continues it), a seeded one, and the first user's next turn. The user
  // messages are longer than a block, so that the first request's kept state (its last block
  // before the answer) is not a prefix of the others'.
  auto user = [](const std::string &verse) {
    std::string m = verse;
    for (int i = 0; i < 4; ++i) m += " Quote it in full, then the verses around it, and say which book and chapter they come from.";
    return m;
  };
  const json first = chat_body({{"system", system}, {"user", user("John 3:16")}}, 16);
  const json second = chat_body({{"system", system}, {"user", user("Psalms 23:1")}}, 16);
  const json third = chat_body({{"system", system}, {"user", user("Genesis 1:1")}}, 16);
  const json fourth = seeded(chat_body({{"system", system}, {"user", user("Exodus 3:14")}}, 16), 5);
  auto run = [&](bool cache) {
    ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--prefix-cache-mib", cache ? "64" : "0"}));
    Http http(server.port());
    std::vector<Reply> r;
    for (const json &b : {first, second, third, fourth}) {
      r.push_back(http.post("/v1/chat/completions", b));
      REQUIRE(r.back().status == 200);
    }
    json next = chat_body({{"system", system}, {"user", user("John 3:16")}, {"assistant", chat_text(r[0])}, {"user", "Psalms 23:1"}}, 16);
    r.push_back(http.post("/v1/chat/completions", seeded(next, 9)));
    REQUIRE(r.back().status == 200);
    // Streamed usage reports the cached tokens too.
    json streamed_usage;
    json body = third;
    body["stream_options"] = {{"include_usage", true}};
    const std::string streamed = streamed_text(http.stream("/v1/chat/completions", body), true, &streamed_usage);
    CHECK(streamed == chat_text(r[2]));
    // (the third request's own state is kept now: the repeat continues it, past the shared part)
    const int streamed_cached = streamed_usage.at("prompt_tokens_details").at("cached_tokens").get<int>();
    if (cache) CHECK(streamed_cached > cached_tokens(r[2]));
    else CHECK(streamed_cached == 0);
    if (cache) {
      CHECK(metric(http, "ep_server_prefix_cache_hits_total") >= 4);
      CHECK(metric(http, "ep_server_prefix_cache_misses_total") == 2);  // the first two requests
      CHECK(metric(http, "ep_server_prefix_cache_inserts_total") >= 2);
      CHECK(metric(http, "ep_server_prefix_cache_bytes") > 0);
      CHECK(metric(http, "ep_server_prefix_cache_budget_bytes") == 64.0 * 1048576);
      CHECK(metric(http, "ep_server_prefix_cache_evictions_total") == 0);
    } else {
      CHECK(metric(http, "ep_server_prefix_cache_hits_total") == 0);
      CHECK(metric(http, "ep_server_prefix_cache_entries") == 0);
    }
    CHECK(server.stop() == 0);
    return r;
  };
  const std::vector<Reply> on = run(true), off = run(false);
  for (size_t i = 0; i < on.size(); ++i) {
    INFO("request " << i);
    CHECK(chat_text(on[i]) == chat_text(off[i]));
    CHECK(cached_tokens(off[i]) == 0);
    CHECK(on[i].body.at("usage").at("prompt_tokens") == off[i].body.at("usage").at("prompt_tokens"));
    CHECK(cached_tokens(on[i]) % 64 == 0);  // whole blocks
  }
  CHECK(cached_tokens(on[0]) == 0);
  CHECK(cached_tokens(on[1]) == 0);  // the shared prefix is kept as the second request passes it
  const int shared = cached_tokens(on[2]);
  CHECK(shared >= 64 * 2);  // the system prompt's whole blocks
  CHECK(shared < on[2].body.at("usage").at("prompt_tokens").get<int>() - 64);
  CHECK(cached_tokens(on[3]) == shared);
  // The next turn continues the first request's state up to its last block before the answer.
  // (DeepSeek-V4 parts one or two tokens before the prompt's end: test "[reuse]").
  CHECK(cached_tokens(on[4]) + 2 + 63 >= on[0].body.at("usage").at("prompt_tokens").get<int>());
}

TEST_CASE("ep-server: the prefix cache evicts the least recently used state under its budget", "[prefix]") {
  ep::test::TempDir dir;
  const json a = chat_body({{"system", long_system("And God said, Let there be light: and there was light.")}, {"user", "John 3:16"}}, 12);
  const json b = chat_body({{"system", long_system("The LORD is my shepherd; I shall not want.")}, {"user", "John 3:16"}}, 12);
  // The state bytes of each prompt's kept prefix, from a cache that holds both.
  double bytes_a = 0, bytes_b = 0;
  std::string alone_a, alone_b;
  {
    ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--prefix-cache-mib", "0"}));
    Http http(server.port());
    alone_a = chat_text(http.post("/v1/chat/completions", a));
    alone_b = chat_text(http.post("/v1/chat/completions", b));
    CHECK(server.stop() == 0);
  }
  {
    ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--prefix-cache-mib", "64"}));
    Http http(server.port());
    REQUIRE(http.post("/v1/chat/completions", a).status == 200);
    bytes_a = metric(http, "ep_server_prefix_cache_bytes");
    REQUIRE(http.post("/v1/chat/completions", b).status == 200);
    bytes_b = metric(http, "ep_server_prefix_cache_bytes") - bytes_a;
    CHECK(metric(http, "ep_server_prefix_cache_entries") == 2);
    CHECK(server.stop() == 0);
  }
  REQUIRE(bytes_a > 0);
  REQUIRE(bytes_b > 0);
  // A budget for one of them: b's state pushes a's out, and a, asked again, runs from the start
  // (nothing cached) and answers as before.
  const double budget = std::max(bytes_a, bytes_b) * 1.5;
  REQUIRE(budget < bytes_a + bytes_b);
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--prefix-cache-mib", std::to_string(budget / 1048576.0)}));
  Http http(server.port());
  const Reply a1 = http.post("/v1/chat/completions", a);
  const Reply b1 = http.post("/v1/chat/completions", b);
  CHECK(metric(http, "ep_server_prefix_cache_evictions_total") == 1);
  const Reply a2 = http.post("/v1/chat/completions", a);
  CHECK(metric(http, "ep_server_prefix_cache_evictions_total") == 2);
  CHECK(metric(http, "ep_server_prefix_cache_entries") == 1);
  CHECK(metric(http, "ep_server_prefix_cache_bytes") <= budget);
  for (const Reply *r : {&a1, &b1, &a2}) REQUIRE(r->status == 200);
  CHECK(cached_tokens(a2) == 0);
  CHECK(chat_text(a1) == alone_a);
  CHECK(chat_text(b1) == alone_b);
  CHECK(chat_text(a2) == alone_a);
  // a is kept now: asked once more it continues its state.
  const Reply a3 = http.post("/v1/chat/completions", a);
  CHECK(cached_tokens(a3) > 0);
  CHECK(chat_text(a3) == alone_a);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: concurrent requests sharing a kept prefix each answer as alone", "[prefix]") {
  ep::test::TempDir dir;
  const std::string system = long_system("Blessed are the poor in spirit: for theirs is the kingdom of heaven.");
  const std::vector<std::string> verses = {"John 3:16", "Psalms 23:1", "Genesis 1:1", "Exodus 3:14"};
  std::vector<json> bodies;
  for (size_t i = 0; i < verses.size(); ++i) {
    json b = chat_body({{"system", system}, {"user", verses[i]}}, 24);
    bodies.push_back(i % 2 ? seeded(b, 40 + i) : b);
  }
  std::vector<std::string> alone;
  {
    ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--prefix-cache-mib", "0"}));
    Http http(server.port());
    for (const json &b : bodies) alone.push_back(chat_text(http.post("/v1/chat/completions", b)));
    CHECK(server.stop() == 0);
  }
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--prefix-cache-mib", "64", "--parallel", "4"}));
  Http http(server.port());
  // Two requests keep the system prompt's state (the second keeps it where the two part).
  REQUIRE(http.post("/v1/chat/completions", bodies[0]).status == 200);
  REQUIRE(http.post("/v1/chat/completions", bodies[1]).status == 200);
  // Then all four at once, each continuing its own fork of the kept state, decoding together.
  for (int round = 0; round < 2; ++round) {
    std::vector<Reply> replies(bodies.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < bodies.size(); ++i)
      clients.emplace_back([&, i] {
        Http h(server.port());
        replies[i] = h.post("/v1/chat/completions", bodies[i]);
      });
    for (auto &c : clients) c.join();
    for (size_t i = 0; i < bodies.size(); ++i) {
      INFO("round " << round << ", request " << i);
      REQUIRE(replies[i].status == 200);
      CHECK(cached_tokens(replies[i]) >= 64 * 2);  // the system prompt's whole blocks, at least
      CHECK(chat_text(replies[i]) == alone[i]);
    }
  }
  CHECK(metric(http, "ep_server_steps_batched_total") > 0);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: a conversation's next turn continues the kept state and reads fewer expert bytes", "[reuse]") {
  ep::test::TempDir dir;
  // A system prompt of a few hundred tokens, so that the whole conversation is several prefill
  // chunks while the second turn's new part is one.
  std::string system = "Answer with the verse asked for, in the words of the King James Version.";
  for (int i = 0; i < 8; ++i) system += " In the beginning God created the heaven and the earth, and the earth was without form, and void.";
  // A small expert cache (2 slots for the demo model's 96 experts): a prefill reads experts for each chunk.
  const std::vector<std::string> small = {"--cache-mib", "0.08", "--parallel", "2"};
  struct Turns {
    Reply first, second;
  };
  auto converse = [&](bool reuse, bool thinking) {
    std::vector<std::string> args = small;
    args.insert(args.end(), {"--prefix-cache-mib", reuse ? "64" : "0"});
    ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, args));
    Http http(server.port());
    std::vector<std::pair<std::string, std::string>> conversation = {{"system", system}, {"user", "John 3:16"}};
    json body = chat_body(conversation, 20);
    body["thinking"] = thinking;
    Turns t;
    t.first = http.post("/v1/chat/completions", body);
    REQUIRE(t.first.status == 200);
    conversation.push_back({"assistant", chat_text(t.first)});
    conversation.push_back({"user", "Psalms 23:1"});
    body = chat_body(conversation, 20);
    body["thinking"] = thinking;
    t.second = http.post("/v1/chat/completions", body);
    REQUIRE(t.second.status == 200);
    if (reuse) CHECK(metric(http, "ep_server_requests_reused_total") >= 1);
    CHECK(server.stop() == 0);
    return t;
  };
  for (const bool thinking : {false, true}) {
    INFO("thinking " << thinking);
    const Turns kept = converse(true, thinking);
    const Turns fresh = converse(false, thinking);
    const json &u1 = kept.first.body.at("usage");
    const json &u2 = kept.second.body.at("usage");
    const int first_prompt = u1.at("prompt_tokens").get<int>();
    const int cached = u2.at("prompt_tokens_details").at("cached_tokens").get<int>();
    // The first turn's prompt up to the last block boundary before its assistant marker is
    // reused: DeepSeek-V4 renders the answered turn as `<｜Assistant｜></think>answer<eos>`, so
    // the generation prompt's thinking tokens after the marker (one or two) part the two, and
    // the state is kept at whole blocks of 64 tokens.
    CHECK(cached >= first_prompt - 2 - 63);
    CHECK(cached % 64 == 0);
    CHECK(cached < u2.at("prompt_tokens").get<int>());
    CHECK(fresh.second.body.at("usage").at("prompt_tokens_details").at("cached_tokens") == 0);
    CHECK(fresh.second.body.at("usage").at("prompt_tokens") == u2.at("prompt_tokens"));
    // The same answers, and fewer expert bytes read for the second turn's prompt.
    CHECK(chat_text(kept.first) == chat_text(fresh.first));
    CHECK(chat_text(kept.second) == chat_text(fresh.second));
    const uint64_t kept_bytes = kept.second.body.at("timings").at("prefill_expert_bytes").get<uint64_t>();
    const uint64_t fresh_bytes = fresh.second.body.at("timings").at("prefill_expert_bytes").get<uint64_t>();
    CHECK(fresh_bytes > 0);
    CHECK(kept_bytes < fresh_bytes);
    CHECK(kept.second.header("X-Prefill-Expert-Bytes") == std::to_string(kept_bytes));
  }
}

TEST_CASE("ep-server: bad requests get OpenAI error objects and the server keeps serving", "[robustness]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(
      EP_SERVER_EXE, server_args(dir, {"--api-key", "sesame", "--max-body-bytes", "65536", "--max-prompt-tokens", "256",
                                       "--max-tokens", "64", "--parallel", "1"}));
  Http anonymous(server.port()), wrong(server.port(), "open"), http(server.port(), "sesame");
  const json good = chat_body(kJohn, 4);

  check_error(anonymous.post("/v1/chat/completions", good), 401, "invalid_api_key");
  check_error(wrong.post("/v1/chat/completions", good), 401, "invalid_api_key");
  check_error(anonymous.get("/v1/models"), 401, "invalid_api_key");
  CHECK(anonymous.get("/health").status == 200);  // outside /v1: no key needed

  const std::string chat = "/v1/chat/completions";
  check_error(http.post_raw(chat, "{\"messages\": [", "application/json"), 400, "invalid_json");
  check_error(http.post_raw(chat, "[1, 2]", "application/json"), 400, "invalid_json");
  check_error(http.post_raw(chat, std::string(100, '[') + std::string(100, ']'), "application/json"), 400, "invalid_json");
  check_error(http.post_raw(chat, "{\"messages\": \"\xff\xfe\"}", "application/json"), 400, "invalid_json");
  check_error(http.post(chat, json::object()), 400, "missing", "messages");
  check_error(http.post(chat, {{"messages", "John 3:16"}}), 400, "invalid_type", "messages");
  check_error(http.post(chat, {{"messages", json::array({{{"content", "x"}}})}}), 400, "missing");
  check_error(http.post(chat, {{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}), 400);
  check_error(http.post(chat, {{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}}), 400,
              "unsupported");
  // Fields of the good request replaced by wrong ones (a JSON merge patch each).
  struct BadField {
    json patch;
    int status;
    std::string code, param;
  };
  const std::vector<BadField> bad_fields = {
      {{{"temperature", "warm"}}, 400, "invalid_type", "temperature"},
      {{{"temperature", 7}}, 400, "invalid_value", "temperature"},
      {{{"max_tokens", 65}}, 400, "invalid_value", "max_tokens"},
      {{{"max_tokens", 0}}, 400, "invalid_value", "max_tokens"},
      {{{"max_tokens", 2.5}}, 400, "invalid_type", "max_tokens"},
      {{{"stop", 7}}, 400, "invalid_type", "stop"},
      {{{"stop", json::array({""})}}, 400, "invalid_value", "stop"},
      {{{"stream", "yes"}}, 400, "invalid_type", "stream"},
      {{{"n", 9}}, 400, "invalid_value", "n"},
      {{{"logprobs", 3}}, 400, "invalid_type", "logprobs"},
      {{{"top_logprobs", 2}}, 400, "invalid_value", "top_logprobs"},
      {{{"logprobs", true}, {"top_logprobs", 21}}, 400, "invalid_value", "top_logprobs"},
      {{{"n", 0}}, 400, "invalid_value", "n"},
      {{{"model", "gpt-4o"}}, 404, "model_not_found", "model"},
      {{{"model", 12}}, 400, "invalid_type", "model"},
      {{{"messages", json::array({{{"role", "user"}, {"content", std::string(70000, 'a')}}})}}, 413, "request_too_large", ""},
  };
  for (const BadField &b : bad_fields) {
    json bad = good;
    bad.merge_patch(b.patch);
    INFO("patch " << b.patch.dump().substr(0, 200));
    check_error(http.post(chat, bad), b.status, b.code, b.param);
  }
  json bad = good;
  std::string long_text;
  for (int i = 0; i < 100; ++i) long_text += "And God said, Let there be light. ";
  bad["messages"][0]["content"] = long_text;
  check_error(http.post(chat, bad), 400, "context_length_exceeded");
  check_error(http.post("/v1/completions", {{"prompt", json::array({1, 2, 100000})}}), 400, "invalid_value", "prompt");
  check_error(http.post("/v1/completions", {{"prompt", json::array({"a", "b"})}}), 400, "unsupported", "prompt");
  check_error(http.post("/v1/completions", {{"prompt", 5}}), 400, "invalid_type", "prompt");
  check_error(http.post("/v1/completions", {{"prompt", "a"}, {"logprobs", 21}}), 400, "invalid_value", "logprobs");
  check_error(http.post("/v1/completions", {{"prompt", "a"}, {"logprobs", true}}), 400, "invalid_type", "logprobs");
  check_error(http.post("/v1/completions", {{"prompt", "a"}, {"n", 2}, {"best_of", 3}}), 400, "unsupported", "best_of");
  check_error(http.post("/v1/embeddings", {{"input", "x"}}), 404, "not_found");
  check_error(http.get("/v1/chat/completions"), 404, "not_found");

  // After all of that, requests are answered.
  const Reply r = http.post(chat, good);
  CHECK(r.status == 200);
  CHECK(r.body.at("usage").at("completion_tokens") == 4);
  CHECK(metric(http, "ep_server_http_requests_total{endpoint=\"chat_completions\",status=\"400\"}") > 10);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: a client that disconnects cancels its request; a busy model queues the next", "[robustness]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--parallel", "1", "--max-tokens", "100000"}));
  Http http(server.port());
  const json endless = {{"prompt", "And God said"}, {"max_tokens", 100000}, {"ignore_eos", true}, {"temperature", 0}};

  // Streamed: the client reads three events and closes the connection.
  const StreamReply s = http.stream("/v1/completions", endless, 3);
  CHECK(s.data.size() == 3);
  CHECK(wait_metric(http, "ep_server_requests_finished_total{reason=\"cancelled\"}", 1));
  // Whole: the client gives up waiting.
  {
    Http impatient(server.port());
    impatient.set_read_timeout(500ms);
    const Reply r = impatient.post("/v1/completions", endless);
    CHECK(r.status == 0);  // no answer: the client timed out
  }
  CHECK(wait_metric(http, "ep_server_requests_finished_total{reason=\"cancelled\"}", 2));
  // The one batch slot is free again: a request is answered at once.
  const Reply next = http.post("/v1/chat/completions", chat_body(kJohn, 6));
  CHECK(next.status == 200);
  CHECK(next.body.at("usage").at("completion_tokens") == 6);

  // While the slot is taken, a second request waits for it and is answered once the first
  // ends. The first is streamed without end, and its client leaves only once the second is seen
  // waiting: what happens does not depend on how fast the machine is, or how busy.
  using Clock = std::chrono::steady_clock;
  std::atomic<bool> release{false};
  Clock::time_point left_at{};
  size_t first_events = 0;
  std::thread first([&] {
    Http h(server.port());
    first_events = h.stream("/v1/completions", endless, 0, [&](size_t) {
                      if (!release) return true;
                      left_at = Clock::now();
                      return false;
                    }).data.size();
  });
  REQUIRE(wait_metric(http, "ep_server_requests_running", 1, 600s));
  CHECK(http.get("/health").status == 200);  // the HTTP side answers while the model is busy
  Reply queued;
  std::thread second([&] {
    Http h(server.port());
    queued = h.post("/v1/chat/completions", chat_body(kJohn, 6));
  });
  const bool waited = wait_metric(http, "ep_server_requests_waiting", 1, 600s);
  const Clock::time_point seen_waiting = Clock::now();
  release = true;  // the first client goes away at its next event: its request ends, the slot frees
  first.join();
  second.join();
  CHECK(waited);
  CHECK(first_events > 0);
  CHECK(wait_metric(http, "ep_server_requests_finished_total{reason=\"cancelled\"}", 3));
  REQUIRE(queued.status == 200);
  // It was created before the test saw it waiting and admitted after the first client left, so
  // its queue time is at least the time between the two (a bound by cause, not a guess of speed).
  const double between_ms = std::chrono::duration<double, std::milli>(left_at - seen_waiting).count();
  CHECK(queued.body.at("timings").at("queue_ms").get<double>() >= between_ms);
  CHECK(chat_text(queued) == chat_text(next));

  // Shutting down while a request runs: it ends, and the server exits cleanly.
  std::atomic<int> late_status{-1};
  std::thread late([&] {
    Http h(server.port());
    late_status = h.post("/v1/completions", endless).status;
  });
  REQUIRE(wait_metric(http, "ep_server_requests_running", 1, 60s));
  CHECK(server.stop() == 0);
  late.join();
  CHECK((late_status == 503 || late_status == 0));
}

TEST_CASE("ep-server: requests are admitted by memory: one that never fits is a 400, one that fits later waits", "[memory]") {
  // What a request's session may come to count, from the C API (the demo model's state rule).
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.resident_experts = 1;
  ep_model *m = nullptr;
  REQUIRE(ep_model_open(&m, kModel.c_str(), &o) == EP_OK);
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, m) == EP_OK);
  const uint64_t context = p.context_length;
  REQUIRE(context > 0);
  auto state = [&](uint64_t tokens) {
    uint64_t b = 0;
    REQUIRE(ep_model_state_bytes(&b, m, tokens) == EP_OK);
    return b;
  };
  // Prompts of token ids, so that their lengths are known: a long runner, a short one, and one
  // whose state is larger than the budget.
  const json prompt = json::array({1, 2, 3, 4, 5, 6, 7, 8});
  constexpr uint64_t kLong = 50000, kShort = 6, kHuge = 400000;
  const uint64_t runner = state(8 + kLong - 1), small = state(8 + kShort - 1), huge = state(8 + kHuge - 1);
  ep_model_close(m);
  // Room for the runner and half the small one: the small one alone fits, not beside the runner.
  const uint64_t budget = runner + small / 2;
  REQUIRE(small < budget);
  REQUIRE(huge > budget);
  char kv_mib[64];
  std::snprintf(kv_mib, sizeof(kv_mib), "%.6f", static_cast<double>(budget) / 1048576.0);

  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--parallel", "2", "--prefix-cache-mib", "0", "--kv-mib", kv_mib,
                                                                  "--max-tokens", std::to_string(context + 1)}));
  Http http(server.port());
  const double served_budget = metric(http, "ep_server_kv_budget_bytes");
  CHECK(std::fabs(served_budget - static_cast<double>(budget)) < 2.0);

  // Never fits: refused before it is queued, naming the limit and the request's tokens.
  const auto body = [&](uint64_t max_tokens) {
    return json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"temperature", 0}};
  };
  const Reply past_context = http.post("/v1/completions", body(context - 7));
  check_error(past_context, 400, "context_length_exceeded", "max_tokens");
  CHECK(past_context.body.at("error").at("message").get<std::string>().find("maximum context length is " + std::to_string(context) +
                                                                              " tokens. However, you requested " +
                                                                              std::to_string(context + 1) + " tokens (8 in the prompt") !=
        std::string::npos);
  const Reply past_budget = http.post("/v1/completions", body(kHuge));
  check_error(past_budget, 400, "context_length_exceeded", "max_tokens");
  CHECK(past_budget.body.at("error").at("message").get<std::string>().find("KV budget") != std::string::npos);
  CHECK(metric(http, "ep_server_requests_admitted_total") == 0);

  // Fits the budget but not beside a running request: it waits (a batch slot is free) and is
  // answered once the runner's client leaves. The runner streams until the waiting one is seen.
  std::atomic<bool> release{false};
  std::thread first([&] {
    Http h(server.port());
    h.stream("/v1/completions", body(kLong), 0, [&](size_t) { return !release.load(); });
  });
  REQUIRE(wait_metric(http, "ep_server_requests_running", 1, 600s));
  CHECK(wait_metric(http, "ep_server_kv_reserved_bytes", 1));
  Reply queued;
  std::thread second([&] {
    Http h(server.port());
    queued = h.post("/v1/completions", body(kShort));
  });
  const bool held = wait_metric(http, "ep_server_memory_waits_total", 1, 600s);
  CHECK(wait_metric(http, "ep_server_requests_waiting", 1));
  CHECK(metric(http, "ep_server_requests_running") == 1);  // the second batch slot stays free
  release = true;
  first.join();
  second.join();
  CHECK(held);
  REQUIRE(queued.status == 200);
  CHECK(queued.body.at("usage").at("completion_tokens") == kShort);
  // Everything ended: no session holds memory (the gauge is published after the step).
  CHECK(wait_metric(http, "ep_server_requests_finished_total{reason=\"cancelled\"}", 1));
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (metric(http, "ep_server_kv_in_use_bytes") != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  CHECK(metric(http, "ep_server_kv_in_use_bytes") == 0);
  CHECK(server.stop() == 0);
}

namespace {

/// Routes the tokens of @p generated (special tokens matched) through a splitter and returns the
/// text of each channel.
std::pair<std::string, std::string> split(const ep_tokenizer *t, ep_chat_template tmpl, bool start_in_reasoning,
                                          const std::string &generated) {
  size_t n = 0;
  REQUIRE(ep_tokenize(nullptr, 0, &n, t, generated.data(), generated.size(), 0) == EP_OK);
  std::vector<int32_t> ids(n);
  REQUIRE(ep_tokenize(ids.data(), ids.size(), &n, t, generated.data(), generated.size(), 0) == EP_OK);
  ep_server::ReasoningSplitter splitter(ep_server::ThinkingMarkers::of(t, tmpl), t, start_in_reasoning);
  std::vector<int32_t> content, reasoning;
  for (const int32_t id : ids) {
    const ep_server::Channel c = splitter.route(id);
    if (c == ep_server::Channel::content) content.push_back(id);
    if (c == ep_server::Channel::reasoning) reasoning.push_back(id);
  }
  auto text = [&](const std::vector<int32_t> &v) {
    size_t len = 0;
    REQUIRE(ep_detokenize(nullptr, 0, &len, t, v.data(), v.size(), 0) == EP_OK);
    std::string out(len + 1, '\0');
    REQUIRE(ep_detokenize(out.data(), out.size(), &len, t, v.data(), v.size(), 0) == EP_OK);
    out.resize(len);
    return out;
  };
  return {text(reasoning), text(content)};
}

std::string write_kimi_model(const ep::test::TempDir &dir) {
  ep::testkit::KimiSyntheticSpec spec = ep::testkit::KimiSyntheticSpec::tiny(4);
  spec.seed = 5;
  return ep::testkit::write_kimi_synthetic_gguf(spec, dir / "k3-tiny.gguf");
}

}  // namespace

TEST_CASE("ep-server: the thinking markers split reasoning from the answer", "[reasoning]") {
  SECTION("DeepSeek-V4 (the demo model's tokenizer)") {
    ep_tokenizer *t = nullptr;
    REQUIRE(ep_tokenizer_open(&t, kModel.c_str()) == EP_OK);
    CHECK(split(t, EP_CHAT_TEMPLATE_DEEPSEEK_V4, true, "Let me see.</think>In the beginning") ==
          std::pair<std::string, std::string>("Let me see.", "In the beginning"));
    // Thinking off: the prompt closed the block; a stray marker is not text.
    CHECK(split(t, EP_CHAT_TEMPLATE_DEEPSEEK_V4, false, "In the</think> beginning") ==
          std::pair<std::string, std::string>("", "In the beginning"));
    CHECK(split(t, EP_CHAT_TEMPLATE_DEEPSEEK_V4, false, "A<think>B</think>C") == std::pair<std::string, std::string>("B", "AC"));
    ep_tokenizer_close(t);
  }
  SECTION("Kimi-K3 (a synthetic model's tokenizer)") {
    ep::test::TempDir dir;
    ep_tokenizer *t = nullptr;
    REQUIRE(ep_tokenizer_open(&t, write_kimi_model(dir).c_str()) == EP_OK);
    const std::string tail = "<|close|>response<|sep|><|close|>message<|sep|>";
    CHECK(split(t, EP_CHAT_TEMPLATE_KIMI_K3, true, "I ponder.<|close|>think<|sep|><|open|>response<|sep|>The answer." + tail) ==
          std::pair<std::string, std::string>("I ponder.", "The answer."));
    CHECK(split(t, EP_CHAT_TEMPLATE_KIMI_K3, false, "The answer." + tail + "more") == std::pair<std::string, std::string>("", "The answer."));
    ep_tokenizer_close(t);
  }
}

TEST_CASE("ep-server: a Kimi-K3 chat continues the first turn's prompt", "[kimi]") {
  ep::test::TempDir dir;
  const std::string model = write_kimi_model(dir);
  // Blocks of 4 tokens: the first prompt is a few blocks long.
  ep::test::ServerProcess server(EP_SERVER_EXE, {"--model", model, "--device", "cpu", "--resident-experts", "--cpu-threads", "2",
                                                 "--parallel", "2", "--prefill-chunk", "4"});
  Http http(server.port());
  std::vector<std::pair<std::string, std::string>> conversation = {{"user", "Hello"}};
  json body = chat_body(conversation, 6);
  body["model"] = "k3-tiny";
  const Reply first = http.post("/v1/chat/completions", body);
  REQUIRE(first.status == 200);
  const json &msg = first.body.at("choices").at(0).at("message");
  conversation.push_back({"assistant", msg.at("content").get<std::string>()});
  conversation.push_back({"user", "And then?"});
  body = chat_body(conversation, 6);
  body["model"] = "k3-tiny";
  body["messages"][1]["reasoning_content"] = msg.value("reasoning_content", "");
  const Reply second = http.post("/v1/chat/completions", body);
  REQUIRE(second.status == 200);
  // Kimi-K3 renders an answered turn as its generation prompt continued, so the whole first
  // prompt is a prefix of the second: its state is kept at its last block boundary (its
  // linear-attention state cannot be cut back, so it is kept as the prefill passes there).
  const int cached = second.body.at("usage").at("prompt_tokens_details").at("cached_tokens").get<int>();
  CHECK(cached + 3 >= first.body.at("usage").at("prompt_tokens").get<int>());
  CHECK(cached % 4 == 0);
  CHECK(server.stop() == 0);
}

// ---- hardening: ports, bodies, slow clients, a corrupt expert, parameters ---------------------

namespace {

/// A raw TCP connection to the server on 127.0.0.1 from the loopback address @p from (another
/// address of 127/8 is another client to the server).
class RawSocket {
 public:
  explicit RawSocket(int port, const char *from = "127.0.0.1") {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    REQUIRE(inet_pton(AF_INET, from, &local.sin_addr) == 1);
    REQUIRE(bind(fd_, reinterpret_cast<const sockaddr *>(&local), sizeof local) == 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    REQUIRE(inet_pton(AF_INET, "127.0.0.1", &to.sin_addr) == 1);
    REQUIRE(connect(fd_, reinterpret_cast<const sockaddr *>(&to), sizeof to) == 0);
  }
  ~RawSocket() { close(fd_); }
  RawSocket(const RawSocket &) = delete;
  RawSocket &operator=(const RawSocket &) = delete;

  /// False once the server closed the connection.
  bool send_all(const std::string &data) {
    for (size_t at = 0; at < data.size();) {
      const ssize_t n = send(fd_, data.data() + at, data.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }
  /// Takes what arrived, waiting up to @p wait for something; false once the server closed
  /// the connection (end of stream or reset).
  bool pump(std::chrono::milliseconds wait) {
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(wait.count())) <= 0) return !closed_;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) {
        closed_ = n == 0 || (errno != EAGAIN && errno != EINTR);
        return !closed_;
      }
      received_.append(buf, static_cast<size_t>(n));
      wait = std::chrono::milliseconds(0);
    }
  }
  /// Pumps until an HTTP status line and headers arrived or the connection closed (at most
  /// @p limit); the status, 0 when none came.
  int status(std::chrono::seconds limit = 60s) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (received_.find("\r\n\r\n") == std::string::npos && pump(100ms) && std::chrono::steady_clock::now() < until) {
    }
    if (received_.rfind("HTTP/1.1 ", 0) != 0 || received_.size() < 12) return 0;
    return std::stoi(received_.substr(9, 3));
  }
  /// Pumps until the server closes the connection (at most @p limit); true when it did.
  bool read_to_close(std::chrono::seconds limit = 60s) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (pump(100ms) && std::chrono::steady_clock::now() < until) {
    }
    return closed_;
  }
  const std::string &received() const { return received_; }
  bool closed() const { return closed_; }

 private:
  int fd_ = -1;
  std::string received_;
  bool closed_ = false;
};

std::string hex(size_t n) {
  char b[32];
  std::snprintf(b, sizeof b, "%zx", n);
  return b;
}

/// Sends header lines on @p sockets every few milliseconds until @p stop (clients that take
/// forever over their headers); a connection the server closed is left alone.
void trickle(std::vector<std::unique_ptr<RawSocket>> &sockets, const std::atomic<bool> &stop, const std::string &line) {
  while (!stop) {
    for (auto &s : sockets)
      if (!s->closed()) s->send_all(line);
    std::this_thread::sleep_for(50ms);
  }
}

}  // namespace

TEST_CASE("ep-server: a port in use is a startup error, never shared", "[hardening]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess first(EP_SERVER_EXE, server_args(dir, {}));
  std::string error;
  try {
    ep::test::ServerProcess second(EP_SERVER_EXE, server_args(dir, {"--no-pack-build", "--port", std::to_string(first.port())}));
    error = "<a second server listens on the same port; its log:\n" + second.log() + ">";
  } catch (const std::runtime_error &e) {
    error = e.what();
  }
  INFO(error);
  CHECK(error.find("cannot listen on 127.0.0.1:" + std::to_string(first.port()) + ": the address is in use") != std::string::npos);
  CHECK(Http(first.port()).get("/health").status == 200);
  CHECK(first.stop() == 0);
}

TEST_CASE("ep-server: the body limit holds for a chunked body as it arrives", "[hardening]") {
  ep::test::TempDir dir;
  constexpr size_t kLimit = 65536;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--max-body-bytes", std::to_string(kLimit)}));
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

  // Under the limit: answered.
  {
    RawSocket s(server.port());
    const std::string body = json{{"prompt", "And God said"}, {"temperature", 0}, {"max_tokens", 2}}.dump();
    REQUIRE(s.send_all(head + hex(body.size()) + "\r\n" + body + "\r\n0\r\n\r\n"));
    CHECK(s.status() == 200);
  }
  // Over it: chunks keep coming and the body never ends, yet the 413 comes. (Read whole, as a
  // chunked body was before, it would be answered only when the client gives up: 400.)
  RawSocket s(server.port());
  REQUIRE(s.send_all(head));
  const std::string chunk(16384, ' ');
  for (size_t sent = 0; sent < 4 * kLimit && s.received().empty(); sent += chunk.size()) {
    if (!s.send_all(hex(chunk.size()) + "\r\n" + chunk + "\r\n")) break;
    s.pump(0ms);
  }
  CHECK(s.status() == 413);
  CHECK(s.read_to_close());  // the rest of the body is not taken for a next request
  INFO(s.received());
  CHECK(s.received().find("request_too_large") != std::string::npos);
  CHECK(Http(server.port()).get("/health").status == 200);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: clients that trickle their headers hold no more than their share of the workers", "[hardening]") {
  ep::test::TempDir dir;
  // Four workers, two connections per client address, and deadlines far beyond the test: only
  // the per-client cap can keep a worker free for /health.
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--max-connections", "4", "--max-client-connections", "2",
                                                                  "--header-timeout", "600", "--body-timeout", "600"}));
  std::vector<std::unique_ptr<RawSocket>> slow;
  for (int i = 0; i < 6; ++i) {
    slow.push_back(std::make_unique<RawSocket>(server.port(), "127.0.0.2"));
    REQUIRE(slow.back()->send_all("GET /health HTTP/1.1\r\n"));
  }
  std::atomic<bool> stop{false};
  std::thread t([&] { trickle(slow, stop, "X-Slow: 1\r\n"); });
  Http http(server.port());
  http.set_read_timeout(30000ms);  // beyond it /health was not served: the slow clients hold every worker
  const Reply health = http.get("/health");
  CHECK(health.status == 200);
  // The four connections beyond the cap were refused at once.
  CHECK(wait_metric(http, "ep_server_connections_refused_total", 4, 60s));
  stop = true;
  t.join();
  size_t refused = 0;
  for (auto &s : slow)
    if (s->status(0s) == 429) ++refused;
  CHECK(refused == 4);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: a request's headers and body must arrive within their deadlines", "[hardening]") {
  ep::test::TempDir dir;
  // One worker: connections are served one after another in the order they were opened, and a
  // connection's deadlines start only when the worker takes it. The test's own requests are sent
  // whole while the worker is still busy with an earlier connection, so their bytes are there
  // before their clock starts: only the slow clients can miss a deadline, however slow the test
  // itself runs on a loaded machine.
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--max-connections", "1", "--header-timeout", "0.5",
                                                                  "--body-timeout", "0.5", "--max-tokens", "100000"}));
  // The worker is held by a streamed answer that runs until its client leaves. (Its own request
  // reaches a free worker; should it miss the header deadline, it is sent again, and that timeout
  // is in the counts read before the slow clients.)
  std::atomic<bool> streaming{false}, release{false}, holder_gave_up{false};
  std::thread holder([&] {
    const json endless = {{"prompt", "And God said"}, {"max_tokens", 100000}, {"ignore_eos", true}, {"temperature", 0}};
    for (int attempt = 0; attempt < 20 && !streaming; ++attempt)
      Http(server.port()).stream("/v1/completions", endless, 0, [&](size_t events) {
        if (events > 0) streaming = true;
        return !release;
      });
    holder_gave_up = !streaming;
  });
  while (!streaming && !holder_gave_up) std::this_thread::sleep_for(10ms);
  if (!streaming) {
    holder.join();
    FAIL("no streamed answer held the worker; the server's log:\n" << server.log());
  }
  // Queued behind it, in this order: the counts before, a client that never ends its headers, the
  // counts after it, a client that never ends its body, the counts after it, and a prompt client.
  const std::string get_metrics = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string prompt = json{{"prompt", "And God said"}, {"temperature", 0}, {"max_tokens", 2}}.dump();
  std::vector<std::unique_ptr<RawSocket>> before, slow_headers, after_headers, slow_body, after_body, prompt_client;
  auto open = [&](std::vector<std::unique_ptr<RawSocket>> &one, const std::string &bytes) {
    one.push_back(std::make_unique<RawSocket>(server.port()));
    REQUIRE(one[0]->send_all(bytes));
  };
  open(before, get_metrics);
  open(slow_headers, "GET /health HTTP/1.1\r\n");
  open(after_headers, get_metrics);
  open(slow_body, "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n");
  open(after_body, get_metrics);
  open(prompt_client, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(prompt.size()) + "\r\nConnection: close\r\n\r\n" + prompt);
  release = true;  // the holder leaves at its next event, and the worker takes the queue in order
  holder.join();

  // The metrics' answer, read to the end (the server closes the connection after it).
  auto counts = [&](RawSocket &s, const char *phase) {
    REQUIRE(s.status() == 200);
    s.read_to_close();
    return metric_in(s.received(), std::string("ep_server_connection_timeouts_total{phase=\"") + phase + "\"}");
  };
  // Each slow client sends a little every 50 ms, forever: only a deadline ends the connection.
  auto closed_by_server = [&](std::vector<std::unique_ptr<RawSocket>> &one, const std::string &more) {
    std::atomic<bool> stop{false};
    std::thread t([&] { trickle(one, stop, more); });
    for (int i = 0; i < 600 && one[0]->pump(100ms);) ++i;  // at most a minute
    stop = true;
    t.join();
    return one[0]->closed();
  };
  const double header_before = counts(*before[0], "header");
  const double body_before = metric_in(before[0]->received(), "ep_server_connection_timeouts_total{phase=\"body\"}");
  REQUIRE(header_before >= 0);
  REQUIRE(body_before >= 0);
  CHECK(closed_by_server(slow_headers, "X-Slow: 1\r\n"));
  CHECK(counts(*after_headers[0], "header") == header_before + 1);
  CHECK(metric_in(after_headers[0]->received(), "ep_server_connection_timeouts_total{phase=\"body\"}") == body_before);
  CHECK(closed_by_server(slow_body, " "));
  CHECK(counts(*after_body[0], "body") == body_before + 1);
  CHECK(metric_in(after_body[0]->received(), "ep_server_connection_timeouts_total{phase=\"header\"}") == header_before + 1);
  // A prompt client is served as before.
  CHECK(prompt_client[0]->status() == 200);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: a parameter the server would not act on is refused by name", "[hardening]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--api-key", "sesame", "--max-tokens", "64"}));
  Http http(server.port(), "sesame");
  const std::string chat = "/v1/chat/completions", completions = "/v1/completions";
  const json good_chat = chat_body(kJohn, 4);
  const json good_completion = {{"prompt", "And God said"}, {"temperature", 0}, {"max_tokens", 4}};
  struct Case {
    const std::string *path;
    json patch;
    std::string code, param;
  };
  const std::vector<Case> cases = {
      {&chat, {{"logit_bias", {{"5", 101}}}}, "invalid_value", "logit_bias"},
      {&completions, {{"logit_bias", {{"five", 1}}}}, "invalid_value", "logit_bias"},
      {&completions, {{"logit_bias", {{"99999999", 1}}}}, "invalid_value", "logit_bias"},
      {&completions, {{"logit_bias", {{"5", 1}, {"05", 2}}}}, "invalid_value", "logit_bias"},
      {&chat, {{"logit_bias", {{"5", "up"}}}}, "invalid_type", "logit_bias"},
      {&chat, {{"functions", json::array({{{"name", "f"}}})}}, "unsupported", "functions"},
      {&chat, {{"function_call", "auto"}}, "unsupported", "function_call"},
      {&chat, {{"tool_choice", "auto"}}, "invalid_value", "tool_choice"},
      {&chat, {{"tool_choice", "none"}}, "invalid_value", "tool_choice"},
      {&chat, {{"parallel_tool_calls", false}}, "invalid_value", "parallel_tool_calls"},
      {&chat, {{"reasoning_effort", "high"}}, "unsupported", "reasoning_effort"},
      {&chat, {{"modalities", json::array({"text", "audio"})}}, "unsupported", "modalities"},
      {&chat, {{"audio", {{"voice", "alloy"}, {"format", "wav"}}}}, "unsupported", "audio"},
      {&chat, {{"prediction", {{"type", "content"}, {"content", "x"}}}}, "unsupported", "prediction"},
      {&chat, {{"service_tier", "flex"}}, "unsupported", "service_tier"},
      {&chat, {{"store", true}}, "unsupported", "store"},
      {&chat, {{"metadata", {{"k", "v"}}}}, "unsupported", "metadata"},
      {&chat, {{"frobnicate", 1}}, "unknown_parameter", "frobnicate"},
      {&completions, {{"messages", json::array()}}, "unknown_parameter", "messages"},
      {&chat, {{"messages", json::array({{{"role", "user"}, {"content", nullptr}}})}}, "missing", "messages[0].content"},
      {&chat, {{"messages", json::array({{{"role", "user"}}})}}, "missing", "messages[0].content"},
      {&chat, {{"messages", json::array({{{"role", "user"}, {"content", "x"}, {"refusal", "no"}}})}}, "unsupported", "messages[0].refusal"},
  };
  for (const Case &c : cases) {
    json body = *c.path == chat ? good_chat : good_completion;
    body.merge_patch(c.patch);
    INFO(*c.path << " " << c.patch.dump());
    check_error(http.post(*c.path, body), 400, c.code, c.param);
  }
  // What asks for nothing the server does not do is accepted: nulls, the defaults, identifiers.
  json fine = good_chat;
  fine.merge_patch({{"logit_bias", json::object()}, {"service_tier", "auto"}, {"store", false}, {"modalities", json::array({"text"})},
                    {"user", "u-1"}, {"tool_choice", nullptr}, {"messages", json::array({{{"role", "user"}, {"content", "John 3:16"}},
                                                                                         {{"role", "assistant"}, {"content", nullptr}},
                                                                                         {{"role", "user"}, {"content", "Amen"}}})}});
  CHECK(http.post(chat, fine).status == 200);
  // max_completion_tokens holds on /v1/completions too.
  json capped = good_completion;
  capped.erase("max_tokens");
  capped["max_completion_tokens"] = 3;
  capped["ignore_eos"] = true;
  const Reply r = http.post(completions, capped);
  REQUIRE(r.status == 200);
  CHECK(r.body.at("usage").at("completion_tokens") == 3);
  // The Bearer scheme's name is case-insensitive.
  httplib::Client raw("127.0.0.1", server.port());
  for (const char *scheme : {"bearer", "BEARER", "Bearer"}) {
    INFO(scheme);
    const auto res = raw.Get("/v1/models", {{"Authorization", std::string(scheme) + " sesame"}});
    REQUIRE(res);
    CHECK(res->status == 200);
  }
  const auto wrong = raw.Get("/v1/models", {{"Authorization", "Basic sesame"}});
  REQUIRE(wrong);
  CHECK(wrong->status == 401);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: logprobs, logit_bias and n answers, whole and streamed", "[api][sampling]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--parallel", "4"}));
  Http http(server.port());
  const std::string chat = "/v1/chat/completions", completions = "/v1/completions";

  // Chat logprobs: one entry per answer token (the text put together is the answer), the
  // alternatives sorted with the greedy token first, the same entries streamed.
  json body = chat_body(kJohn, 6);
  body["logprobs"] = true;
  body["top_logprobs"] = 4;
  const Reply r = http.post(chat, body);
  REQUIRE(r.status == 200);
  const json &lp = r.body.at("choices").at(0).at("logprobs");
  const json &entries = lp.at("content");
  CHECK(lp.at("refusal").is_null());
  REQUIRE(entries.size() == 6);
  std::string joined;
  for (const json &e : entries) {
    joined += e.at("token").get<std::string>();
    CHECK(e.at("logprob").get<double>() <= 0);
    const json &top = e.at("top_logprobs");
    REQUIRE(top.size() == 4);
    CHECK(top.at(0).at("token") == e.at("token"));
    CHECK(top.at(0).at("logprob") == e.at("logprob"));
    for (size_t i = 1; i < top.size(); ++i) CHECK(top.at(i).at("logprob").get<double>() <= top.at(i - 1).at("logprob").get<double>());
    const std::string t = e.at("token").get<std::string>();
    CHECK(e.at("bytes") == json(std::vector<int>(t.begin(), t.end())));
  }
  CHECK(joined == chat_text(r));
  const StreamReply s = http.stream(chat, body);
  json streamed_entries = json::array();
  for (size_t i = 0; i + 1 < s.data.size(); ++i) {
    const json c = json::parse(s.data[i]);
    for (const json &ch : c.at("choices"))
      if (ch.at("logprobs").is_object())
        for (const json &e : ch.at("logprobs").at("content")) streamed_entries.push_back(e);
  }
  CHECK(streamed_entries == entries);

  // Completions' logprobs: K alternatives as {text: logprob}, offsets into the text.
  const json cbody = {{"prompt", "And God said"}, {"temperature", 0}, {"max_tokens", 5}, {"logprobs", 2}};
  const Reply c = http.post(completions, cbody);
  REQUIRE(c.status == 200);
  const json &clp = c.body.at("choices").at(0).at("logprobs");
  REQUIRE(clp.at("tokens").size() == 5);
  std::string ctext;
  for (size_t i = 0; i < 5; ++i) {
    CHECK(clp.at("text_offset").at(i) == ctext.size());
    ctext += clp.at("tokens").at(i).get<std::string>();
    CHECK(clp.at("top_logprobs").at(i).at(clp.at("tokens").at(i).get<std::string>()) == clp.at("token_logprobs").at(i));
  }
  CHECK(ctext == completion_text(c));

  // logit_bias: +100 on token 7 ('$') makes every token that one; -100 on the greedy first token
  // moves it.
  json biased = cbody;
  biased["logit_bias"] = {{"7", 100}};
  const Reply b = http.post(completions, biased);
  REQUIRE(b.status == 200);
  CHECK(completion_text(b) == "$$$$$");
  biased["logit_bias"] = {{std::to_string(0), -100}};  // BOS: accepted, changes nothing here
  CHECK(http.post(completions, biased).status == 200);

  // n = 2: greedy answers are equal; seeded answer 1 is the n = 1 answer of seed + 1; the prompt
  // counts once; streamed chunks carry each answer's index.
  json two = cbody;
  two.erase("logprobs");
  two["n"] = 2;
  const Reply g = http.post(completions, two);
  REQUIRE(g.status == 200);
  REQUIRE(g.body.at("choices").size() == 2);
  CHECK(g.body.at("choices").at(1).at("index") == 1);
  CHECK(g.body.at("choices").at(0).at("text") == g.body.at("choices").at(1).at("text"));
  const Reply one = http.post(completions, cbody);
  CHECK(g.body.at("usage").at("prompt_tokens") == one.body.at("usage").at("prompt_tokens"));
  CHECK(g.body.at("usage").at("completion_tokens") == 10);
  two["temperature"] = 1.0;
  two["seed"] = 77;
  two["max_tokens"] = 8;
  const Reply sampled = http.post(completions, two);
  REQUIRE(sampled.status == 200);
  json alone = two;
  alone["n"] = 1;
  alone["seed"] = 78;
  CHECK(http.post(completions, alone).body.at("choices").at(0).at("text") == sampled.body.at("choices").at(1).at("text"));
  alone["seed"] = 77;
  CHECK(http.post(completions, alone).body.at("choices").at(0).at("text") == sampled.body.at("choices").at(0).at("text"));
  const StreamReply ts = http.stream(completions, two);
  REQUIRE(ts.status == 200);
  std::vector<std::string> by_index(2);
  for (size_t i = 0; i + 1 < ts.data.size(); ++i) {
    const json chunk = json::parse(ts.data[i]);
    for (const json &ch : chunk.at("choices")) by_index.at(ch.at("index").get<size_t>()) += ch.at("text").get<std::string>();
  }
  CHECK(by_index[0] == sampled.body.at("choices").at(0).at("text").get<std::string>());
  CHECK(by_index[1] == sampled.body.at("choices").at(1).at("text").get<std::string>());
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: a corrupt expert fails only the requests that route to it", "[hardening]") {
  ep::test::TempDir dir;
  // The Expert Pack, built by a first server; a copy with 4 bytes of one expert of layer 0 changed.
  // Layer 0 is hash-routed (by token id alone), so whether a token reaches that expert does not
  // depend on the tokens around it.
  { ep::test::ServerProcess build(EP_SERVER_EXE, server_args(dir, {})); CHECK(build.stop() == 0); }
  std::string pack_name;
  for (const auto &e : std::filesystem::directory_iterator(dir / "packs"))
    if (e.path().extension() == ".epk") pack_name = e.path().filename().string();
  REQUIRE(!pack_name.empty());
  std::filesystem::create_directories(dir / "bad");
  for (const std::string suffix : {"", ".json"})
    std::filesystem::copy_file(dir / ("packs/" + pack_name + suffix), dir / ("bad/" + pack_name + suffix));
  const std::string bad_pack = dir / ("bad/" + pack_name);
  const std::vector<uint8_t> clean = ep::test::read_file(bad_pack);
  // An expert outside the sample ep_pack_open() checks, so the pack opens and the damage is
  // found when the expert is read.
  uint32_t corrupt_expert = 0;
  for (uint32_t expert = 1; expert < 16 && !corrupt_expert; ++expert) {
    ep_pack *p = nullptr;
    REQUIRE(ep_pack_open(&p, bad_pack.c_str(), nullptr) == EP_OK);
    ep_pack_object_info o;
    REQUIRE(ep_pack_object(&o, p, 0, expert) == EP_OK);
    ep_pack_close(p);
    std::vector<uint8_t> bytes = clean;
    for (uint64_t i = 0; i < 4; ++i) bytes[o.role_offset[1] + 64 + i] ^= 0x5a;
    {
      std::ofstream out(bad_pack, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char *>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    if (ep_pack_open(&p, bad_pack.c_str(), nullptr) == EP_OK) {
      corrupt_expert = expert;
      ep_pack_close(p);
    }
  }
  REQUIRE(corrupt_expert != 0);
  INFO("layer 0 expert " << corrupt_expert << " is corrupt");

  ep::test::ServerProcess server(EP_SERVER_EXE, {"--model", kModel, "--device", "cpu", "--pack-dir", dir / "bad", "--no-pack-build",
                                                 "--cpu-threads", "2", "--prefix-cache-mib", "0", "--max-tokens", "100000"});
  Http http(server.port());
  CHECK(http.get("/health").body.at("status") == "ok");
  // Which tokens route to the corrupt expert: each alone, one forward pass (max_tokens 1 samples
  // from its logits and appends nothing more).
  std::vector<int> safe, unsafe;
  std::string failure;
  for (int t = 0; t < 48; ++t) {
    const Reply r = http.post("/v1/completions", {{"prompt", json::array({t})}, {"max_tokens", 1}, {"temperature", 0}});
    if (r.status == 200) safe.push_back(t);
    else if (r.status == 500) unsafe.push_back(t), failure = r.body.dump();
    else FAIL("token " << t << ": HTTP " << r.status << " " << r.body.dump());
  }
  REQUIRE(!safe.empty());
  REQUIRE(!unsafe.empty());
  // The client hears what failed, never where the server's files are.
  INFO(failure);
  CHECK(failure.find("integrity check") != std::string::npos);
  CHECK(failure.find(dir.str()) == std::string::npos);
  CHECK(failure.find(".epk") == std::string::npos);
  CHECK(server.log().find("is corrupt") != std::string::npos);  // the operator's log names it
  CHECK(metric(http, "ep_store_io_errors_total") >= 1);
  const Reply health = http.get("/health");
  CHECK(health.status == 200);
  CHECK(health.body.at("status") == "degraded");

  // A healthy request that runs until its client leaves (its prompt only of safe tokens, and a
  // bias that keeps what it generates among them), and while it runs, one that routes to the
  // corrupt expert: their step fails, the healthy one is run again without it and answers as it
  // does alone. The healthy client leaves only once the broken one was answered, so the two share
  // a step however fast or busy the machine is.
  constexpr size_t kCompared = 8;
  json healthy = {{"prompt", json::array()}, {"temperature", 0}, {"ignore_eos", true}, {"logit_bias", json::object()}};
  for (size_t i = 0; i < 64; ++i) healthy["prompt"].push_back(safe[i % safe.size()]);
  for (const int t : safe) healthy["logit_bias"][std::to_string(t)] = 100;
  json alone_request = healthy;
  alone_request["max_tokens"] = kCompared;
  const std::string alone = completion_text(http.post("/v1/completions", alone_request));
  REQUIRE(!alone.empty());
  const double recomputed_before = metric(http, "ep_server_requests_recomputed_total");
  json endless = healthy;
  endless["max_tokens"] = 100000;
  std::atomic<bool> generating{false}, release{false}, ended{false};
  StreamReply together;
  std::thread long_one([&] {
    together = Http(server.port()).stream("/v1/completions", endless, 0, [&](size_t events) {
      if (events > 0) generating = true;
      return !(release && events > kCompared);
    });
    ended = true;
  });
  while (!generating && !ended) std::this_thread::sleep_for(10ms);
  REQUIRE(generating);
  const Reply broken = http.post("/v1/completions", {{"prompt", json::array({unsafe[0]})}, {"max_tokens", 1}, {"temperature", 0}});
  release = true;  // the healthy client leaves once it has more than kCompared tokens
  long_one.join();
  check_error(broken, 500);
  // The client left mid-answer (no status comes back to it): every event it read is a chunk of text.
  std::string together_text;
  for (const std::string &event : together.data) {
    const json chunk = json::parse(event, nullptr, false);
    INFO(event);
    REQUIRE((chunk.is_object() && chunk.contains("choices") && chunk.at("choices").size() == 1));
    together_text += chunk.at("choices").at(0).at("text").get<std::string>();
  }
  INFO("alone: " << alone << "\ntogether: " << together_text);
  CHECK(together.data.size() > kCompared);
  CHECK(together_text.rfind(alone, 0) == 0);
  // They did share a step, and it was run again for the healthy one.
  CHECK(metric(http, "ep_server_requests_recomputed_total") == recomputed_before + 1);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: /tokenize, /detokenize and /props", "[api]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--api-key", "sesame", "--parallel", "3", "--max-tokens", "64"}));
  Http http(server.port(), "sesame");
  const Reply t = http.post("/tokenize", {{"content", "And God said, Let there be light"}});
  REQUIRE(t.status == 200);
  const std::vector<int32_t> ids = t.body.at("tokens").get<std::vector<int32_t>>();
  CHECK(!ids.empty());
  // A completion of those ids is the completion of the text (no BOS either way here).
  const Reply as_ids = http.post("/v1/completions", {{"prompt", ids}, {"temperature", 0}, {"max_tokens", 6}});
  REQUIRE(as_ids.status == 200);
  CHECK(as_ids.body.at("usage").at("prompt_tokens") == ids.size());
  const Reply d = http.post("/detokenize", {{"tokens", ids}});
  REQUIRE(d.status == 200);
  CHECK(d.body.at("content") == "And God said, Let there be light");
  const Reply with_bos = http.post("/tokenize", {{"content", "x"}, {"add_special", true}});
  REQUIRE(with_bos.status == 200);
  CHECK(with_bos.body.at("tokens").size() >= http.post("/tokenize", {{"content", "x"}}).body.at("tokens").size());
  check_error(http.post("/tokenize", {{"text", "x"}}), 400, "unknown_parameter", "text");
  check_error(http.post("/tokenize", json::object()), 400, "missing", "content");
  check_error(http.post("/detokenize", {{"tokens", json::array({-1})}}), 400, "invalid_value", "tokens");
  check_error(Http(server.port()).post("/tokenize", {{"content", "x"}}), 401, "invalid_api_key");

  const Reply p = http.get("/props");
  REQUIRE(p.status == 200);
  CHECK(p.body.at("model") == "demo-kjv");
  CHECK(p.body.at("architecture") == "deepseek4");
  CHECK(p.body.at("chat_template") == "deepseek-v4");
  CHECK(p.body.at("parallel") == 3);
  CHECK(p.body.at("limits").at("max_tokens") == 64);
  CHECK(p.body.at("default_generation_settings").at("temperature") == 1.0);
  CHECK(p.body.at("vocab_size").get<int>() > 0);
  CHECK(server.stop() == 0);
}

// ---- tool calls ------------------------------------------------------------------------------

namespace {

json weather_tools() {
  return json::array({{{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "The weather in a city"},
                         {"parameters", {{"type", "object"}, {"properties", {{"location", {{"type", "string"}}}}}, {"required", {"location"}}}}}}},
                      {{"type", "function"}, {"function", {{"name", "now"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
}

/// The tool calls of a streamed answer, folded from their deltas (checking their shape: a
/// call's first delta has its id, type and name; its later ones only argument pieces).
json streamed_tool_calls(const StreamReply &s, std::string *content, std::string *finish) {
  json calls = json::array();
  for (size_t i = 0; i + 1 < s.data.size(); ++i) {
    const json c = json::parse(s.data[i]);
    if (c.at("choices").empty()) continue;
    const json &ch = c.at("choices").at(0);
    const json &d = ch.at("delta");
    if (d.contains("content")) *content += d.at("content").get<std::string>();
    if (!ch.at("finish_reason").is_null()) *finish = ch.at("finish_reason").get<std::string>();
    if (!d.contains("tool_calls")) continue;
    for (const json &t : d.at("tool_calls")) {
      INFO(t.dump());
      const size_t index = t.at("index").get<size_t>();
      if (index == calls.size()) {
        REQUIRE(t.contains("id"));
        CHECK(t.at("type") == "function");
        REQUIRE(t.at("function").contains("name"));
        calls.push_back({{"id", t.at("id")}, {"type", "function"}, {"function", {{"name", t.at("function").at("name")}, {"arguments", ""}}}});
      } else {
        REQUIRE(index + 1 == calls.size());
        CHECK_FALSE(t.contains("id"));
      }
      std::string args = calls[index]["function"]["arguments"].get<std::string>();
      calls[index]["function"]["arguments"] = args + t.at("function").value("arguments", "");
    }
  }
  return calls;
}

}  // namespace

TEST_CASE("ep-server: tool calls: a named tool_choice, streamed and whole; a tool message round trip", "[tools]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--parallel", "2"}));
  Http http(server.port());
  const std::string chat = "/v1/chat/completions";
  json body = chat_body({{"user", "What is the weather in Paris?"}}, 6);
  body["tools"] = weather_tools();
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};

  // The demo model writes no meaningful arguments: the call's structure is checked here (its
  // parsing, on hand-written outputs, in server_tool_calls_test).
  const Reply whole = http.post(chat, body);
  REQUIRE(whole.status == 200);
  INFO(whole.body.dump());
  const json &msg = whole.body.at("choices").at(0).at("message");
  REQUIRE(msg.contains("tool_calls"));
  REQUIRE(msg.at("tool_calls").size() == 1);
  const json &call = msg.at("tool_calls").at(0);
  CHECK(call.at("type") == "function");
  CHECK(call.at("id").get<std::string>().rfind("call_", 0) == 0);
  CHECK(call.at("function").at("name") == "get_weather");
  const json args = json::parse(call.at("function").at("arguments").get<std::string>());
  CHECK(args.is_object());
  const std::string finish = whole.body.at("choices").at(0).at("finish_reason").get<std::string>();
  CHECK((finish == "tool_calls" || finish == "length"));

  body["stream"] = true;
  const StreamReply streamed = http.stream(chat, body);
  REQUIRE(streamed.status == 200);
  std::string content, stream_finish;
  const json calls = streamed_tool_calls(streamed, &content, &stream_finish);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].at("function") == call.at("function"));  // greedy: the same call, piece by piece
  CHECK(content == (msg.at("content").is_null() ? std::string() : msg.at("content").get<std::string>()));
  CHECK(stream_finish == finish);

  // tool_choice "required": a call to one of the tools, the model's pick (any, or none when it
  // writes no name: then its text is the content).
  body.erase("stream");
  body["tool_choice"] = "required";
  const Reply required = http.post(chat, body);
  REQUIRE(required.status == 200);
  const json &rmsg = required.body.at("choices").at(0).at("message");
  if (rmsg.contains("tool_calls"))
    for (const json &c : rmsg.at("tool_calls")) CHECK(json::parse(c.at("function").at("arguments").get<std::string>()).is_object());

  // The call and its result rendered back: the next turn continues the first turn's kept state.
  json round = chat_body({{"user", "What is the weather in Paris?"}}, 4);
  round["tools"] = weather_tools();
  round["messages"].push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({call})}});
  round["messages"].push_back({{"role", "tool"}, {"tool_call_id", call.at("id")}, {"content", "21 C and clear"}});
  const Reply answered = http.post(chat, round);
  REQUIRE(answered.status == 200);
  CHECK(answered.body.at("usage").at("prompt_tokens_details").at("cached_tokens").get<int>() > 0);
  json shorter = round;
  shorter["messages"].back()["content"] = "21";
  const Reply less = http.post(chat, shorter);
  REQUIRE(less.status == 200);
  CHECK(answered.body.at("usage").at("prompt_tokens").get<int>() > less.body.at("usage").at("prompt_tokens").get<int>());

  // tool_choice "none": the tools are not offered (the prompt is the one without them), no call is parsed.
  json none = chat_body({{"user", "What is the weather in Paris?"}}, 4);
  const Reply plain = http.post(chat, none);
  none["tools"] = weather_tools();
  none["tool_choice"] = "none";
  const Reply without = http.post(chat, none);
  REQUIRE(plain.status == 200);
  REQUIRE(without.status == 200);
  CHECK(without.body.at("usage").at("prompt_tokens") == plain.body.at("usage").at("prompt_tokens"));
  CHECK_FALSE(without.body.at("choices").at(0).at("message").contains("tool_calls"));
  CHECK(chat_text(without) == chat_text(plain));
  none["tool_choice"] = "auto";
  const Reply offered = http.post(chat, none);
  REQUIRE(offered.status == 200);
  CHECK(offered.body.at("usage").at("prompt_tokens").get<int>() > plain.body.at("usage").at("prompt_tokens").get<int>());

  // What the server cannot honour is refused by name.
  struct Case {
    json patch;
    std::string code, param;
  };
  const json tools = weather_tools();
  const std::vector<Case> cases = {
      {{{"tools", json::array({{{"type", "custom"}, {"custom", {{"name", "x"}}}}})}}, "unsupported", "tools[0].type"},
      {{{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"strict", true}}}}})}}, "unsupported", "tools[0].function.strict"},
      {{{"tools", json::array({{{"type", "function"}, {"function", {{"description", "no name"}}}}})}}, "missing", "tools[0].function.name"},
      {{{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "fly"}}}}}}, "invalid_value", "tool_choice"},
      {{{"tools", tools}, {"tool_choice", "sometimes"}}, "invalid_value", "tool_choice"},
      {{{"tools", tools}, {"parallel_tool_calls", "yes"}}, "invalid_type", "parallel_tool_calls"},
      {{{"functions", json::array({{{"name", "f"}}})}}, "unsupported", "functions"},
      {{{"messages", json::array({{{"role", "user"}, {"content", "x"}}, {{"role", "tool"}, {"content", "r"}}})}}, "missing", "messages[1].tool_call_id"},
      {{{"messages", json::array({{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array({call})}}})}}, "invalid_value", "messages[0].tool_calls"},
      {{{"messages", json::array({{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"tool_calls", json::array({{{"type", "function"}, {"function", {{"arguments", "{}"}}}}})}}})}},
       "missing", "messages[1].tool_calls[0].function.name"},
  };
  for (const Case &c : cases) {
    json b = chat_body(kJohn, 2);
    b.merge_patch(c.patch);
    INFO(c.patch.dump());
    check_error(http.post(chat, b), 400, c.code, c.param);
  }
  // Arguments DeepSeek-V4's template cannot read (not a JSON object) are a 400 naming the messages.
  json bad_args = round;
  bad_args["messages"][1]["tool_calls"][0]["function"]["arguments"] = "not json";
  check_error(http.post(chat, bad_args), 400, "invalid_value", "messages");
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: tool calls in Kimi-K3's format", "[tools]") {
  ep::test::TempDir dir;
  const std::string model = write_kimi_model(dir);
  ep::test::ServerProcess server(EP_SERVER_EXE, {"--model", model, "--device", "cpu", "--resident-experts", "--cpu-threads", "2"});
  Http http(server.port());
  json body = chat_body({{"user", "Weather?"}}, 6);
  body["model"] = "k3-tiny";
  body["tools"] = weather_tools();
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "now"}}}};
  body["parallel_tool_calls"] = false;
  const Reply whole = http.post("/v1/chat/completions", body);
  REQUIRE(whole.status == 200);
  INFO(whole.body.dump());
  const json &msg = whole.body.at("choices").at(0).at("message");
  REQUIRE(msg.contains("tool_calls"));
  REQUIRE(msg.at("tool_calls").size() == 1);
  CHECK(msg.at("tool_calls").at(0).at("function").at("name") == "now");
  CHECK(json::parse(msg.at("tool_calls").at(0).at("function").at("arguments").get<std::string>()).is_object());
  body["stream"] = true;
  std::string content, finish;
  const json calls = streamed_tool_calls(http.stream("/v1/chat/completions", body), &content, &finish);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].at("function") == msg.at("tool_calls").at(0).at("function"));
  // A tool message answers the call by its id; Kimi-K3 names it after the call.
  json round = chat_body({{"user", "Weather?"}}, 3);
  round["model"] = "k3-tiny";
  round["tools"] = weather_tools();
  round["messages"].push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", msg.at("tool_calls")}});
  round["messages"].push_back({{"role", "tool"}, {"tool_call_id", msg.at("tool_calls").at(0).at("id")}, {"content", "noon"}});
  CHECK(http.post("/v1/chat/completions", round).status == 200);
  CHECK(server.stop() == 0);
}

TEST_CASE("ep-server: response_format json_object and json_schema, whole and streamed", "[json]") {
  ep::test::TempDir dir;
  ep::test::ServerProcess server(EP_SERVER_EXE, server_args(dir, {"--max-tokens", "400"}));
  Http http(server.port());
  const std::string chat = "/v1/chat/completions", completions = "/v1/completions";
  const json schema = json::parse(R"({
    "type": "object",
    "properties": {
      "book": {"enum": ["Genesis", "Exodus", "John"]},
      "chapter": {"type": "integer"},
      "verses": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
      "amen": {"type": "boolean"},
      "see": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}
    },
    "required": ["book", "chapter", "verses", "amen", "see"],
    "additionalProperties": false
  })");
  const json schema_format = {{"type", "json_schema"}, {"json_schema", {{"name", "verse"}, {"schema", schema}, {"strict", true}}}};
  int ended = 0;
  for (int seed = 0; seed < 8; ++seed) {
    for (const json &format : {json{{"type", "json_object"}}, schema_format}) {
      json body = chat_body(kJohn, 400);
      body["temperature"] = seed == 0 ? 0.0 : 1.0;
      body["seed"] = seed;
      body["response_format"] = format;
      INFO("seed " << seed << " " << format.at("type"));
      const Reply r = http.post(chat, body);
      REQUIRE(r.status == 200);
      const std::string text = chat_text(r);
      INFO(text);
      // The same answer streamed.
      std::string finish;
      CHECK(streamed_text(http.stream(chat, body), true, nullptr, &finish) == text);
      if (r.body.at("choices").at(0).at("finish_reason") != "stop") continue;  // ran out of tokens inside the value
      CHECK(finish == "stop");
      ++ended;
      json v;
      REQUIRE_NOTHROW(v = json::parse(text));
      CHECK(v.is_object());
      if (format.at("type") == "json_schema") CHECK(ep::testing::schema_valid(schema, v));
    }
  }
  CHECK(ended >= 8);
  // Refused by name: a keyword outside the subset (with its pointer), a bad type or name,
  // unknown fields, and the combinations the grammar cannot serve.
  struct Case {
    json format;
    json extra;
    std::string code, param, message;
  };
  json bad_schema = schema;
  bad_schema["properties"]["chapter"]["minimum"] = 1;
  const std::vector<Case> cases = {
      {{{"type", "json_schema"}, {"json_schema", {{"name", "v"}, {"schema", bad_schema}}}}, json::object(), "invalid_value",
       "response_format.json_schema.schema", "/properties/chapter/minimum"},
      {{{"type", "xml"}}, json::object(), "invalid_value", "response_format.type", "xml"},
      {{{"type", "json_schema"}}, json::object(), "missing_required_parameter", "response_format.json_schema", ""},
      {{{"type", "json_schema"}, {"json_schema", {{"name", "a b"}, {"schema", schema}}}}, json::object(), "invalid_value",
       "response_format.json_schema.name", ""},
      {{{"type", "json_schema"}, {"json_schema", {{"name", "v"}}}}, json::object(), "missing_required_parameter",
       "response_format.json_schema.schema", ""},
      {{{"type", "json_schema"}, {"json_schema", {{"name", "v"}, {"schema", schema}, {"frob", 1}}}}, json::object(), "unknown_parameter",
       "response_format.json_schema.frob", ""},
      {{{"type", "json_object"}, {"json_schema", {{"name", "v"}}}}, json::object(), "unknown_parameter", "response_format.json_schema", ""},
      {{{"type", "json_object"}}, {{"thinking", true}}, "unsupported", "response_format", "thinking"},
      {{{"type", "json_object"}}, {{"ignore_eos", true}}, "unsupported", "ignore_eos", ""},
      {{{"type", "json_object"}},
       {{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}})}},
       "unsupported", "response_format", "tools"},
  };
  for (const Case &c : cases) {
    json body = chat_body(kJohn, 4);
    body["response_format"] = c.format;
    body.merge_patch(c.extra);
    INFO(body.dump());
    const Reply r = http.post(chat, body);
    check_error(r, 400, c.code, c.param);
    if (!c.message.empty()) CHECK(r.body.at("error").at("message").get<std::string>().find(c.message) != std::string::npos);
  }
  // The legacy completions take no response_format (as OpenAI's): named as unknown.
  check_error(http.post(completions, {{"prompt", "And"}, {"max_tokens", 2}, {"response_format", {{"type", "json_object"}}}}), 400,
              "unknown_parameter", "response_format");
  // {"type": "text"} is the default.
  json text = chat_body(kJohn, 4);
  text["response_format"] = {{"type", "text"}};
  CHECK(http.post(chat, text).status == 200);
  CHECK(server.stop() == 0);
}
