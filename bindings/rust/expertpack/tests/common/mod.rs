//! Helpers shared by the integration tests (each tests/*.rs is its own crate: `mod common;`).
#![allow(dead_code)]
use expertpack::*;

/// An environment variable scripts/test-bindings sets.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{} is not set: run scripts/test-bindings", name))
}

/// Token ids of a comma-separated list.
pub fn ids(s: &str) -> Vec<i32> {
    s.split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse().unwrap()).collect()
}

/// The model's own tokenizer, or `None` (with a message: the test then skips) when it has none.
#[cfg(feature = "text")]
pub fn model_tokenizer(model: &Model) -> Option<Tokenizer> {
    match model.tokenizer() {
        Ok(t) => Some(t),
        Err(e) if e.status == Status::NotFound => {
            eprintln!("skipped: the synthetic model has no tokenizer: {}", e);
            None
        }
        Err(e) => panic!("{}", e),
    }
}
