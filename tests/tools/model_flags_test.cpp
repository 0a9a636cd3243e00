// The model flags shared by ep-run, ep-chat and ep-server (tools/cli/model_flags.hpp).
#include "cli/model_flags.hpp"
#include "engine/model_options.hpp"

#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace {

/// Runs @p args through ModelFlags::take; returns the arguments it did not take.
std::vector<std::string> parse(ep::cli::ModelFlags &flags, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char *> argv;
  for (std::string &a : args) argv.push_back(a.data());
  std::vector<std::string> rest;
  const int argc = static_cast<int>(argv.size());
  for (int i = 1; i < argc; ++i)
    if (!flags.take(argc, argv.data(), i)) rest.push_back(argv[static_cast<size_t>(i)]);
  return rest;
}

}  // namespace

TEST_CASE("model flags fill ep_model_options and leave other arguments alone", "[cli]") {
  ep::cli::ModelFlags flags;
  const std::vector<std::string> rest =
      parse(flags, {"--device", "cpu", "-n", "3", "--cache-mib", "1.5", "--host-cache-mib", "0", "--pack-dir", "/p",
                    "--cache-policy", "lru", "--no-overlap-reads", "--prefetch", "--no-pack-build", "--no-pack", "--staging-slots", "7",
                    "--queue-depth", "9", "--read-splits", "2", "--direct-io", "0", "--cpu-threads", "3", "--device-index", "1", "--other"});
  CHECK(rest == std::vector<std::string>{"-n", "3", "--other"});
  const ep_model_options o = flags.options();
  CHECK(o.device == EP_DEVICE_CPU);
  CHECK(o.cache_budget_bytes == 1572864u);
  CHECK(o.host_cache_bytes == 0u);
  CHECK(std::string(o.pack_dir) == "/p");
  CHECK(std::string(o.cache_policy) == "lru");
  CHECK(o.overlap_reads == 0);
  CHECK(o.prefetch == 1);
  CHECK(o.pack_build == 0);
  CHECK(o.no_pack == 1);
  CHECK(o.staging_slots == 7u);
  CHECK(o.queue_depth == 9u);
  CHECK(o.read_splits == 2u);
  CHECK(o.direct_io == 0);
  CHECK(o.cpu_threads == 3);
  CHECK(o.device_index == 1);
  CHECK(o.resident_experts == 0);

  // the older spellings still work
  ep::cli::ModelFlags old;
  CHECK(parse(old, {"--policy", "lru", "--no-overlap"}).empty());
  CHECK(std::string(old.options().cache_policy) == "lru");
  CHECK(old.options().overlap_reads == 0);

  ep::cli::ModelFlags defaults;
  ep_model_options d;
  ep_model_options_init(&d);
  const ep_model_options got = defaults.options();
  CHECK(got.pack_dir == nullptr);
  CHECK(got.cache_policy == nullptr);
  CHECK(got.device == d.device);
  CHECK(got.overlap_reads == d.overlap_reads);
  CHECK(got.direct_io == d.direct_io);
  CHECK(got.no_pack == 0);
  CHECK(got.devices == nullptr);

  // the device list is passed on as given (the library parses and checks it)
  ep::cli::ModelFlags listed;
  CHECK(parse(listed, {"--devices", "cuda:0,cuda:1"}).empty());
  CHECK(std::string(listed.options().devices) == "cuda:0,cuda:1");
}

TEST_CASE("model flags name the flag and what it takes on a bad value", "[cli]") {
  auto error = [](std::vector<std::string> args) {
    ep::cli::ModelFlags flags;
    try {
      parse(flags, std::move(args));
    } catch (const ep::cli::FlagError &e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(error({"--device", "tpu"}) == "--device must be auto, cpu or cuda, not 'tpu'");
  CHECK(error({"--cache-mib", "-1"}) == "--cache-mib takes a size in MiB (0 or more), not '-1'");
  CHECK(error({"--cache-mib", "12abc"}).find("--cache-mib takes") == 0);
  CHECK(error({"--host-cache-mib", "-1"}) == "--host-cache-mib takes a size in MiB (0 or more), not '-1'");
  CHECK(error({"--host-cache-mib", "nan"}).find("--host-cache-mib takes") == 0);
  CHECK(error({"--staging-slots", "-2"}).find("--staging-slots takes a whole number") == 0);
  CHECK(error({"--direct-io", "2"}) == "--direct-io takes a whole number from 0 to 1, not '2'");
  CHECK(error({"--queue-depth", "99999999999999999999"}).find("--queue-depth takes") == 0);
  CHECK(error({"--pack-dir"}) == "missing value after --pack-dir");
  CHECK(error({"--cpu-threads", "4x"}) == "--cpu-threads takes a whole number, not '4x'");
}

TEST_CASE("every model option has a flag, and 0 means what the library's 0 means", "[cli]") {
  std::vector<std::string> fields;
#define EP_FIELD_NAME(c_field, member) fields.push_back(#c_field);
  EP_MODEL_OPTION_FIELDS(EP_FIELD_NAME)
#undef EP_FIELD_NAME
  for (const std::string &field : fields) {
    bool listed = false;
    for (const ep::cli::ModelFlag &f : ep::cli::kModelFlags) listed = listed || (field == f.field && *f.help != '\0');
    INFO(field);
    CHECK(listed);
  }
  ep::cli::ModelFlags flags;
  parse(flags, {"--cache-mib", "0", "--host-cache-mib", "0", "--cpu-threads", "0"});
  ep_model_options d;
  ep_model_options_init(&d);
  CHECK(flags.options().cache_budget_bytes == d.cache_budget_bytes);
  CHECK(flags.options().host_cache_bytes == d.host_cache_bytes);
  CHECK(flags.options().cpu_threads == d.cpu_threads);
  // the range of a value is the library's to check, once: the flag passes it on
  ep::cli::ModelFlags many;
  parse(many, {"--cpu-threads", "5000"});
  CHECK(many.options().cpu_threads == 5000);
  const std::string usage = ep::cli::model_flags_usage();
  CHECK(usage.find("--cache-policy NAME") != std::string::npos);
  CHECK(usage.find("--policy") == std::string::npos);
}

TEST_CASE("docs/c-api.md's options table has a row for every option and names its flag", "[cli]") {
  const std::string path = std::string(EP_TEST_DATA_DIR) + "/../../docs/c-api.md";
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("| `", 0) == 0) rows.push_back(line);
  for (const ep::cli::ModelFlag &f : ep::cli::kModelFlags) {
    const std::string field = std::string("| `") + f.field + "`";
    bool found = false;
    for (const std::string &row : rows)
      found = found || (row.rfind(field, 0) == 0 && row.find(std::string("`") + f.name) != std::string::npos);
    INFO(path << ": no row for " << f.field << " naming " << f.name);
    CHECK(found);
  }
}
