//! Tests against the small synthetic model made by scripts/test-bindings. Environment:
//! EP_TEST_MODEL (an Expert Pack), EP_TEST_PROMPT, EP_TEST_SEED, EP_TEST_TEMP, EP_TEST_EXPECTED
//! (the ids ep-run generated through the C API for them), EP_TEST_DIR (a scratch folder).
use expertpack::*;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

mod common;
use common::{env, ids};

struct Fixture {
    model: PathBuf,
    prompt: Vec<i32>,
    seed: u64,
    temp: f32,
    expected: Vec<i32>,
}

fn fixture() -> Fixture {
    Fixture {
        model: PathBuf::from(env("EP_TEST_MODEL")),
        prompt: ids(&env("EP_TEST_PROMPT")),
        seed: env("EP_TEST_SEED").parse().unwrap(),
        temp: env("EP_TEST_TEMP").parse().unwrap(),
        expected: ids(&env("EP_TEST_EXPECTED")),
    }
}

#[test]
fn version_and_status_strings() {
    let v: Vec<u32> = version().split('.').map(|x| x.parse().unwrap()).collect();
    assert_eq!(version_number(), v[0] * 10000 + v[1] * 100 + v[2]);
    assert_eq!(Status::NotFound.name(), "EP_ERR_NOT_FOUND");
    assert_eq!(status_str(0), "EP_OK");
    assert_eq!(Status::from_raw(-4), Some(Status::NotFound));
    assert_eq!(Status::from_raw(-1000), Some(Status::Other(-1000)));
    assert!(cuda_device_count().unwrap() >= 0);
}

#[test]
fn stream_8_tokens_matches_the_c_api() {
    let f = fixture();
    let model = Model::open(&f.model, &ModelOptions::default()).unwrap();
    let info = model.info().unwrap();
    assert_eq!(info.architecture, "deepseek4");
    // the GPU when there is one (Auto), else the CPU
    if expertpack::cuda_device_count().unwrap() == 0 {
        assert_eq!((info.device, info.device_index), (Device::Cpu, -1));
    }
    assert_eq!(model.pack_path().unwrap().extension().unwrap(), "epk");
    let mut session = model.session().unwrap();
    let opts = GenerateOptions { max_new_tokens: 8, temperature: f.temp, seed: f.seed, ..Default::default() };
    let mut streamed = Vec::new();
    let out = session
        .generate(&f.prompt, &opts, |tok, idx| {
            streamed.push((idx, tok));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(out.tokens, f.expected);
    assert_eq!(streamed.iter().map(|p| p.1).collect::<Vec<_>>(), f.expected);
    assert_eq!(streamed.iter().map(|p| p.0).collect::<Vec<_>>(), (0..8).collect::<Vec<u32>>());
    assert!(!out.cancelled);
    assert_eq!(out.stats.prompt_tokens as usize, f.prompt.len());
    assert_eq!(out.stats.generated_tokens, 8);
    // a fresh model reads its experts from the pack during the prompt
    assert!(out.stats.prefill_expert_bytes.unwrap() > 0);
    assert!(out.stats.decode_expert_bytes.is_some());
    assert_eq!(session.len().unwrap() as usize, f.prompt.len() + 8);
    let st = model.store_stats().unwrap();
    assert!(st.acquires > 0 && st.cache_hits + st.cache_misses > 0);
}

#[test]
fn callback_cancels() {
    let f = fixture();
    let model = Model::open(&f.model, &ModelOptions::default()).unwrap();
    let mut session = model.session().unwrap();
    let opts = GenerateOptions { max_new_tokens: 8, temperature: f.temp, seed: f.seed, ..Default::default() };
    let out = session
        .generate(&f.prompt, &opts, |_, idx| if idx == 2 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) })
        .unwrap();
    assert!(out.cancelled);
    assert_eq!(out.tokens, f.expected[..3].to_vec());
    assert_eq!(session.len().unwrap() as usize, f.prompt.len() + 3);
    session.reset().unwrap();
    assert!(session.is_empty().unwrap());
}

#[test]
fn panic_in_callback_is_resumed() {
    let f = fixture();
    let model = Model::open(&f.model, &ModelOptions::default()).unwrap();
    let mut session = model.session().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = session.generate(&f.prompt, &GenerateOptions::default(), |_, _| panic!("from callback"));
    }));
    assert!(r.is_err());
}

#[test]
fn score_agrees_with_greedy() {
    let f = fixture();
    let model = Model::open(&f.model, &ModelOptions::default()).unwrap();
    let greedy = {
        let mut s = model.session().unwrap();
        let opts = GenerateOptions { max_new_tokens: 1, ..Default::default() };
        s.generate(&f.prompt, &opts, |_, _| ControlFlow::Continue(())).unwrap().tokens[0]
    };
    let mut s = model.session().unwrap();
    let sc = s.score(&f.prompt, 3).unwrap();
    assert_eq!(sc.n_tokens, f.prompt.len());
    let last = sc.n_tokens - 1;
    assert_eq!(sc.row_ids(last)[0], greedy);
    assert!(sc.row(last)[0] >= sc.row(last)[1]);
    let mut s2 = model.session().unwrap();
    let full = s2.score(&f.prompt[..2], 0).unwrap();
    assert_eq!(full.width as u32, model.info().unwrap().vocab_size);
    assert_eq!(full.logits.len(), 2 * full.width);
}

#[test]
fn bad_token_is_invalid_argument() {
    let f = fixture();
    let model = Model::open(&f.model, &ModelOptions::default()).unwrap();
    let mut s = model.session().unwrap();
    let e = s.generate(&[100_000_000], &GenerateOptions::default(), |_, _| ControlFlow::Continue(())).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(!e.message.is_empty());
}

#[test]
fn missing_model_is_not_found_and_names_the_file() {
    let missing = PathBuf::from(env("EP_TEST_DIR")).join("no-such-model.gguf");
    let opts = ModelOptions { pack_build: Some(false), ..Default::default() };
    let e = Model::open(&missing, &opts).err().expect("opening a missing file must fail");
    assert_eq!(e.status, Status::NotFound);
    assert!(e.message.contains("no-such-model.gguf"), "message: {}", e.message);
    assert!(e.to_string().starts_with("EP_ERR_NOT_FOUND: "));
}

#[test]
fn pack_info_and_objects() {
    let f = fixture();
    let pack = Pack::open(&f.model, Validation::Full).unwrap();
    let info = pack.info().unwrap();
    assert_eq!(info.format_version, 1);
    assert!(info.num_layers > 0);
    let o = pack.object(0, 0).unwrap();
    assert_eq!(o.offset, info.data_start);
    assert_eq!(o.offset % info.alignment, 0);
    assert_eq!(pack.object(info.num_layers, 0).unwrap_err().status, Status::InvalidArgument);
    assert!(read_store_stats(PathBuf::from(env("EP_TEST_DIR")).join("nope.json")).is_err());
}

#[test]
fn log_callback_receives_messages() {
    let f = fixture();
    let seen = Arc::new(Mutex::new(Vec::<(LogLevel, String)>::new()));
    let sink = seen.clone();
    set_log_callback(Some(Box::new(move |lvl, msg| sink.lock().unwrap().push((lvl, msg.to_string())))),
                     Some(LogLevel::Info))
        .unwrap();
    drop(Model::open(&f.model, &ModelOptions::default()).unwrap());
    set_log_callback(None, Some(LogLevel::Warn)).unwrap();
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty(), "no log message at INFO while opening a model");
    assert!(seen.iter().all(|(l, m)| *l >= LogLevel::Info && !m.is_empty()));
}

#[test]
fn sessions_on_threads_share_a_model() {
    let f = fixture();
    let model = Model::open(&f.model, &ModelOptions::default()).unwrap();
    let opts = GenerateOptions { max_new_tokens: 8, temperature: f.temp, seed: f.seed, ..Default::default() };
    let results: Vec<Vec<i32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    let mut s = model.session().unwrap();
                    s.generate(&f.prompt, &opts, |_, _| ControlFlow::Continue(())).unwrap().tokens
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        assert_eq!(r, f.expected);
    }
}

#[test]
fn no_pack_reads_the_source_with_the_same_tokens() {
    // the GGUF the pack was built from, read through a source index in pack_dir
    let f = fixture();
    let dir = PathBuf::from(env("EP_TEST_DIR")).join("rust-index");
    let options = ModelOptions { device: Device::Cpu, no_pack: true, pack_dir: Some(dir.clone()), ..Default::default() };
    let model = Model::open(PathBuf::from(env("EP_TEST_SOURCE")), &options).unwrap();
    assert_eq!(model.pack_path().unwrap().extension().unwrap(), "epx");
    let mut session = model.session().unwrap();
    let opts = GenerateOptions { max_new_tokens: 8, temperature: f.temp, seed: f.seed, ..Default::default() };
    let out = session.generate(&f.prompt, &opts, |_, _| ControlFlow::Continue(())).unwrap();
    assert_eq!(out.tokens, f.expected);
    drop(session);
    drop(model);
    let packs = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().map_or(false, |x| x == "epk"))
        .count();
    assert_eq!(packs, 0);
    // a pack given with no_pack is refused
    let err = Model::open(&f.model, &ModelOptions { no_pack: true, ..Default::default() }).err().unwrap();
    assert_eq!(err.status, Status::InvalidArgument);
}
