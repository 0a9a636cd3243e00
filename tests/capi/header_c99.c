/* Compiled as strict C99 with -Wall -Wextra -pedantic -Werror: the public header must be
   plain C. Also calls a few functions so the link against the shared library is real. */
#include <expertpack/expertpack.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  ep_log_options options;
  int32_t devices = -1;
  ep_log_options_init(&options);
  if (options.struct_size != sizeof(ep_log_options)) return 1;
  if (ep_version_number() != EP_VERSION_NUMBER) {
    fprintf(stderr, "header %d, library %u\n", EP_VERSION_NUMBER, ep_version_number());
    return 1;
  }
  if (ep_log_configure(NULL) != EP_ERR_INVALID_ARGUMENT) return 1;
  if (strstr(ep_last_error(), "options") == NULL) return 1;
  if (ep_cuda_device_count(&devices) != EP_OK || devices < 0) return 1;
  {
    ep_pack *pack = NULL;
    ep_pack_open_options pack_options;
    ep_pack_open_options_init(&pack_options);
    if (ep_pack_open(&pack, "/nonexistent/none.epk", &pack_options) != EP_ERR_NOT_FOUND || pack != NULL) return 1;
    ep_pack_close(NULL);
  }
  {
    ep_tokenizer *tok = NULL;
    ep_chat_options chat;
    ep_generate_options gen;
    size_t n = 1;
    ep_chat_options_init(&chat);
    ep_generate_options_init(&gen);
    if (chat.thinking != -1 || chat.add_generation_prompt != 1 || gen.repetition_penalty != 1.0f) return 1;
    if (ep_tokenizer_open(&tok, "/nonexistent/tokenizer.json") != EP_ERR_NOT_FOUND || tok != NULL) return 1;
    if (ep_tokenize(NULL, 0, &n, NULL, "a", 1, 0) != EP_ERR_INVALID_ARGUMENT) return 1;
    ep_tokenizer_close(NULL);
  }
  {
    /* the appended fields are plain C members, zeroed by the _init functions */
    ep_model_properties props;
    ep_generate_stats stats;
    ep_model_properties_init(&props);
    ep_generate_stats_init(&stats);
    if (props.struct_size != sizeof(ep_model_properties) || props.device != EP_DEVICE_AUTO || props.device_index != 0) return 1;
    if (stats.struct_size != sizeof(ep_generate_stats) || stats.prefill_expert_bytes != 0 || stats.decode_expert_bytes != 0) return 1;
  }
  printf("C99 consumer: expertpack %s, %d CUDA device(s)\n", ep_version_string(), (int)devices);
  return 0;
}
