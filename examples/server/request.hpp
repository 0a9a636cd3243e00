// A request's body as the chat and completion endpoints read it: JSON parsed under limits, every
// field checked (types, ranges, parameters the server does not act on refused by name), the
// conversation rendered by the model's chat template and tokenized, into the JobRequest the
// scheduler runs. No HTTP here: the fuzz target tests/fuzz/request_fuzz.cpp drives it directly.
#pragma once

#include <expertpack/expertpack.h>

#include "job.hpp"
#include "tool_calls.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace ep_server {

struct Limits {
  size_t max_body_bytes = 4u << 20;  ///< request body
  uint32_t max_prompt_tokens = 8192; ///< tokens of a rendered prompt
  uint32_t max_tokens = 0;           ///< max_tokens a request may ask for, and the most it gets without one (0: no limit but
                                     ///< the context length and the KV budget: KvAdmission::default_max_tokens)
  size_t max_stop = 16;              ///< stop strings
  size_t max_json_depth = 64;        ///< nesting of the request's JSON
  uint32_t max_n = 8;                ///< answers (n) of one request
};

/// What parsing a request needs to know of the model and the server's defaults.
struct RequestContext {
  std::string model_name;            ///< the one model id the server answers to
  const ep_tokenizer *tokenizer = nullptr;
  uint32_t vocab_size = 0;           ///< the model's: a token id prompt is checked against it
  ep_chat_template chat_template = EP_CHAT_TEMPLATE_NONE;  ///< NONE: no chat endpoint
  int thinking = -1;                 ///< chat thinking when a request does not say: 1, 0, -1 the template's default
  float temperature = 1.0f;          ///< when a request does not say
  float top_p = 1.0f;
  Limits limits;
};

/// A request the API refuses: becomes an OpenAI-style error object.
struct ApiError {
  int status;
  std::string message;
  std::string param;  ///< empty: null
  std::string code;   ///< empty: null
};

/// A parsed generation request.
struct ParsedRequest {
  JobRequest job;
  bool stream = false;
  bool include_usage = false;
  bool tools = false;                  ///< parse tool calls out of the content (tools offered, tool_choice not none)
  ToolFormat tool_format = ToolFormat::deepseek_v4;
  bool parallel_tool_calls = true;
  std::string tool_prime;              ///< the prompt's forced call opening, from the section opener on (ToolCallParser::prime)
};

/// POST /v1/chat/completions: @p body parsed, checked and rendered; throws ApiError.
ParsedRequest parse_chat_request(const std::string &body, const RequestContext &ctx);
/// POST /v1/completions: @p body parsed and checked; throws ApiError.
ParsedRequest parse_completion_request(const std::string &body, const RequestContext &ctx);

/// POST /tokenize: {"content", "add_special" (false), "parse_special" (true)} -> {"tokens": [ids]};
/// throws ApiError.
nlohmann::json tokenize_request(const std::string &body, const RequestContext &ctx);
/// POST /detokenize: {"tokens": [ids], "skip_special" (false)} -> {"content": text}; throws ApiError.
nlohmann::json detokenize_request(const std::string &body, const RequestContext &ctx);

/// Whether the JSON text nests deeper than @p max_depth (scanned before parsing, so a deeply
/// nested body is refused without building it).
bool json_too_deep(const std::string &text, size_t max_depth);

}  // namespace ep_server
