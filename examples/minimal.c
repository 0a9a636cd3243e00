/* minimal.c: libexpertpack end to end in C: open a model, its tokenizer, chat, stream, close.
 *   cc minimal.c $(pkg-config --cflags --libs expertpack) && ./a.out MODEL.gguf "Hello!"   */
#include <expertpack/expertpack.h>

#include <stdio.h>

static int print_piece(const char *piece, size_t length, void *payload) {
  (void)payload;
  fwrite(piece, 1, length, stdout);
  fflush(stdout);
  return 0; /* non-zero would stop the answer */
}

static int fail(const char *what, ep_status st) {
  fprintf(stderr, "%s: %s (%s)\n", what, ep_last_error(), ep_status_str(st));
  return 1;
}

int main(int argc, char **argv) {
  ep_model *model = NULL;
  ep_tokenizer *tok = NULL;
  ep_session *session = NULL;
  ep_model_options mopt;
  ep_generate_options gen;
  ep_generate_stats stats;
  ep_chat_message messages[2];
  ep_status st;
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL MESSAGE\n", argv[0]);
    return 2;
  }
  ep_model_options_init(&mopt); /* defaults: best device, pack built on first use */
  if ((st = ep_model_open(&model, argv[1], &mopt)) != EP_OK) return fail("open model", st);
  if ((st = ep_tokenizer_open_model(&tok, model)) != EP_OK) return fail("open tokenizer", st);
  if ((st = ep_session_open(&session, model)) != EP_OK) return fail("open session", st);

  messages[0].role = "system";
  messages[0].content = "You are a helpful assistant.";
  messages[0].reasoning_content = NULL;
  messages[1].role = "user";
  messages[1].content = argv[2];
  messages[1].reasoning_content = NULL;
  ep_generate_options_init(&gen);
  gen.max_new_tokens = 32;
  gen.temperature = 0.7f;
  gen.seed = 42;
  ep_generate_stats_init(&stats);
  st = ep_generate_chat(&stats, session, tok, messages, 2, NULL, &gen, print_piece, NULL);
  if (st != EP_OK) return fail("generate", st);
  printf("\n[%u prompt tokens, %u generated, %.1f tokens/s]\n", stats.prompt_tokens, stats.generated_tokens,
         stats.decode_tokens_per_second);

  ep_session_close(session);
  ep_tokenizer_close(tok);
  ep_model_close(model);
  return 0;
}
