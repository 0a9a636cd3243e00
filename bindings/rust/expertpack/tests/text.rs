//! The text API (feature "text"). The tokenizer comes from EP_TEST_TOKENIZER (a tokenizer.json;
//! scripts/test-bindings sets it to the DeepSeek-V3 tokenizer of tests/data); generation needs the
//! synthetic model's own tokenizer and is skipped (with a message) without one.
#![cfg(feature = "text")]
use expertpack::*;
use std::ops::ControlFlow;

mod common;

fn tokenizer() -> Option<Tokenizer> {
    match std::env::var("EP_TEST_TOKENIZER") {
        Ok(p) if !p.is_empty() => Some(Tokenizer::open(p).unwrap()),
        _ => {
            eprintln!("skipped: EP_TEST_TOKENIZER is not set");
            None
        }
    }
}

#[test]
fn encode_decode_round_trip_and_chat() {
    let tok = match tokenizer() {
        Some(t) => t,
        None => return,
    };
    let text = "Hello, world! Grüße — 你好";
    let ids = tok.encode(text, false, false).unwrap();
    assert!(!ids.is_empty());
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let info = tok.info().unwrap();
    assert!(info.vocab_size > 1000);
    let msgs = vec![ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi there")];
    let chat = ChatOptions { template: ChatTemplate::DeepseekV4, ..Default::default() };
    let rendered = tok.render_chat(&msgs, chat).unwrap();
    assert!(rendered.contains("Be brief.") && rendered.contains("Hi there"), "{}", rendered);
}

#[test]
fn missing_tokenizer_is_not_found() {
    let dir = std::env::var("EP_TEST_DIR").expect("EP_TEST_DIR: run scripts/test-bindings");
    let e = Tokenizer::open(std::path::Path::new(&dir).join("no-such-tokenizer.json")).err().unwrap();
    assert_eq!(e.status, Status::NotFound);
    assert!(e.message.contains("no-such-tokenizer.json"), "{}", e.message);
}

#[test]
fn generate_text_streams_pieces() {
    let model = Model::open(std::env::var("EP_TEST_MODEL").unwrap(), &ModelOptions::default()).unwrap();
    let tok = match common::model_tokenizer(&model) {
        Some(t) => t,
        None => return,
    };
    let mut s = model.session().unwrap();
    let opts = GenerateOptions { max_new_tokens: 8, temperature: 0.8, seed: 7, ignore_eos: true, ..Default::default() };
    let mut pieces = String::new();
    let out = s
        .generate_text(&tok, "Hello", &opts, |p| {
            pieces.push_str(p);
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(pieces, out.text);
    assert_eq!(out.stats.generated_tokens, 8);
    assert_eq!(out.stats.session_tokens, Some(s.len().unwrap()));
    // The C API's text (ep-run --prompt Hello) for the same options.
    if let Ok(path) = std::env::var("EP_TEST_EXPECTED_TEXT_FILE") {
        assert_eq!(out.text, std::fs::read_to_string(path).unwrap());
    }
    s.reset().unwrap();
    let chat = s
        .generate_chat(&tok, &[ChatMessage::new("user", "Hi")], ChatOptions::default(), &opts, |_| ControlFlow::Continue(()))
        .unwrap();
    if let Ok(path) = std::env::var("EP_TEST_EXPECTED_CHAT_FILE") {
        assert_eq!(chat.text, std::fs::read_to_string(path).unwrap());
    }
}
