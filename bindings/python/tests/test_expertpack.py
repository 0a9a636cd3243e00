"""Tests of the Python binding against the small synthetic model that scripts/test-bindings makes.

Environment (set by scripts/test-bindings): EP_TEST_MODEL (an Expert Pack of the synthetic model),
EP_TEST_PROMPT, EP_TEST_SEED, EP_TEST_TEMP, EP_TEST_EXPECTED (the 8 ids ep-run generated for
them through the C API), EP_TEST_DIR (a scratch folder)."""
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import expertpack as ep  # noqa: E402


def env(name):
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(f"{name} is not set: run scripts/test-bindings")
    return value


def ids(text):
    return [int(x) for x in text.split(",") if x.strip()]


def load_fixture(test):
    """Sets the fixture's prompt, seed, temperature and the C API's expected ids on a test."""
    test.prompt = ids(env("EP_TEST_PROMPT"))
    test.seed = int(env("EP_TEST_SEED"))
    test.temp = float(env("EP_TEST_TEMP"))
    test.expected = ids(env("EP_TEST_EXPECTED"))


class CoreTest(unittest.TestCase):
    def test_version(self):
        self.assertEqual(ep.version_number() // 10000, 0)
        major, minor, patch = (int(x) for x in ep.version().split("."))
        self.assertEqual(ep.version_number(), major * 10000 + minor * 100 + patch)

    def test_status_strings(self):
        self.assertEqual(ep.status_str(ep.Status.NOT_FOUND), "EP_ERR_NOT_FOUND")
        self.assertEqual(ep.status_str(0), "EP_OK")

    def test_cuda_count(self):
        self.assertGreaterEqual(ep.cuda_device_count(), 0)

    def test_log_callback(self):
        seen = []
        lock = threading.Lock()

        def sink(level, message):
            with lock:
                seen.append((level, message))
        ep.set_log_callback(sink, ep.LogLevel.INFO)
        try:
            with ep.Model(env("EP_TEST_MODEL")):
                pass
        finally:
            ep.set_log_callback(None, ep.LogLevel.WARN)
        self.assertTrue(seen, "no log message at INFO while opening a model")
        self.assertTrue(all(isinstance(m, str) and m for _, m in seen))


class ModelTest(unittest.TestCase):
    def setUp(self):
        self.model = ep.Model(env("EP_TEST_MODEL"), cache_budget_bytes=0)
        load_fixture(self)

    def tearDown(self):
        self.model.close()

    def test_info(self):
        info = self.model.info()
        self.assertEqual(info.architecture, "deepseek4")
        self.assertGreater(info.vocab_size, 0)
        self.assertTrue(self.model.pack_path.endswith(".epk"))
        # where the model runs: the GPU when there is one ("auto"), else the CPU
        if ep.cuda_device_count() == 0:
            self.assertEqual((info.device, info.device_index), ("cpu", -1))
        else:
            self.assertIn(info.device, ("cpu", "cuda"))

    def test_stream_matches_c_api(self):
        streamed = []
        with self.model.session() as s:
            r = s.generate(self.prompt, max_new_tokens=8, temperature=self.temp, seed=self.seed,
                           on_token=lambda tok, i: streamed.append((i, tok)))
            self.assertEqual(len(s), len(self.prompt) + 8)
        self.assertEqual(r.tokens, self.expected)
        self.assertEqual([t for _, t in streamed], self.expected)
        # a fresh model reads its experts from the pack during the prompt
        self.assertGreater(r.stats.prefill_expert_bytes, 0)
        self.assertGreaterEqual(r.stats.decode_expert_bytes, 0)
        self.assertEqual([i for i, _ in streamed], list(range(8)))
        self.assertFalse(r.cancelled)
        self.assertEqual(r.stats.prompt_tokens, len(self.prompt))
        self.assertEqual(r.stats.generated_tokens, 8)
        st = self.model.store_stats()
        self.assertGreater(st.acquires, 0)
        self.assertEqual(st.cache_hits + st.cache_misses > 0, True)

    def test_cancel(self):
        with self.model.session() as s:
            r = s.generate(self.prompt, max_new_tokens=8, temperature=self.temp, seed=self.seed,
                           on_token=lambda tok, i: i == 2)
            self.assertTrue(r.cancelled)
            self.assertEqual(r.tokens, self.expected[:3])
            self.assertEqual(len(s), len(self.prompt) + 3)

    def test_callback_exception_propagates(self):
        def boom(tok, i):
            raise KeyError("from callback")
        with self.model.session() as s:
            with self.assertRaises(KeyError):
                s.generate(self.prompt, max_new_tokens=4, on_token=boom)

    def test_score_agrees_with_greedy(self):
        with self.model.session() as s:
            greedy = s.generate(self.prompt, max_new_tokens=1, temperature=0).tokens[0]
        with self.model.session() as s:
            rows = s.score(self.prompt, top_k=3)
        self.assertEqual(len(rows), len(self.prompt))
        top_ids, top_logits = rows[-1]
        self.assertEqual(top_ids[0], greedy)
        self.assertGreaterEqual(top_logits[0], top_logits[1])
        with self.model.session() as s:
            full = s.score(self.prompt[:2], top_k=0)
        self.assertEqual(len(full[0]), self.model.info().vocab_size)

    def test_cpu_threads(self):
        # the CPU backend gives the same bits for any thread count: the same tokens as the C API
        with ep.Model(env("EP_TEST_MODEL"), device=ep.Device.CPU, cpu_threads=3) as m, m.session() as s:
            r = s.generate(self.prompt, max_new_tokens=8, temperature=self.temp, seed=self.seed)
            self.assertEqual(r.tokens, self.expected)
        with self.assertRaises(ep.InvalidArgumentError):
            ep.Model(env("EP_TEST_MODEL"), device=ep.Device.CPU, cpu_threads=-2)

    def test_bad_token_raises(self):
        with self.model.session() as s:
            with self.assertRaises(ep.InvalidArgumentError) as cm:
                s.generate([10 ** 8], max_new_tokens=1)
            self.assertEqual(cm.exception.status, ep.Status.INVALID_ARGUMENT)

    def test_sessions_on_threads_share_a_model(self):
        results = [None] * 3

        def work(i):
            with self.model.session() as s:
                results[i] = s.generate(self.prompt, max_new_tokens=8, temperature=self.temp, seed=self.seed).tokens
        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, [self.expected] * 3)

    def test_close_is_deterministic(self):
        s = self.model.session()
        self.model.close()
        self.assertTrue(s.closed)
        with self.assertRaises(ValueError):
            len(s)


class ErrorTest(unittest.TestCase):
    def test_missing_model(self):
        missing = os.path.join(env("EP_TEST_DIR"), "no-such-model.gguf")
        with self.assertRaises(ep.ExpertPackError) as cm:
            ep.Model(missing, pack_build=False)
        e = cm.exception
        self.assertEqual(e.status, ep.Status.NOT_FOUND)
        self.assertIsInstance(e, ep.NotFoundError)
        self.assertIsInstance(e, FileNotFoundError)
        self.assertIn("no-such-model.gguf", e.message)
        self.assertIn("no-such-model.gguf", ep.last_error())

    def test_missing_stats_file(self):
        with self.assertRaises(ep.ExpertPackError) as cm:
            ep.read_store_stats(os.path.join(env("EP_TEST_DIR"), "nope.json"))
        self.assertIn(cm.exception.status, (ep.Status.NOT_FOUND, ep.Status.IO))


class PackTest(unittest.TestCase):
    def test_pack_info(self):
        with ep.Pack(env("EP_TEST_MODEL"), ep.Validation.FULL) as p:
            info = p.info()
            self.assertEqual(info.format_version, 1)
            self.assertGreater(info.num_layers, 0)
            o = p.object(0, 0)
            self.assertEqual(o.offset, info.data_start)
            self.assertEqual(o.offset % info.alignment, 0)
            with self.assertRaises(ep.InvalidArgumentError):
                p.object(info.num_layers, 0)


@unittest.skipUnless(ep.HAVE_TEXT, "the library has no text API")
class TextTest(unittest.TestCase):
    """The text API. The tokenizer comes from EP_TEST_TOKENIZER (a tokenizer.json; the script sets
    it to the DeepSeek-V3 tokenizer of tests/data); generation needs the model's own tokenizer."""

    def tokenizer(self):
        path = os.environ.get("EP_TEST_TOKENIZER")
        if not path:
            self.skipTest("EP_TEST_TOKENIZER is not set")
        return ep.Tokenizer(path)

    def test_encode_decode_round_trip(self):
        with self.tokenizer() as tok:
            text = "Hello, world! Grüße — 你好"
            ids = tok.encode(text)
            self.assertTrue(ids)
            self.assertEqual(tok.decode(ids), text)
            info = tok.info()
            self.assertGreater(info.vocab_size, 1000)
            with_bos = tok.encode(text, add_special=True)
            if info.bos_id >= 0:
                self.assertEqual(with_bos[0], info.bos_id)

    def test_render_chat(self):
        with self.tokenizer() as tok:
            msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
            text = tok.render_chat(msgs, template=ep.ChatTemplate.DEEPSEEK_V4)
            self.assertIn("Be brief.", text)
            self.assertIn("Hi there", text)
            with self.assertRaises(ep.ExpertPackError):
                tok.render_chat([{"role": "nobody", "content": "x"}], template=ep.ChatTemplate.DEEPSEEK_V4)

    def test_missing_tokenizer(self):
        with self.assertRaises(ep.NotFoundError) as cm:
            ep.Tokenizer(os.path.join(env("EP_TEST_DIR"), "no-such-tokenizer.json"))
        self.assertIn("no-such-tokenizer.json", cm.exception.message)

    def test_generate_text_and_chat(self):
        with ep.Model(env("EP_TEST_MODEL")) as model:
            try:
                tok = model.tokenizer()
            except ep.NotFoundError as e:
                self.skipTest(f"the synthetic model has no tokenizer: {e}")
            with tok, model.session() as s:
                pieces = []
                r = s.generate_text(tok, "Hello", max_new_tokens=8, temperature=float(env("EP_TEST_TEMP")),
                                    seed=int(env("EP_TEST_SEED")), ignore_eos=True, on_text=pieces.append)
                self.assertEqual("".join(pieces), r.text)
                self.assertFalse(r.cancelled)
                self.assertEqual(r.stats.generated_tokens, 8)
                self.assertEqual(r.stats.session_tokens, len(s))
                expected_text = os.environ.get("EP_TEST_EXPECTED_TEXT_FILE")
                if expected_text:  # the C API's text (ep-run --prompt Hello) for the same options
                    with open(expected_text, "rb") as f:
                        self.assertEqual(r.text, f.read().decode("utf-8"))
                s.reset()
                msgs = [{"role": "user", "content": "Hi"}]
                r1 = s.generate_chat(tok, msgs, max_new_tokens=8, temperature=float(env("EP_TEST_TEMP")),
                                     seed=int(env("EP_TEST_SEED")), ignore_eos=True)
                expected_chat = os.environ.get("EP_TEST_EXPECTED_CHAT_FILE")
                if expected_chat:  # ep-run --chat --prompt Hi
                    with open(expected_chat, "rb") as f:
                        self.assertEqual(r1.text, f.read().decode("utf-8"))
                msgs += [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "More"}]
                r2 = s.generate_chat(tok, msgs, max_new_tokens=4, ignore_eos=True,
                                     on_text=lambda piece: True)  # stop at the first piece
                self.assertTrue(r2.cancelled or r2.text == "")


@unittest.skipUnless(ep.HAVE_BATCH, "the library has no 0.2 session API")
class BatchTest(unittest.TestCase):
    """The 0.2 session API: ep_sessions_append, ep_session_sample, ep_session_tokens, ep_session_fork."""

    def setUp(self):
        self.model = ep.Model(env("EP_TEST_MODEL"))
        load_fixture(self)

    def tearDown(self):
        self.model.close()

    def test_sample_loop_matches_c_api(self):
        # the host's loop (append, sample, append...) draws what ep_generate drew for the same seed
        with self.model.session() as s:
            s.append(self.prompt)
            self.assertEqual(s.tokens, self.prompt)
            got = []
            for _ in range(8):
                got.append(s.sample(temperature=self.temp, seed=self.seed))
                s.append(got[-1:])
            self.assertEqual(got, self.expected)
            self.assertEqual(s.tokens, self.prompt + self.expected)
            self.assertEqual(len(s), len(self.prompt) + 8)

    def test_logprobs_and_logit_bias(self):
        import math
        with self.model.session() as s:
            s.append(self.prompt)
            token, logprob, top = s.sample_logprobs(5)
            self.assertEqual(len(top), 5)
            self.assertEqual(top[0], (token, logprob))  # greedy: the most likely token
            self.assertTrue(all(a[1] >= b[1] for a, b in zip(top, top[1:])))
            self.assertTrue(logprob <= 0 and sum(math.exp(lp) for _, lp in top) <= 1.0 + 1e-5)
            forced = 7 if token != 7 else 8
            self.assertEqual(s.sample(logit_bias={forced: 100.0}), forced)
            self.assertNotEqual(s.sample(logit_bias={token: -100.0}), token)
            # the log-probabilities are the raw distribution's: a bias does not move them
            t2, lp2, top2 = s.sample_logprobs(5, logit_bias={forced: 100.0})
            self.assertEqual(t2, forced)
            self.assertEqual(top2, top)
            with self.assertRaises(ep.InvalidArgumentError):
                s.sample(logit_bias={forced: 101.0})
            with self.assertRaises(ep.InvalidArgumentError):
                s.sample_logprobs(ep.MAX_TOP_LOGPROBS + 1)

    def test_fork_continues_as_the_original(self):
        with self.model.session() as s:
            s.append(self.prompt)
            f = s.fork()
            self.assertEqual(f.tokens, self.prompt)
            # the fork copies the logits and the sampler position: both continue to the C API's tokens
            r_fork = f.generate([], max_new_tokens=8, temperature=self.temp, seed=self.seed)
            self.assertEqual(f.tokens, self.prompt + self.expected)
            self.assertEqual(s.tokens, self.prompt)  # appending to the fork left the original alone
            r_orig = s.generate([], max_new_tokens=8, temperature=self.temp, seed=self.seed)
            self.assertEqual(r_fork.tokens, self.expected)
            self.assertEqual(r_orig.tokens, self.expected)
            f.close()
            self.assertEqual(len(s), len(self.prompt) + 8)

    def test_append_many_matches_each_alone(self):
        prompts = [self.prompt, list(reversed(self.prompt))[:5]]
        alone = []
        for p in prompts:
            with self.model.session() as s:
                alone.append(s.generate(p, max_new_tokens=6).tokens)
        self.assertNotEqual(alone[0], alone[1], "the two prompts should continue differently")
        sessions = [self.model.session() for _ in prompts]
        try:
            ep.append_many(sessions, prompts)  # prompts of different lengths in one pass
            steps = [ep.step_batch(sessions) for _ in range(6)]
            batched = [[step[i] for step in steps] for i in range(len(prompts))]
            self.assertEqual(batched, alone)
            for s, p, b in zip(sessions, prompts, batched):
                self.assertEqual(s.tokens, p + b)
        finally:
            for s in sessions:
                s.close()

    def test_refusals(self):
        with self.model.session() as a, self.model.session() as empty:
            a.append(self.prompt)
            with self.assertRaises(ep.InvalidArgumentError):
                ep.append_many([a, a], [[1], [2]])  # one session twice
            with self.assertRaises(ep.InvalidArgumentError):
                ep.append_many([a, empty], [[1], []])  # no tokens for one
            with self.assertRaises(ep.InvalidArgumentError) as cm:
                a.append([10 ** 8])
            self.assertIn("outside", cm.exception.message)
            with self.assertRaises(ep.InvalidArgumentError):
                empty.sample()  # nothing to sample from
            with self.assertRaises(ep.InvalidArgumentError):
                a.sample(temperature=0.5, top_p=2.0)
            with self.assertRaises(ValueError):
                ep.append_many([a], [])
            self.assertEqual(empty.tokens, [])

    @unittest.skipUnless(ep.HAVE_SAMPLE_MANY, "the library has no ep_sessions_sample (0.5)")
    def test_sample_many_equals_each_alone(self):
        # sessions[i] and alone[i] hold the same prompt; each batched draw equals the single one,
        # and the draw counters advance alike (seeded draws keep agreeing step after step)
        prompts = [self.prompt, list(reversed(self.prompt))[:5], self.prompt[:3]]
        options = [{}, {"temperature": 0.9, "top_p": 0.8, "seed": 3},
                   {"temperature": 1.2, "seed": 4, "repetition_penalty": 1.3, "logit_bias": {7: 2.0}}]
        batched = [self.model.session() for _ in prompts]
        alone = [self.model.session() for _ in prompts]
        try:
            ep.append_many(batched, prompts)
            ep.append_many(alone, prompts)
            for _ in range(5):
                got = ep.sample_many(batched, options, logprobs=[3, None, 0])
                want = [alone[0].sample_logprobs(3, **options[0]), alone[1].sample(**options[1]),
                        alone[2].sample_logprobs(0, **options[2])]
                self.assertEqual(got[0], want[0])
                self.assertEqual(got[1], (want[1], None, []))
                self.assertEqual(got[2], want[2])
                tokens = [[g[0]] for g in got]
                ep.append_many(batched, tokens)
                ep.append_many(alone, tokens)
            self.assertEqual(ep.sample_many(batched), [s.sample() for s in alone])
            with self.assertRaises(ep.InvalidArgumentError) as cm:
                ep.sample_many([batched[0], batched[0]])
            self.assertIn("sessions[1]", cm.exception.message)
            with self.model.session() as empty:
                with self.assertRaises(ep.InvalidArgumentError) as cm:
                    ep.sample_many([batched[0], empty])
                self.assertIn("sessions[1]", cm.exception.message)
        finally:
            for s in batched + alone:
                s.close()

    def test_fork_is_closed_with_its_model(self):
        with ep.Model(env("EP_TEST_MODEL")) as m:
            s = m.session()
            s.append(self.prompt)
            f = s.fork()
        self.assertTrue(s.closed)
        self.assertTrue(f.closed)


class HierarchyTest(unittest.TestCase):
    """The 0.2 model options (host-RAM tier, overlapped reads, prefetch, cache policy) and the
    store counters they drive."""

    def setUp(self):
        load_fixture(self)

    def test_new_store_counters(self):
        with ep.Model(env("EP_TEST_MODEL")) as m, m.session() as s:
            s.generate(self.prompt, max_new_tokens=2)
            st = m.store_stats()
        for name in ("host_hits", "host_misses", "demotions", "host_resident_bytes", "host_slots",
                     "prefetch_issued", "prefetch_used", "pack_read_full_ns", "pack_read_full_depth",
                     "expert_wait_ns", "store_disk_idle_ns"):
            value = getattr(st, name)
            self.assertIsInstance(value, int, name)
            self.assertGreaterEqual(value, 0, name)
        self.assertEqual((st.host_slots, st.host_hits, st.demotions), (0, 0, 0))  # no host tier
        self.assertEqual(st.prefetch_issued, 0)  # prefetch is off by default
        self.assertLessEqual(st.expert_wait_ns, st.pack_read_ns)  # the stall is part of the disk's busy time

    def test_host_tier_and_prefetch_give_the_same_tokens(self):
        # a cache for half the experts and a host tier below it: experts are evicted, demoted,
        # come back from the tier and are prefetched into free slots; results are bitwise the
        # same as without any of it
        with ep.Model(env("EP_TEST_MODEL")) as probe:
            slot = probe.store_stats().slot_bytes
            info = probe.info()
        self.assertGreater(slot, 0)
        half = info.num_layers * info.num_experts // 2
        opts = dict(device=ep.Device.CPU, cache_budget_bytes=slot * half, host_cache_bytes=slot * half,
                    overlap_reads=False, prefetch=True, cache_policy="lru")
        with ep.Model(env("EP_TEST_MODEL"), **opts) as m, m.session() as s:
            r = s.generate(self.prompt, max_new_tokens=8, temperature=self.temp, seed=self.seed)
            st = m.store_stats()
        self.assertEqual(r.tokens, self.expected)
        self.assertGreater(st.host_slots, 0)
        self.assertGreater(st.cache_evictions, 0)
        self.assertGreater(st.demotions, 0)
        self.assertGreater(st.host_hits, 0)
        self.assertEqual(st.host_hits + st.host_misses, st.cache_misses)
        self.assertLessEqual(st.host_resident_bytes, st.host_slots * slot)
        self.assertGreater(st.prefetch_issued, 0)
        self.assertLessEqual(st.prefetch_used, st.prefetch_issued)

    def test_no_pack_reads_the_source(self):
        # the GGUF the pack was built from, read through a source index: the same tokens, and
        # the pack directory holds the index, not a pack
        index_dir = os.path.join(env("EP_TEST_DIR"), "python-index")
        with ep.Model(env("EP_TEST_SOURCE"), device=ep.Device.CPU, no_pack=True, pack_dir=index_dir) as m, \
                m.session() as s:
            r = s.generate(self.prompt, max_new_tokens=8, temperature=self.temp, seed=self.seed)
            self.assertTrue(m.pack_path.endswith(".epx"))
        self.assertEqual(r.tokens, self.expected)
        self.assertFalse([f for f in os.listdir(index_dir) if f.endswith(".epk")])
        with self.assertRaises(ep.InvalidArgumentError):
            ep.Model(env("EP_TEST_MODEL"), no_pack=True)  # a pack given with no_pack

    def test_kv_budget(self):
        # the budget in effect comes back in info(); one below a session of a token is refused
        with ep.Model(env("EP_TEST_MODEL"), device=ep.Device.CPU, kv_budget_bytes=64 << 20) as m:
            info = m.info()
            self.assertEqual(info.kv_budget_bytes, 64 << 20)
            self.assertGreater(info.context_length, 0)
        with self.assertRaises(ep.BudgetError) as cm:
            ep.Model(env("EP_TEST_MODEL"), device=ep.Device.CPU, kv_budget_bytes=1)
        self.assertIn("KV budget", cm.exception.message)

    def test_bad_options(self):
        with self.assertRaises(ep.InvalidArgumentError) as cm:
            ep.Model(env("EP_TEST_MODEL"), cache_policy="no-such-policy")
        self.assertIn("no-such-policy", cm.exception.message)


@unittest.skipUnless(ep.HAVE_TEXT and ep.HAVE_BATCH, "the library has no text stream")
class TextStreamTest(unittest.TestCase):
    """ep_text_stream_*: a host's sample loop gets the text ep_generate_text streams."""

    def setUp(self):
        self.model = ep.Model(env("EP_TEST_MODEL"))
        try:
            self.tok = self.model.tokenizer()
        except ep.NotFoundError as e:
            self.model.close()
            self.skipTest(f"the synthetic model has no tokenizer: {e}")
        load_fixture(self)

    def tearDown(self):
        self.tok.close()
        self.model.close()

    def host_loop(self, n, stop_strings=()):
        """Text of n tokens sampled after "Hello" by the host, through a TextStream."""
        with self.model.session() as s, ep.TextStream(self.tok, stop_strings) as ts:
            s.append(self.tok.encode("Hello", add_special=True))
            pieces = []
            for _ in range(n):
                if ts.stopped:
                    break
                token = s.sample(temperature=self.temp, seed=self.seed)
                pieces.append(ts.push(token))
                s.append([token])
            if not ts.stopped:
                pieces.append(ts.finish())
            self.assertEqual("".join(pieces), ts.text)
            return ts.text, ts.stopped

    def generate_text(self, n, stop_strings=()):
        with self.model.session() as s:
            return s.generate_text(self.tok, "Hello", max_new_tokens=n, temperature=self.temp, seed=self.seed,
                                   ignore_eos=True, stop_strings=list(stop_strings)).text

    def test_stream_equals_generate_text(self):
        text, stopped = self.host_loop(8)
        self.assertFalse(stopped)
        self.assertEqual(text, self.generate_text(8))
        expected_text = os.environ.get("EP_TEST_EXPECTED_TEXT_FILE")
        if expected_text:  # the C API's text (ep-run --prompt Hello)
            with open(expected_text, "rb") as f:
                self.assertEqual(text, f.read().decode("utf-8"))

    def test_stop_string_stops_there(self):
        full, _ = self.host_loop(24)
        self.assertGreater(len(full), 8, f"too little text to pick a stop string from: {full!r}")
        stop = full[len(full) // 2:len(full) // 2 + 3]
        text, stopped = self.host_loop(24, [stop])
        self.assertTrue(stopped)
        self.assertEqual(text, full[:full.index(stop)])
        self.assertEqual(text, self.generate_text(24, [stop]))

    def test_empty_stop_string_is_refused(self):
        with self.assertRaises(ep.InvalidArgumentError):
            ep.TextStream(self.tok, [""])


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(ep.HAVE_GRAMMAR, "the library has no constrained sampling (0.5)")
class GrammarTest(unittest.TestCase):
    """Constrained sampling (grammar.h): a JSON Schema compiled for a tokenizer (a keyword outside the
    subset named), a state's allowed tokens, and sampling with it on the demo model (models/ in the
    repository: a real tokenizer), whose answers parse and follow the schema."""

    SCHEMA = {"type": "object",
              "properties": {"book": {"enum": ["Genesis", "Exodus"]}, "chapter": {"type": "integer"},
                             "amen": {"type": "boolean"}},
              "required": ["book", "chapter", "amen"], "additionalProperties": False}

    def tokenizer(self):
        path = os.environ.get("EP_TEST_TOKENIZER")
        if not path:
            self.skipTest("EP_TEST_TOKENIZER is not set")
        return ep.Tokenizer(path)

    def test_schema_errors_and_state(self):
        with self.tokenizer() as tok:
            with self.assertRaises(ep.InvalidArgumentError) as cm:
                ep.Grammar.json_schema(tok, {"type": "object", "properties": {"a": {"type": "string", "format": "date"}}})
            self.assertIn("/properties/a/format", cm.exception.message)
            with ep.Grammar.json_schema(tok, self.SCHEMA) as g, g.state() as st:
                brace, close = tok.token_id("{"), tok.token_id("}")
                allowed = st.allowed()
                self.assertIn(brace, allowed)
                self.assertNotIn(close, allowed)
                self.assertNotIn(tok.info().eos_id, allowed)
                with self.assertRaises(ep.InvalidArgumentError):
                    st.accept(close)
                st.accept(brace)
                self.assertFalse(st.complete)
                for t in tok.encode('"book":"Exodus","amen":true,"chapter":12}'):
                    st.accept(t)
                self.assertTrue(st.complete)
                self.assertEqual(st.allowed(), [tok.info().eos_id])
            with ep.Grammar.json_object(tok) as g, g.state() as st:
                self.assertIn(tok.token_id("{"), st.allowed())
                self.assertNotIn(tok.token_id("["), st.allowed())

    def test_sampling_follows_the_schema(self):
        import json
        demo = os.environ.get("EP_TEST_DEMO_MODEL")
        if not demo:
            self.skipTest("EP_TEST_DEMO_MODEL (models/demo-kjv.gguf) is not set")
        with ep.Model(demo, device=ep.Device.CPU, pack_dir=os.path.join(env("EP_TEST_DIR"), "demo-packs")) as model:
            tok = model.tokenizer()
            eos = {tok.info().eos_id, tok.info().end_of_turn_id}
            with tok, ep.Grammar.json_schema(tok, self.SCHEMA) as g:
                prompt = tok.encode(tok.render_chat([{"role": "user", "content": "John 3:16"}]))
                ended = 0
                for seed in range(4):
                    with model.session() as s, g.state() as st:
                        s.append(prompt)
                        out = []
                        for _ in range(200):
                            t = s.sample(grammar=st, temperature=1.0, seed=seed)
                            if t in eos:
                                break
                            out.append(t)
                            s.append([t])
                        else:
                            continue
                        ended += 1
                        value = json.loads(tok.decode(out))
                        self.assertEqual(set(value), {"book", "chapter", "amen"})
                        self.assertIn(value["book"], ("Genesis", "Exodus"))
                        self.assertIsInstance(value["chapter"], int)
                        self.assertIsInstance(value["amen"], bool)
                self.assertGreater(ended, 0)
                # generate_chat takes the grammar too.
                with model.session() as s, g.state() as st:
                    r = s.generate_chat(tok, [{"role": "user", "content": "John 3:16"}], grammar=st, max_new_tokens=200)
                    if st.complete:
                        json.loads(r.text)


@unittest.skipUnless(ep.HAVE_BATCH, "the library has no 0.2 session API")
class SessionStateTest(unittest.TestCase):
    """ep_session_state_bytes and ep_session_set_draw_count (0.4: what a host's prefix cache needs)."""

    def test_state_bytes_and_draw_count(self):
        load_fixture(self)
        with ep.Model(env("EP_TEST_MODEL")) as model, model.session() as s:
            s.append(self.prompt)
            self.assertGreater(s.state_bytes, 0)
            with s.fork() as f:
                self.assertEqual(f.state_bytes, s.state_bytes)
            first = [s.sample(temperature=self.temp, seed=self.seed) for _ in range(4)]
            s.set_draw_count(0)  # the same seeded draws again
            self.assertEqual([s.sample(temperature=self.temp, seed=self.seed) for _ in range(4)], first)
            s.set_draw_count(2)
            self.assertEqual(s.sample(temperature=self.temp, seed=self.seed), first[2])


class ChatToolsTest(unittest.TestCase):
    """The tool fields of ep_chat_options (tools, a message's tool calls and tool results, tool_choice)
    and ep_chat_tool_call_prefix, on the DeepSeek-V4 template."""

    TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]

    def test_tools_render(self):
        path = os.environ.get("EP_TEST_TOKENIZER")
        if not path:
            self.skipTest("EP_TEST_TOKENIZER is not set")
        with ep.Tokenizer(path) as tok:
            v4 = ep.ChatTemplate.DEEPSEEK_V4
            plain = tok.render_chat([{"role": "user", "content": "Weather in Paris?"}], template=v4)
            with_tools = tok.render_chat([{"role": "user", "content": "Weather in Paris?"}], template=v4, tools=self.TOOLS)
            self.assertNotIn("get_weather", plain)
            self.assertIn("get_weather", with_tools)
            msgs = [{"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                    {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": "call_1", "name": "get_weather"}]
            round_trip = tok.render_chat(msgs, template=v4, tools=self.TOOLS)
            self.assertIn("Paris", round_trip)
            self.assertIn("Sunny, 21 C", round_trip)
            with self.assertRaises(ep.InvalidArgumentError):
                tok.render_chat([{"role": "user", "content": "x"}], template=v4, tools="[not json")
            prefix = tok.tool_call_prefix("get_weather", template=v4)
            self.assertIn("get_weather", prefix)
