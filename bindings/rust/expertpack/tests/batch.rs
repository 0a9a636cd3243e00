//! The 0.2 session API (feature "batch") and the 0.2 model options and store counters, against
//! the synthetic model of scripts/test-bindings (environment as in tests/model.rs).
#![cfg(feature = "batch")]
use expertpack::*;
use std::ops::ControlFlow;
use std::path::PathBuf;

mod common;
use common::{env, ids};

fn model_path() -> PathBuf {
    PathBuf::from(env("EP_TEST_MODEL"))
}

/// The options of the C API's run (ep-run): temperature and seed of the fixture.
fn sampled(max_new_tokens: u32) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        temperature: env("EP_TEST_TEMP").parse().unwrap(),
        seed: env("EP_TEST_SEED").parse().unwrap(),
        ..Default::default()
    }
}

fn no_callback(_: i32, _: u32) -> ControlFlow<()> {
    ControlFlow::Continue(())
}

#[test]
fn sample_loop_matches_the_c_api() {
    let (prompt, expected) = (ids(&env("EP_TEST_PROMPT")), ids(&env("EP_TEST_EXPECTED")));
    let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
    let mut s = model.session().unwrap();
    s.append(&prompt).unwrap();
    assert_eq!(s.tokens().unwrap(), prompt);
    let opts = sampled(8);
    let mut got = Vec::new();
    for _ in 0..8 {
        let t = s.sample(&opts).unwrap();
        got.push(t);
        s.append(&[t]).unwrap();
    }
    assert_eq!(got, expected);
    assert_eq!(s.tokens().unwrap(), [prompt.clone(), expected].concat());
    assert_eq!(s.len().unwrap() as usize, prompt.len() + 8);
}

#[test]
fn fork_continues_as_the_original() {
    let (prompt, expected) = (ids(&env("EP_TEST_PROMPT")), ids(&env("EP_TEST_EXPECTED")));
    let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
    let mut s = model.session().unwrap();
    s.append(&prompt).unwrap();
    let mut f = s.fork().unwrap();
    assert_eq!(f.tokens().unwrap(), prompt);
    // the fork copies the logits and the sampler position: both continue to the C API's tokens
    let from_fork = f.generate(&[], &sampled(8), no_callback).unwrap();
    assert_eq!(s.tokens().unwrap(), prompt, "appending to the fork changed the original");
    drop(f);
    let from_original = s.generate(&[], &sampled(8), no_callback).unwrap();
    assert_eq!(from_fork.tokens, expected);
    assert_eq!(from_original.tokens, expected);
}

#[test]
fn append_many_matches_each_alone() {
    let prompt = ids(&env("EP_TEST_PROMPT"));
    let prompts: Vec<Vec<i32>> = vec![prompt.clone(), prompt.iter().rev().take(5).copied().collect()];
    let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
    let greedy = GenerateOptions { max_new_tokens: 6, ..Default::default() };
    let alone: Vec<Vec<i32>> =
        prompts.iter().map(|p| model.session().unwrap().generate(p, &greedy, no_callback).unwrap().tokens).collect();
    assert_ne!(alone[0], alone[1], "the two prompts should continue differently");
    let (mut a, mut b) = (model.session().unwrap(), model.session().unwrap());
    append_many(&mut [&mut a, &mut b], &[&prompts[0], &prompts[1]]).unwrap();
    let mut batched = vec![Vec::new(), Vec::new()];
    for _ in 0..6 {
        let next = step_batch(&mut [&mut a, &mut b], &GenerateOptions::default()).unwrap();
        batched[0].push(next[0]);
        batched[1].push(next[1]);
    }
    assert_eq!(batched, alone);
    assert_eq!(a.tokens().unwrap(), [prompts[0].clone(), batched[0].clone()].concat());
    assert_eq!(b.tokens().unwrap(), [prompts[1].clone(), batched[1].clone()].concat());
}

#[test]
fn refusals_are_invalid_argument() {
    let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
    let other = Model::open(model_path(), &ModelOptions::default()).unwrap();
    let (mut a, mut empty, mut foreign) = (model.session().unwrap(), model.session().unwrap(), other.session().unwrap());
    a.append(&[1, 2, 3]).unwrap();
    let e = append_many(&mut [&mut a, &mut empty], &[&[1], &[]]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    let e = append_many(&mut [&mut a, &mut foreign], &[&[1], &[2]]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{}", e.message);
    let e = a.append(&[100_000_000]).unwrap_err();
    assert!(e.message.contains("outside"), "{}", e.message);
    assert_eq!(empty.sample(&GenerateOptions::default()).unwrap_err().status, Status::InvalidArgument);
    assert_eq!(append_many(&mut [&mut a], &[]).unwrap_err().status, Status::InvalidArgument);
    assert_eq!(empty.tokens().unwrap(), Vec::<i32>::new());
    assert_eq!(a.tokens().unwrap(), vec![1, 2, 3]);
}

#[test]
fn new_store_counters_are_present() {
    let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
    model.session().unwrap().generate(&[1, 2, 3], &GenerateOptions { max_new_tokens: 2, ..Default::default() }, no_callback).unwrap();
    let st = model.store_stats().unwrap();
    for (name, v) in [("host_hits", st.host_hits), ("host_misses", st.host_misses), ("demotions", st.demotions),
                      ("host_resident_bytes", st.host_resident_bytes), ("host_slots", st.host_slots),
                      ("prefetch_issued", st.prefetch_issued), ("prefetch_used", st.prefetch_used)] {
        assert!(v.is_some(), "{} missing", name);
    }
    // no host tier, no prefetch by default
    assert_eq!((st.host_slots, st.demotions, st.prefetch_issued), (Some(0), Some(0), Some(0)));
}

#[test]
fn host_tier_and_prefetch_give_the_same_tokens() {
    let expected = ids(&env("EP_TEST_EXPECTED"));
    let (slot, half) = {
        let probe = Model::open(model_path(), &ModelOptions::default()).unwrap();
        let info = probe.info().unwrap();
        (probe.store_stats().unwrap().slot_bytes, (info.num_layers * info.num_experts / 2) as u64)
    };
    // a cache for half the experts, a host tier below it, prefetch and LRU: results are bitwise
    // the same as without any of it
    let opts = ModelOptions {
        device: Device::Cpu,
        cache_budget_bytes: slot * half,
        host_cache_bytes: slot * half,
        overlap_reads: Some(false),
        prefetch: Some(true),
        cache_policy: Some("lru".into()),
        ..Default::default()
    };
    let model = Model::open(model_path(), &opts).unwrap();
    let out = model.session().unwrap().generate(&ids(&env("EP_TEST_PROMPT")), &sampled(8), no_callback).unwrap();
    assert_eq!(out.tokens, expected);
    let st = model.store_stats().unwrap();
    assert!(st.host_slots.unwrap() > 0 && st.demotions.unwrap() > 0 && st.host_hits.unwrap() > 0, "{:?}", st);
    assert_eq!(st.host_hits.unwrap() + st.host_misses.unwrap(), st.cache_misses);
    assert!(st.prefetch_issued.unwrap() > 0 && st.prefetch_used.unwrap() <= st.prefetch_issued.unwrap(), "{:?}", st);
    let bad = ModelOptions { cache_policy: Some("no-such-policy".into()), ..Default::default() };
    let e = Model::open(model_path(), &bad).err().expect("an unknown cache policy must fail");
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("no-such-policy"), "{}", e.message);
}

#[cfg(feature = "text")]
mod text_stream {
    use super::*;

    /// Text of `n` tokens sampled after "Hello" by the host through a TextStream, and whether a
    /// stop string ended it.
    fn host_loop(model: &Model, tok: &Tokenizer, n: u32, stops: &[&str]) -> (String, bool) {
        let mut s = model.session().unwrap();
        s.append(&tok.encode("Hello", true, false).unwrap()).unwrap();
        let mut ts = tok.text_stream(stops).unwrap();
        let opts = sampled(n);
        let mut text = String::new();
        for _ in 0..n {
            if ts.stopped() {
                break;
            }
            let t = s.sample(&opts).unwrap();
            text += &ts.push(t).unwrap();
            s.append(&[t]).unwrap();
        }
        if !ts.stopped() {
            text += &ts.finish().unwrap();
        }
        (text, ts.stopped())
    }

    fn generate_text(model: &Model, tok: &Tokenizer, n: u32, stops: &[&str]) -> String {
        let opts = GenerateOptions {
            ignore_eos: true,
            stop_strings: stops.iter().map(|s| s.to_string()).collect(),
            ..sampled(n)
        };
        model.session().unwrap().generate_text(tok, "Hello", &opts, |_| ControlFlow::Continue(())).unwrap().text
    }

    #[test]
    fn text_stream_equals_generate_text_and_stops_at_a_stop_string() {
        let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
        let tok = match common::model_tokenizer(&model) {
            Some(t) => t,
            None => return,
        };
        let (text, stopped) = host_loop(&model, &tok, 8, &[]);
        assert!(!stopped);
        assert_eq!(text, generate_text(&model, &tok, 8, &[]));
        if let Ok(path) = std::env::var("EP_TEST_EXPECTED_TEXT_FILE") {
            assert_eq!(text, std::fs::read_to_string(path).unwrap());
        }
        let (full, _) = host_loop(&model, &tok, 24, &[]);
        let chars: Vec<char> = full.chars().collect();
        assert!(chars.len() > 8, "too little text to pick a stop string from: {:?}", full);
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
        let (cut, stopped) = host_loop(&model, &tok, 24, &[&stop]);
        assert!(stopped);
        assert_eq!(cut, full[..full.find(&stop).unwrap()]);
        assert_eq!(cut, generate_text(&model, &tok, 24, &[&stop]));
        assert_eq!(tok.text_stream(&[""]).err().unwrap().status, Status::InvalidArgument);
    }
}

#[cfg(feature = "logprobs")]
#[test]
fn logprobs_and_logit_bias() {
    let prompt = ids(&env("EP_TEST_PROMPT"));
    let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
    let mut s = model.session().unwrap();
    s.append(&prompt).unwrap();
    let greedy = GenerateOptions::default();
    let lp = s.sample_logprobs(&greedy, 5).unwrap();
    assert_eq!(lp.top.len(), 5);
    assert_eq!(lp.top[0], (lp.token, lp.logprob), "greedy takes the most likely token");
    assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
    let forced = if lp.token == 7 { 8 } else { 7 };
    let biased = GenerateOptions { logit_bias: vec![(forced, 100.0)], ..Default::default() };
    assert_eq!(s.sample(&biased).unwrap(), forced);
    let with_bias = s.sample_logprobs(&biased, 5).unwrap();
    assert_eq!(with_bias.token, forced);
    assert_eq!(with_bias.top, lp.top, "a bias does not move the log-probabilities");
    let refused = GenerateOptions { logit_bias: vec![(forced, 150.0)], ..Default::default() };
    assert_eq!(s.sample(&refused).unwrap_err().status, Status::InvalidArgument);
}

#[cfg(feature = "sample_many")]
#[test]
fn sample_many_equals_each_alone() {
    // batched[i] and alone[i] hold the same prompt; the draws agree step after step (the draw
    // counters advance alike)
    let prompt = ids(&env("EP_TEST_PROMPT"));
    let model = Model::open(model_path(), &ModelOptions::default()).unwrap();
    let prompts: Vec<Vec<i32>> = vec![prompt.clone(), prompt[..3].to_vec(), vec![prompt[4], prompt[2], prompt[0]]];
    let options = vec![
        GenerateOptions::default(),
        GenerateOptions { temperature: 0.9, top_p: 0.8, seed: 3, ..Default::default() },
        GenerateOptions { temperature: 1.2, seed: 4, repetition_penalty: Some(1.3), logit_bias: vec![(7, 2.0)], ..Default::default() },
    ];
    let tops = [Some(3), None, Some(0)];
    let mut batched: Vec<Session> = prompts.iter().map(|_| model.session().unwrap()).collect();
    let mut alone: Vec<Session> = prompts.iter().map(|_| model.session().unwrap()).collect();
    let lists: Vec<&[i32]> = prompts.iter().map(|p| p.as_slice()).collect();
    append_many(&mut batched.iter_mut().collect::<Vec<_>>(), &lists).unwrap();
    append_many(&mut alone.iter_mut().collect::<Vec<_>>(), &lists).unwrap();
    for step in 0..5 {
        let got = sample_many(&mut batched.iter_mut().collect::<Vec<_>>(), &options, &tops).unwrap();
        for (i, s) in alone.iter_mut().enumerate() {
            let want = match tops[i] {
                Some(top) => s.sample_logprobs(&options[i], top).unwrap(),
                None => TokenLogprobs { token: s.sample(&options[i]).unwrap(), logprob: 0.0, top: Vec::new() },
            };
            assert_eq!(got[i], want, "step {} session {}", step, i);
        }
        let next: Vec<[i32; 1]> = got.iter().map(|g| [g.token]).collect();
        let next: Vec<&[i32]> = next.iter().map(|t| t.as_slice()).collect();
        append_many(&mut batched.iter_mut().collect::<Vec<_>>(), &next).unwrap();
        append_many(&mut alone.iter_mut().collect::<Vec<_>>(), &next).unwrap();
    }
    let mut empty = model.session().unwrap();
    let err = sample_many(&mut [&mut batched[0], &mut empty], &[], &[]).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("sessions[1]"), "{}", err.message);
}
