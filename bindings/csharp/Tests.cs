// Test runner of the C# binding (no test framework needed: mono's mcs + mono). Prints one line
// per test and the counts; exits 1 on any failure. Environment as the other bindings' tests
// (set by scripts/test-bindings): EP_TEST_MODEL, EP_TEST_PROMPT, EP_TEST_SEED, EP_TEST_TEMP,
// EP_TEST_EXPECTED, EP_TEST_DIR.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using ExpertPack;

static class Tests
{
    static int passed, failed;

    static string Env(string name)
    {
        var v = Environment.GetEnvironmentVariable(name);
        if (string.IsNullOrEmpty(v)) throw new Exception(name + " is not set: run scripts/test-bindings");
        return v;
    }

    static int[] Ids(string s) { return s.Split(',').Where(x => x.Trim() != "").Select(x => int.Parse(x.Trim())).ToArray(); }

    static void Require(bool cond, string what) { if (!cond) throw new Exception("check failed: " + what); }

    static int skipped;

    /// <summary>A test that may be skipped: it returns the reason, or null when it ran.</summary>
    static void RunText(string name, Func<string> test)
    {
        try
        {
            var reason = test();
            if (reason == null) { passed++; Console.WriteLine("PASS " + name); }
            else { skipped++; Console.WriteLine("SKIP " + name + ": " + reason); }
        }
        catch (EntryPointNotFoundException) { skipped++; Console.WriteLine("SKIP " + name + ": the library has no text API"); }
        catch (Exception e) { failed++; Console.WriteLine("FAIL " + name + ": " + e); }
    }

    static void Run(string name, Action test)
    {
        try { test(); passed++; Console.WriteLine("PASS " + name); }
        catch (Exception e) { failed++; Console.WriteLine("FAIL " + name + ": " + e); }
    }

    /// <summary>A text test on the model and its own tokenizer; skipped when the model has none.</summary>
    static Func<string> WithModelTokenizer(Func<Model, Tokenizer, string> test)
    {
        return () =>
        {
            using (var model = new Model(ModelPath))
            {
                Tokenizer tok;
                try { tok = model.Tokenizer(); }
                catch (ExpertPackException e) when (e.Status == Status.NotFound) { return "the synthetic model has no tokenizer: " + e.NativeMessage; }
                using (tok) return test(model, tok);
            }
        };
    }

    static string ModelPath { get { return Env("EP_TEST_MODEL"); } }
    static int[] Prompt { get { return Ids(Env("EP_TEST_PROMPT")); } }
    static int[] Expected { get { return Ids(Env("EP_TEST_EXPECTED")); } }
    static GenerateOptions Options(uint n)
    {
        return new GenerateOptions
        {
            MaxNewTokens = n, Seed = ulong.Parse(Env("EP_TEST_SEED")),
            Temperature = float.Parse(Env("EP_TEST_TEMP"), System.Globalization.CultureInfo.InvariantCulture),
        };
    }

    static int Main()
    {
        Run("version_and_status", () =>
        {
            var v = Library.Version.Split('.').Select(uint.Parse).ToArray();
            Require(Library.VersionNumber == v[0] * 10000 + v[1] * 100 + v[2], "version number");
            Require(Library.StatusName(Status.NotFound) == "EP_ERR_NOT_FOUND", "status name");
            Require(Library.CudaDeviceCount() >= 0, "cuda count");
        });

        Run("stream_8_tokens_matches_the_c_api", () =>
        {
            using (var model = new Model(ModelPath))
            using (var s = model.NewSession())
            {
                var info = model.Info();
                Require(info.Architecture == "deepseek4" && info.VocabSize > 0, "model info");
                // the GPU when there is one (Auto), else the CPU
                Require(Library.CudaDeviceCount() > 0 || (info.Device == Device.Cpu && info.DeviceIndex == -1),
                        "no GPU, yet device " + info.Device + " index " + info.DeviceIndex);
                Require(model.PackPath.EndsWith(".epk"), "pack path " + model.PackPath);
                var streamed = new List<int>();
                var indices = new List<uint>();
                var g = s.Generate(Prompt, Options(8), (tok, idx) => { streamed.Add(tok); indices.Add(idx); return true; });
                Require(g.Tokens.SequenceEqual(Expected), "tokens " + string.Join(",", g.Tokens) + " vs C API " + string.Join(",", Expected));
                Require(streamed.SequenceEqual(Expected), "streamed tokens");
                Require(indices.SequenceEqual(Enumerable.Range(0, 8).Select(i => (uint)i)), "indices");
                Require(!g.Cancelled && g.Stats.GeneratedTokens == 8 && g.Stats.PromptTokens == Prompt.Length, "stats");
                // a fresh model reads its experts from the pack during the prompt
                Require(g.Stats.PrefillExpertBytes > 0 && g.Stats.DecodeExpertBytes.HasValue, "expert bytes");
                Require(s.Length == (ulong)(Prompt.Length + 8), "session length");
                var st = model.StoreStats();
                Require(st.Acquires > 0 && st.CacheHits + st.CacheMisses > 0, "store stats");
            }
        });

        Run("callback_cancels_and_exceptions_propagate", () =>
        {
            using (var model = new Model(ModelPath))
            using (var s = model.NewSession())
            {
                var g = s.Generate(Prompt, Options(8), (tok, idx) => idx < 2);
                Require(g.Cancelled && g.Tokens.SequenceEqual(Expected.Take(3)), "cancel after 3 tokens");
                Require(s.Length == (ulong)(Prompt.Length + 3), "length after cancel");
                s.Reset();
                bool thrown = false;
                try { s.Generate(Prompt, Options(4), (tok, idx) => { throw new InvalidOperationException("from callback"); }); }
                catch (InvalidOperationException) { thrown = true; }
                Require(thrown, "callback exception rethrown");
            }
        });

        Run("score_agrees_with_greedy", () =>
        {
            using (var model = new Model(ModelPath))
            {
                int greedy;
                using (var s = model.NewSession()) greedy = s.Generate(Prompt, new GenerateOptions { MaxNewTokens = 1 }).Tokens[0];
                using (var s = model.NewSession())
                {
                    var sc = s.Score(Prompt, 3);
                    int last = sc.Rows - 1;
                    Require(sc.Ids[last * 3] == greedy, "top-1 of the last row is the greedy token");
                    Require(sc.Logits[last * 3] >= sc.Logits[last * 3 + 1], "descending");
                }
                using (var s = model.NewSession())
                {
                    var full = s.Score(Prompt.Take(2).ToArray());
                    Require(full.Width == model.Info().VocabSize && full.Logits.Length == 2 * full.Width, "full logits");
                }
            }
        });

        Run("no_pack_reads_the_source_with_the_same_tokens", () =>
        {
            // the GGUF the pack was built from, read through a source index in PackDir
            var dir = Path.Combine(Env("EP_TEST_DIR"), "csharp-index");
            var opts = new ModelOptions { Device = Device.Cpu, NoPack = true, PackDir = dir };
            using (var model = new Model(Env("EP_TEST_SOURCE"), opts))
            using (var s = model.NewSession())
            {
                Require(model.PackPath.EndsWith(".epx"), "source index path " + model.PackPath);
                var g = s.Generate(Prompt, Options(8), (tok, idx) => true);
                Require(g.Tokens.SequenceEqual(Expected), "tokens " + string.Join(",", g.Tokens) + " vs C API " + string.Join(",", Expected));
            }
            Require(Directory.GetFiles(dir, "*.epk").Length == 0, "a pack was written");
            try
            {
                new Model(ModelPath, new ModelOptions { NoPack = true });
                throw new Exception("no exception");
            }
            catch (ExpertPackException e)
            {
                Require(e.Status == Status.InvalidArgument, "a pack given with NoPack: " + e.Status);
            }
        });

        Run("missing_model_throws_not_found_naming_the_file", () =>
        {
            var missing = Path.Combine(Env("EP_TEST_DIR"), "no-such-model.gguf");
            try
            {
                new Model(missing, new ModelOptions { PackBuild = false });
                throw new Exception("no exception");
            }
            catch (ExpertPackException e)
            {
                Require(e.Status == Status.NotFound, "status " + e.Status);
                Require(e.NativeMessage.Contains("no-such-model.gguf"), "message names the file: " + e.NativeMessage);
                Require(e.Message.StartsWith("EP_ERR_NOT_FOUND: "), "message " + e.Message);
            }
        });

        Run("bad_token_and_disposed_handles", () =>
        {
            var model = new Model(ModelPath);
            var s = model.NewSession();
            try { s.Generate(new[] { 100000000 }); throw new Exception("no exception"); }
            catch (ExpertPackException e) { Require(e.Status == Status.InvalidArgument, "status " + e.Status); }
            model.Dispose();              // the session still holds the model
            Require(s.Length == 0, "session usable after its model was disposed");
            s.Dispose();                  // closes the session, then the model
            bool threw = false;
            try { var n = s.Length; } catch (ObjectDisposedException) { threw = true; }
            Require(threw, "use after dispose throws ObjectDisposedException");
        });

        Run("pack_info", () =>
        {
            using (var p = new Pack(ModelPath, Validation.Full))
            {
                var info = p.Info();
                Require(info.FormatVersion == 1 && info.NumLayers > 0, "pack info");
                var o = p.Object(0, 0);
                Require(o.Offset == info.DataStart && o.Offset % info.Alignment == 0, "object 0,0");
                try { p.Object(info.NumLayers, 0); throw new Exception("no exception"); }
                catch (ExpertPackException e) { Require(e.Status == Status.InvalidArgument, "status"); }
            }
        });

        Run("log_callback", () =>
        {
            var seen = new List<string>();
            Library.SetLogCallback((level, msg) => { lock (seen) seen.Add(msg); }, LogLevel.Info);
            using (new Model(ModelPath)) { }
            Library.SetLogCallback(null, LogLevel.Warn);
            lock (seen) Require(seen.Count > 0, "no log message at INFO while opening a model");
        });

        // The 0.2 session API: sampling, forks, several sessions appended in one pass.
        Run("sample_loop_matches_the_c_api", () =>
        {
            using (var model = new Model(ModelPath))
            using (var s = model.NewSession())
            {
                s.Append(Prompt);
                Require(s.Tokens.SequenceEqual(Prompt), "tokens after the prompt");
                var got = new List<int>();
                for (int i = 0; i < 8; i++) { got.Add(s.Sample(Options(8))); s.Append(new[] { got[i] }); }
                Require(got.SequenceEqual(Expected), "sampled " + string.Join(",", got));
                Require(s.Tokens.SequenceEqual(Prompt.Concat(Expected)), "tokens after the loop");
            }
        });

        Run("logprobs_and_logit_bias", () =>
        {
            using (var model = new Model(ModelPath))
            using (var s = model.NewSession())
            {
                s.Append(Prompt);
                var lp = s.SampleLogprobs(5);
                Require(lp.TopTokens.Length == 5 && lp.TopTokens[0] == lp.Token && lp.TopLogprobs[0] == lp.Logprob,
                        "greedy is the first alternative");
                for (int i = 1; i < 5; i++) Require(lp.TopLogprobs[i] <= lp.TopLogprobs[i - 1], "alternatives sorted");
                int forced = lp.Token == 7 ? 8 : 7;
                var biased = new GenerateOptions { LogitBias = new Dictionary<int, float> { { forced, 100 } } };
                Require(s.Sample(biased) == forced, "+100 forces the token");
                var withBias = s.SampleLogprobs(5, biased);
                Require(withBias.Token == forced && withBias.TopTokens.SequenceEqual(lp.TopTokens) &&
                        withBias.TopLogprobs.SequenceEqual(lp.TopLogprobs), "a bias does not move the log-probabilities");
                try { s.Sample(new GenerateOptions { LogitBias = new Dictionary<int, float> { { forced, 101 } } }); throw new Exception("101: no exception"); }
                catch (ExpertPackException e) { Require(e.Status == Status.InvalidArgument, "101: " + e.Message); }
            }
        });

        Run("sample_many_equals_each_alone", () =>
        {
            using (var model = new Model(ModelPath))
            {
                var prompts = new[] { Prompt, Prompt.Take(3).ToArray(), new[] { Prompt[4], Prompt[2], Prompt[0] } };
                var options = new[]
                {
                    new GenerateOptions(),
                    new GenerateOptions { Temperature = 0.9f, TopP = 0.8f, Seed = 3 },
                    new GenerateOptions { Temperature = 1.2f, Seed = 4, RepetitionPenalty = 1.3f,
                                          LogitBias = new Dictionary<int, float> { { 7, 2 } } },
                };
                var tops = new int?[] { 3, null, 0 };
                var batched = prompts.Select(_ => model.NewSession()).ToArray();
                var alone = prompts.Select(_ => model.NewSession()).ToArray();
                try
                {
                    Session.AppendMany(batched, prompts);
                    Session.AppendMany(alone, prompts);
                    for (int step = 0; step < 5; step++)
                    {
                        var got = Session.SampleMany(batched, options, tops);
                        var next = new int[prompts.Length][];
                        for (int i = 0; i < prompts.Length; i++)
                        {
                            var want = tops[i].HasValue ? alone[i].SampleLogprobs(tops[i].Value, options[i])
                                                        : new TokenLogprobs { Token = alone[i].Sample(options[i]), TopTokens = new int[0],
                                                                              TopLogprobs = new float[0] };
                            Require(got[i].Token == want.Token && got[i].Logprob == want.Logprob &&
                                    got[i].TopTokens.SequenceEqual(want.TopTokens) && got[i].TopLogprobs.SequenceEqual(want.TopLogprobs),
                                    "step " + step + " session " + i + ": batched " + got[i].Token + ", alone " + want.Token);
                            next[i] = new[] { want.Token };
                        }
                        Session.AppendMany(batched, next);
                        Session.AppendMany(alone, next);
                    }
                    using (var empty = model.NewSession())
                    {
                        try { Session.SampleMany(new[] { batched[0], empty }); throw new Exception("a session without tokens: no exception"); }
                        catch (ExpertPackException e)
                        {
                            Require(e.Status == Status.InvalidArgument && e.Message.Contains("sessions[1]"), "no tokens: " + e.Message);
                        }
                    }
                }
                finally
                {
                    foreach (var s in batched.Concat(alone)) s.Dispose();
                }
            }
        });

        Run("fork_continues_as_the_original", () =>
        {
            using (var model = new Model(ModelPath))
            using (var s = model.NewSession())
            {
                s.Append(Prompt);
                Generation fromFork;
                using (var f = s.Fork())
                {
                    Require(f.Tokens.SequenceEqual(Prompt), "the fork's tokens");
                    // the fork copies the logits and the sampler position: both continue to the C API's tokens
                    fromFork = f.Generate(new int[0], Options(8));
                    Require(s.Tokens.SequenceEqual(Prompt), "appending to the fork changed the original");
                }
                var fromOriginal = s.Generate(new int[0], Options(8));
                Require(fromFork.Tokens.SequenceEqual(Expected), "fork " + string.Join(",", fromFork.Tokens));
                Require(fromOriginal.Tokens.SequenceEqual(Expected), "original " + string.Join(",", fromOriginal.Tokens));
            }
        });

        Run("append_many_matches_each_alone", () =>
        {
            using (var model = new Model(ModelPath))
            {
                var prompts = new[] { Prompt, Prompt.Reverse().Take(5).ToArray() };
                var alone = prompts.Select(p =>
                {
                    using (var s = model.NewSession()) return s.Generate(p, new GenerateOptions { MaxNewTokens = 6 }).Tokens;
                }).ToArray();
                Require(!alone[0].SequenceEqual(alone[1]), "the two prompts should continue differently");
                using (var a = model.NewSession())
                using (var b = model.NewSession())
                {
                    var ss = new[] { a, b };
                    Session.AppendMany(ss, prompts);
                    var batched = new[] { new List<int>(), new List<int>() };
                    for (int step = 0; step < 6; step++)
                    {
                        var next = Session.StepBatch(ss);
                        batched[0].Add(next[0]);
                        batched[1].Add(next[1]);
                    }
                    for (int i = 0; i < 2; i++)
                    {
                        Require(batched[i].SequenceEqual(alone[i]), "batched " + string.Join(",", batched[i]) + " alone " + string.Join(",", alone[i]));
                        Require(ss[i].Tokens.SequenceEqual(prompts[i].Concat(batched[i])), "tokens of session " + i);
                    }
                    Action<Action, string> refused = (call, what) =>
                    {
                        try { call(); throw new Exception(what + ": no exception"); }
                        catch (ExpertPackException e) { Require(e.Status == Status.InvalidArgument, what + ": " + e.Message); }
                    };
                    refused(() => Session.AppendMany(new[] { a, a }, new[] { new[] { 1 }, new[] { 2 } }), "one session twice");
                    refused(() => Session.AppendMany(new[] { a, b }, new[] { new[] { 1 }, new int[0] }), "no tokens for one");
                    refused(() => a.Append(new[] { 100000000 }), "a token outside the vocabulary");
                    using (var empty = model.NewSession())
                    {
                        refused(() => empty.Sample(), "sampling an empty session");
                        Require(empty.Tokens.Length == 0, "empty session's tokens");
                    }
                    Require(a.Tokens.SequenceEqual(prompts[0].Concat(batched[0])), "refused calls changed the session");
                }
            }
        });

        Run("host_tier_options_and_new_store_counters", () =>
        {
            ulong slot, half;
            using (var probe = new Model(ModelPath))
            {
                var st = probe.StoreStats();
                Require(st.HostHits != null && st.HostMisses != null && st.Demotions != null && st.HostResidentBytes != null &&
                        st.HostSlots == 0 && st.PrefetchIssued == 0 && st.PrefetchUsed == 0, "new counters without a tier");
                var info = probe.Info();
                slot = st.SlotBytes;
                half = info.NumLayers * info.NumExperts / 2;
            }
            // a cache for half the experts, a host tier below it, prefetch and LRU: results are
            // bitwise the same as without any of it
            var o = new ModelOptions { Device = Device.Cpu, CacheBudgetBytes = slot * half, HostCacheBytes = slot * half,
                                       OverlapReads = false, Prefetch = true, CachePolicy = "lru" };
            using (var model = new Model(ModelPath, o))
            {
                using (var s = model.NewSession())
                {
                    var g = s.Generate(Prompt, Options(8));
                    Require(g.Tokens.SequenceEqual(Expected), "tokens with a host tier: " + string.Join(",", g.Tokens));
                }
                var t = model.StoreStats();
                Require(t.HostSlots > 0 && t.Demotions > 0 && t.HostHits > 0 && t.HostHits + t.HostMisses == t.CacheMisses,
                        "host tier counters " + t.HostSlots + " " + t.Demotions + " " + t.HostHits + " " + t.HostMisses);
                Require(t.PrefetchIssued > 0 && t.PrefetchUsed <= t.PrefetchIssued, "prefetch counters");
            }
            try { new Model(ModelPath, new ModelOptions { CachePolicy = "no-such-policy" }); throw new Exception("no exception"); }
            catch (ExpertPackException e) { Require(e.Status == Status.InvalidArgument && e.NativeMessage.Contains("no-such-policy"), e.Message); }
        });

        // The text API: EP_TEST_TOKENIZER (a tokenizer.json) when the script found one; a library
        // without the text API skips these (EntryPointNotFoundException).
        var tokPath = Environment.GetEnvironmentVariable("EP_TEST_TOKENIZER");
        RunText("tokenizer_round_trip_and_chat", () =>
        {
            if (string.IsNullOrEmpty(tokPath)) return "EP_TEST_TOKENIZER is not set";
            using (var tok = new Tokenizer(tokPath))
            {
                var text = "Hello, world! Grüße — 你好";
                var ids = tok.Encode(text);
                Require(ids.Length > 0 && tok.Decode(ids) == text, "round trip");
                var r = tok.RenderChat(new[] { new ChatMessage("system", "Be brief."), new ChatMessage("user", "Hi there") },
                                       new ChatOptions { Template = ChatTemplate.DeepseekV4 });
                Require(r.Contains("Be brief.") && r.Contains("Hi there"), "rendered chat: " + r);
            }
            try { new Tokenizer(Path.Combine(Env("EP_TEST_DIR"), "no-such-tokenizer.json")); throw new Exception("no exception"); }
            catch (ExpertPackException e) { Require(e.Status == Status.NotFound && e.NativeMessage.Contains("no-such-tokenizer.json"), e.Message); }
            return null;
        });
        RunText("generate_text_streams_pieces", WithModelTokenizer((model, tok) =>
        {
            using (var s = model.NewSession())
            {
                var o = Options(8);
                o.IgnoreEos = true;
                var sb = new System.Text.StringBuilder();
                var g = s.GenerateText(tok, "Hello", o, piece => { sb.Append(piece); return true; });
                Require(sb.ToString() == g.Text && g.Stats.GeneratedTokens == 8 && g.Stats.SessionTokens == s.Length, "text generation");
                // The C API's text (ep-run --prompt Hello, and --chat --prompt Hi) for the same options.
                var textFile = Environment.GetEnvironmentVariable("EP_TEST_EXPECTED_TEXT_FILE");
                if (!string.IsNullOrEmpty(textFile))
                    Require(g.Text == File.ReadAllText(textFile, System.Text.Encoding.UTF8), "text vs C API: " + g.Text);
                s.Reset();
                var c = s.GenerateChat(tok, new[] { new ChatMessage("user", "Hi") }, null, o);
                var chatFile = Environment.GetEnvironmentVariable("EP_TEST_EXPECTED_CHAT_FILE");
                if (!string.IsNullOrEmpty(chatFile))
                    Require(c.Text == File.ReadAllText(chatFile, System.Text.Encoding.UTF8), "chat vs C API: " + c.Text);
            }
            return null;
        }));

        RunText("text_stream_equals_generate_text_and_stops_at_a_stop_string", WithModelTokenizer((model, tok) =>
        {
            // n tokens sampled after "Hello" by the host, through a TextStream
            Func<uint, string[], Tuple<string, bool>> hostLoop = (n, stops) =>
            {
                using (var s = model.NewSession())
                using (var ts = new TextStream(tok, stops))
                {
                    s.Append(tok.Encode("Hello", addSpecial: true));
                    var sb = new System.Text.StringBuilder();
                    for (uint i = 0; i < n && !ts.Stopped; i++)
                    {
                        int next = s.Sample(Options(n));
                        sb.Append(ts.Push(next));
                        s.Append(new[] { next });
                    }
                    if (!ts.Stopped) sb.Append(ts.Finish());
                    Require(sb.ToString() == ts.Text, "pieces vs Text");
                    return Tuple.Create(ts.Text, ts.Stopped);
                }
            };
            Func<uint, string[], string> generateText = (n, stops) =>
            {
                var o = Options(n);
                o.IgnoreEos = true;
                o.StopStrings = stops;
                using (var s = model.NewSession()) return s.GenerateText(tok, "Hello", o).Text;
            };
            var plain = hostLoop(8, new string[0]);
            Require(!plain.Item2 && plain.Item1 == generateText(8, new string[0]), "stream vs GenerateText: " + plain.Item1);
            var textFile = Environment.GetEnvironmentVariable("EP_TEST_EXPECTED_TEXT_FILE");
            if (!string.IsNullOrEmpty(textFile))
                Require(plain.Item1 == File.ReadAllText(textFile, System.Text.Encoding.UTF8), "stream vs C API: " + plain.Item1);
            var full = hostLoop(24, new string[0]).Item1;
            Require(full.Length > 8, "too little text to pick a stop string from: " + full);
            var stop = full.Substring(full.Length / 2, 3);
            var cut = hostLoop(24, new[] { stop });
            Require(cut.Item2 && cut.Item1 == full.Substring(0, full.IndexOf(stop, StringComparison.Ordinal)), "stopped text: " + cut.Item1);
            Require(cut.Item1 == generateText(24, new[] { stop }), "stopped stream vs GenerateText");
            try { new TextStream(tok, ""); throw new Exception("no exception"); }
            catch (ExpertPackException e) { Require(e.Status == Status.InvalidArgument, e.Message); }
            return null;
        }));

        Console.WriteLine(string.Format("csharp: {0} passed, {1} failed, {2} skipped", passed, failed, skipped));
        return failed == 0 ? 0 : 1;
    }
}
