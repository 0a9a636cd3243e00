//! The 0.2 session API (`include/expertpack/model.h`, group "step"): appending to several
//! sessions in one forward pass, sampling a session's next token where its logits are, forks,
//! and the tokens a session holds. With the `text` feature also [`TextStream`]
//! (`ep_text_stream_*`): incremental text for hosts that sample themselves.
use super::*;

impl<'m> Session<'m> {
    /// A copy of this session (`ep_session_fork`): the same tokens, decode state, last logits
    /// and sampler position. Appending to either leaves the other as it is, so a prompt's state
    /// can be kept and continued later without running the prompt again.
    pub fn fork(&self) -> Result<Session<'m>> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers; the copy borrows the same model as the original.
        check(unsafe { sys::ep_session_fork(&mut raw, self.raw) })?;
        Ok(Session { raw, model: self.model })
    }

    /// The token ids the session holds, in order (`ep_session_tokens`).
    pub fn tokens(&self) -> Result<Vec<i32>> {
        let mut count = 0usize;
        // SAFETY: measuring call with capacity 0.
        check(unsafe { sys::ep_session_tokens(ptr::null_mut(), 0, &mut count, self.raw) })?;
        loop {
            let cap = count;
            let mut ids = vec![0i32; cap.max(1)];
            // SAFETY: buffer of cap ids.
            check(unsafe { sys::ep_session_tokens(ids.as_mut_ptr(), cap, &mut count, self.raw) })?;
            if count <= cap {
                ids.truncate(count);
                return Ok(ids);
            }
        }
    }

    /// Appends token ids without generating (`ep_sessions_append` of this one session);
    /// [`Session::sample`] then draws the token after them.
    pub fn append(&mut self, tokens: &[i32]) -> Result<()> {
        append_many(&mut [&mut *self], &[tokens])
    }

    /// Draws the next token from the logits after the session's last token, where they were
    /// computed (`ep_session_sample`); the token is not appended. Of `options`, temperature,
    /// top_k, top_p, min_p, seed, repetition_penalty and repetition_window apply. The session's
    /// draw counter advances, so sample-and-append with a seed repeats what
    /// [`Session::generate`] gives for that seed.
    pub fn sample(&mut self, options: &GenerateOptions) -> Result<i32> {
        let opts = options.to_raw()?;
        let mut token = -1i32;
        // SAFETY: valid pointers; the v2 options start with the v1 layout and carry a struct_size
        // the library accepts.
        check(unsafe {
            sys::ep_session_sample(&mut token, self.raw, &opts.raw as *const _ as *const sys::ep_generate_options)
        })?;
        Ok(token)
    }

    /// [`Session::sample`] with log-probabilities (`ep_session_sample_logprobs`): the token, its
    /// log-probability and the `top_logprobs` (0..=20) most likely tokens with theirs, most likely
    /// first. The log-probabilities are the model's own: log-softmax of the raw logits, before the
    /// repetition penalty, the logit bias, the temperature and the top_k / top_p / min_p cuts.
    #[cfg(feature = "logprobs")]
    pub fn sample_logprobs(&mut self, options: &GenerateOptions, top_logprobs: u32) -> Result<TokenLogprobs> {
        let opts = options.to_raw()?;
        let mut out = std::mem::MaybeUninit::<sys::ep_token_logprobs>::uninit();
        // SAFETY: init fills the whole struct; valid pointers for the call.
        let out = unsafe {
            sys::ep_token_logprobs_init(out.as_mut_ptr());
            let mut out = out.assume_init();
            check(sys::ep_session_sample_logprobs(&mut out, self.raw,
                                                  &opts.raw as *const _ as *const sys::ep_generate_options, top_logprobs))?;
            out
        };
        let n = (out.n_top as usize).min(sys::EP_MAX_TOP_LOGPROBS);
        Ok(TokenLogprobs {
            token: out.token,
            logprob: out.logprob,
            top: (0..n).map(|i| (out.top_tokens[i], out.top_logprobs[i])).collect(),
        })
    }
}

/// A sampled token with its log-probability and the most likely alternatives
/// ([`Session::sample_logprobs`]).
#[cfg(feature = "logprobs")]
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: i32,
    pub logprob: f32,
    /// (token, log-probability), most likely first.
    pub top: Vec<(i32, f32)>,
}

/// Appends `tokens[i]` (at least one id each: a prefill chunk or one decode token) to
/// `sessions[i]` for every i in one forward pass (`ep_sessions_append`): the routed experts of
/// all of them are read once. The sessions must be of one model (the borrows make them
/// distinct). Each session's logits are those of appending its tokens alone. After an error
/// other than [`Status::InvalidArgument`], every session of the call must be reset.
pub fn append_many(sessions: &mut [&mut Session<'_>], tokens: &[&[i32]]) -> Result<()> {
    if sessions.len() != tokens.len() {
        return Err(Error::new(Status::InvalidArgument,
                              format!("append_many: {} sessions but {} token lists", sessions.len(), tokens.len())));
    }
    let raws: Vec<*mut sys::ep_session> = sessions.iter().map(|s| s.raw).collect();
    let ptrs: Vec<*const i32> = tokens.iter().map(|t| t.as_ptr()).collect();
    let counts: Vec<usize> = tokens.iter().map(|t| t.len()).collect();
    // SAFETY: three arrays of n entries, valid for the call; the sessions are borrowed mutably.
    check(unsafe { sys::ep_sessions_append(raws.as_ptr(), ptrs.as_ptr(), counts.as_ptr(), raws.len()) })
}

/// The next token of every session of `sessions` (of one model, each holding a token) in one
/// call (`ep_sessions_sample`, 0.5: one sampling launch and one download for all of them).
/// `options`: empty (greedy defaults for every session) or one entry per session. `top_logprobs`:
/// empty (no log-probabilities) or one entry per session: `None`, or the alternatives wanted
/// (0..=20) with the token's log-probability. Each result is what [`Session::sample`] (or
/// [`Session::sample_logprobs`]) gives for that session alone, and each draw counter advances the
/// same way; a refused call (naming the session's index) changes no session. Where no
/// log-probabilities were asked for, a result's `logprob` is 0 and its `top` empty.
#[cfg(feature = "sample_many")]
pub fn sample_many(sessions: &mut [&mut Session<'_>], options: &[GenerateOptions], top_logprobs: &[Option<u32>])
                   -> Result<Vec<TokenLogprobs>> {
    let n = sessions.len();
    if (!options.is_empty() && options.len() != n) || (!top_logprobs.is_empty() && top_logprobs.len() != n) {
        return Err(Error::new(Status::InvalidArgument,
                              format!("sample_many: {} sessions, {} option sets and {} log-probability counts", n,
                                      options.len(), top_logprobs.len())));
    }
    let raws: Vec<*mut sys::ep_session> = sessions.iter().map(|s| s.raw).collect();
    let opts = options.iter().map(|o| o.to_raw()).collect::<Result<Vec<_>>>()?;
    let opt_ptrs: Vec<*const sys::ep_generate_options> =
        opts.iter().map(|o| &o.raw as *const _ as *const sys::ep_generate_options).collect();
    let mut lps: Vec<sys::ep_token_logprobs> = (0..n)
        .map(|_| {
            let mut out = std::mem::MaybeUninit::<sys::ep_token_logprobs>::uninit();
            // SAFETY: init fills the whole struct.
            unsafe {
                sys::ep_token_logprobs_init(out.as_mut_ptr());
                out.assume_init()
            }
        })
        .collect();
    let lp_ptrs: Vec<*mut sys::ep_token_logprobs> = lps
        .iter_mut()
        .zip(0..n)
        .map(|(lp, i)| match top_logprobs.get(i) {
            Some(Some(_)) => lp as *mut _,
            _ => ptr::null_mut(),
        })
        .collect();
    let tops: Vec<u32> = (0..n).map(|i| top_logprobs.get(i).copied().flatten().unwrap_or(0)).collect();
    let mut tokens = vec![-1i32; n];
    // SAFETY: arrays of n entries (or null where the C API takes null for "none"), valid for the
    // call; the sessions are borrowed mutably; the options point into `opts`, alive until the end.
    check(unsafe {
        sys::ep_sessions_sample(tokens.as_mut_ptr(), if top_logprobs.is_empty() { ptr::null() } else { lp_ptrs.as_ptr() },
                                raws.as_ptr(), if options.is_empty() { ptr::null() } else { opt_ptrs.as_ptr() },
                                if top_logprobs.is_empty() { ptr::null() } else { tops.as_ptr() }, n)
    })?;
    Ok((0..n)
        .map(|i| {
            if lp_ptrs[i].is_null() {
                return TokenLogprobs { token: tokens[i], logprob: 0.0, top: Vec::new() };
            }
            let lp = &lps[i];
            let k = (lp.n_top as usize).min(sys::EP_MAX_TOP_LOGPROBS);
            TokenLogprobs { token: tokens[i], logprob: lp.logprob, top: (0..k).map(|j| (lp.top_tokens[j], lp.top_logprobs[j])).collect() }
        })
        .collect())
}

/// One decode step of a continuous batch: samples each session's next token with `options`
/// ([`Session::sample`]), appends all of them in one [`append_many`] call, and returns them in
/// the order of `sessions`.
pub fn step_batch(sessions: &mut [&mut Session<'_>], options: &GenerateOptions) -> Result<Vec<i32>> {
    let next = sessions.iter_mut().map(|s| s.sample(options)).collect::<Result<Vec<i32>>>()?;
    let lists: Vec<&[i32]> = next.iter().map(std::slice::from_ref).collect();
    append_many(sessions, &lists)?;
    Ok(next)
}

#[cfg(feature = "text")]
pub use text_stream::TextStream;

#[cfg(feature = "text")]
mod text_stream {
    use super::*;

    /// Incremental text of generated tokens for hosts that sample themselves
    /// (`ep_text_stream_*`): [`TextStream::push`] each token and get the text it completes, as
    /// [`Session::generate_text`] would stream it (complete UTF-8 only, special tokens left out,
    /// text that may begin a stop string held back until it is known not to). Borrows its
    /// tokenizer; one stream per generation; freed on `Drop`.
    pub struct TextStream<'t> {
        raw: *mut sys::ep_text_stream,
        stopped: bool,
        _tokenizer: &'t Tokenizer,
    }

    // SAFETY: text.h: a stream is used by one thread at a time (&mut self); its tokenizer is
    // immutable and Sync.
    unsafe impl Send for TextStream<'_> {}

    unsafe extern "C" fn collect_text(piece: *const c_char, length: usize, payload: *mut c_void) -> c_int {
        let out = &mut *(payload as *mut Vec<u8>);
        out.extend_from_slice(std::slice::from_raw_parts(piece as *const u8, length));
        0
    }

    impl<'t> TextStream<'t> {
        /// Opens a stream over `tokenizer`; the text ends where one of `stop_strings` (non-empty)
        /// appears.
        pub fn new(tokenizer: &'t Tokenizer, stop_strings: &[&str]) -> Result<TextStream<'t>> {
            let strings = stop_strings.iter().map(|s| c_string(s, "stop string")).collect::<Result<Vec<_>>>()?;
            let ptrs: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
            let mut raw = ptr::null_mut();
            // SAFETY: valid pointers for the call; the library copies the strings.
            check(unsafe {
                sys::ep_text_stream_open(&mut raw, tokenizer.raw,
                                         if ptrs.is_empty() { ptr::null() } else { ptrs.as_ptr() }, ptrs.len())
            })?;
            Ok(TextStream { raw, stopped: false, _tokenizer: tokenizer })
        }

        fn step(&mut self, token: Option<i32>) -> Result<String> {
            let mut bytes: Vec<u8> = Vec::new();
            let mut stopped = 0i32;
            let payload = &mut bytes as *mut Vec<u8> as *mut c_void;
            // SAFETY: valid handle; the payload outlives the call.
            check(unsafe {
                match token {
                    Some(t) => sys::ep_text_stream_push(self.raw, t, Some(collect_text), payload, &mut stopped),
                    None => sys::ep_text_stream_finish(self.raw, Some(collect_text), payload, &mut stopped),
                }
            })?;
            self.stopped = stopped != 0;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }

        /// Adds one generated token; returns the text it completes (often empty, at times
        /// several tokens' worth).
        pub fn push(&mut self, token: i32) -> Result<String> {
            self.step(Some(token))
        }

        /// Ends the text: returns what was held back (an incomplete UTF-8 sequence is dropped).
        pub fn finish(&mut self) -> Result<String> {
            self.step(None)
        }

        /// Whether a stop string appeared: the text before it was delivered, later tokens add
        /// nothing.
        pub fn stopped(&self) -> bool {
            self.stopped
        }
    }

    impl Drop for TextStream<'_> {
        fn drop(&mut self) {
            // SAFETY: owned handle, closed once.
            unsafe { sys::ep_text_stream_close(self.raw) }
        }
    }

    impl Tokenizer {
        /// A [`TextStream`] over this tokenizer.
        pub fn text_stream(&self, stop_strings: &[&str]) -> Result<TextStream<'_>> {
            TextStream::new(self, stop_strings)
        }
    }
}
