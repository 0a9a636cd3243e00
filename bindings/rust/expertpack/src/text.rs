//! The text API (`include/expertpack/text.h`): tokenizers, chat templates, text generation.
use super::*;

/// Chat template families (`ep_chat_template`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChatTemplate {
    #[default]
    Auto,
    DeepseekV4,
    KimiK3,
    /// No template is known (only reported by [`Tokenizer::info`]).
    None,
    Other(i32),
}

impl ChatTemplate {
    fn raw(self) -> i32 {
        match self {
            ChatTemplate::Auto => sys::EP_CHAT_TEMPLATE_AUTO,
            ChatTemplate::DeepseekV4 => sys::EP_CHAT_TEMPLATE_DEEPSEEK_V4,
            ChatTemplate::KimiK3 => sys::EP_CHAT_TEMPLATE_KIMI_K3,
            ChatTemplate::None => sys::EP_CHAT_TEMPLATE_NONE,
            ChatTemplate::Other(v) => v,
        }
    }
    fn from_raw(v: i32) -> ChatTemplate {
        match v {
            sys::EP_CHAT_TEMPLATE_AUTO => ChatTemplate::Auto,
            sys::EP_CHAT_TEMPLATE_DEEPSEEK_V4 => ChatTemplate::DeepseekV4,
            sys::EP_CHAT_TEMPLATE_KIMI_K3 => ChatTemplate::KimiK3,
            sys::EP_CHAT_TEMPLATE_NONE => ChatTemplate::None,
            o => ChatTemplate::Other(o),
        }
    }
}

/// What a tokenizer is (`ep_tokenizer_properties`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenizerInfo {
    pub vocab_size: u32,
    pub bos_id: i32,
    pub eos_id: i32,
    pub end_of_turn_id: i32,
    pub chat_template: ChatTemplate,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.to_string(), content: content.to_string(), reasoning_content: None }
    }
}

/// Options of chat rendering (`ep_chat_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatOptions {
    pub template: ChatTemplate,
    /// `None`: the template's default.
    pub thinking: Option<bool>,
    pub add_generation_prompt: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { template: ChatTemplate::Auto, thinking: None, add_generation_prompt: true }
    }
}

impl ChatOptions {
    fn to_raw(self) -> sys::ep_chat_options {
        // SAFETY: buffer large enough for any version of the struct.
        let mut o: sys::ep_chat_options = unsafe { negotiated(sys::ep_chat_options_init) };
        o.chat_template = self.template.raw();
        o.thinking = match self.thinking {
            None => -1,
            Some(true) => 1,
            Some(false) => 0,
        };
        o.add_generation_prompt = self.add_generation_prompt as i32;
        o
    }
}

struct RawMessages {
    _strings: Vec<Option<CString>>,
    messages: Vec<sys::ep_chat_message>,
}

fn raw_messages(messages: &[ChatMessage]) -> Result<RawMessages> {
    let mut strings = Vec::new();
    let mut raw = Vec::new();
    for m in messages {
        let role = c_string(&m.role, "chat role")?;
        let content = c_string(&m.content, "chat content")?;
        let reasoning = match &m.reasoning_content {
            Some(r) => Some(c_string(r, "chat reasoning_content")?),
            None => None,
        };
        raw.push(sys::ep_chat_message {
            role: role.as_ptr(),
            content: content.as_ptr(),
            reasoning_content: reasoning.as_ref().map_or(ptr::null(), |r| r.as_ptr()),
        });
        // CString's heap buffer does not move when the CString is moved into the Vec.
        strings.push(Some(role));
        strings.push(Some(content));
        strings.push(reasoning);
    }
    Ok(RawMessages { _strings: strings, messages: raw })
}

/// An open tokenizer (immutable: `Send + Sync`).
pub struct Tokenizer {
    pub(crate) raw: *mut sys::ep_tokenizer,
}

// SAFETY: text.h: a tokenizer is immutable; any number of threads may use one at once.
unsafe impl Send for Tokenizer {}
unsafe impl Sync for Tokenizer {}

impl Drop for Tokenizer {
    fn drop(&mut self) {
        // SAFETY: owned handle, closed once.
        unsafe { sys::ep_tokenizer_close(self.raw) }
    }
}

/// Calls a C function that fills a buffer and reports the size it needs, until it fits.
fn fill_text(mut call: impl FnMut(*mut c_char, usize, &mut usize) -> sys::ep_status) -> Result<String> {
    let mut len = 0usize;
    check(call(ptr::null_mut(), 0, &mut len))?;
    loop {
        let cap = len + 1;
        let mut buf = vec![0u8; cap];
        check(call(buf.as_mut_ptr() as *mut c_char, cap, &mut len))?;
        if len < cap {
            buf.truncate(len);
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
    }
}

impl Tokenizer {
    /// Opens a tokenizer file: a .gguf, a tokenizer.json (or its folder), or a tiktoken file.
    pub fn open(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_tokenizer_open(&mut raw, p.as_ptr()) })?;
        Ok(Tokenizer { raw })
    }

    pub fn info(&self) -> Result<TokenizerInfo> {
        // SAFETY: buffer large enough for any version of the struct.
        let mut p: sys::ep_tokenizer_properties = unsafe { negotiated(sys::ep_tokenizer_properties_init) };
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_tokenizer_info(&mut p, self.raw) })?;
        Ok(TokenizerInfo {
            vocab_size: p.vocab_size,
            bos_id: p.bos_id,
            eos_id: p.eos_id,
            end_of_turn_id: p.end_of_turn_id,
            chat_template: ChatTemplate::from_raw(p.chat_template),
        })
    }

    /// The id of one token given by its text.
    pub fn token_id(&self, token: &str) -> Result<i32> {
        let t = c_string(token, "token")?;
        let mut id = 0i32;
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_tokenizer_token_id(&mut id, self.raw, t.as_ptr()) })?;
        Ok(id)
    }

    /// Token ids of `text` (`add_special`: BOS/EOS as configured; `special_as_text`: do not
    /// match special tokens).
    pub fn encode(&self, text: &str, add_special: bool, special_as_text: bool) -> Result<Vec<i32>> {
        let flags = (if add_special { sys::EP_TOKENIZE_ADD_SPECIAL } else { 0 })
            | (if special_as_text { sys::EP_TOKENIZE_SPECIAL_AS_TEXT } else { 0 });
        let mut count = 0usize;
        let text_ptr = text.as_ptr() as *const c_char;
        // SAFETY: measuring call with capacity 0.
        check(unsafe { sys::ep_tokenize(ptr::null_mut(), 0, &mut count, self.raw, text_ptr, text.len(), flags) })?;
        loop {
            let cap = count;
            let mut ids = vec![0i32; cap.max(1)];
            // SAFETY: buffer of cap ids.
            check(unsafe { sys::ep_tokenize(ids.as_mut_ptr(), cap, &mut count, self.raw, text_ptr, text.len(), flags) })?;
            if count <= cap {
                ids.truncate(count);
                return Ok(ids);
            }
        }
    }

    /// Text of token ids (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[i32], skip_special: bool) -> Result<String> {
        let flags = if skip_special { sys::EP_DETOKENIZE_SKIP_SPECIAL } else { 0 };
        fill_text(|buf, cap, len| {
            // SAFETY: buffer of cap bytes (or NULL with 0).
            unsafe { sys::ep_detokenize(buf, cap, len, self.raw, ids.as_ptr(), ids.len(), flags) }
        })
    }

    /// A conversation rendered with a chat template.
    pub fn render_chat(&self, messages: &[ChatMessage], options: ChatOptions) -> Result<String> {
        let m = raw_messages(messages)?;
        let o = options.to_raw();
        fill_text(|buf, cap, len| {
            // SAFETY: buffer of cap bytes (or NULL with 0); messages valid during the call.
            unsafe { sys::ep_chat_render(buf, cap, len, self.raw, m.messages.as_ptr(), m.messages.len(), &o) }
        })
    }
}

impl Model {
    /// The model's own tokenizer; it may outlive the model.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_tokenizer_open_model(&mut raw, self.raw) })?;
        Ok(Tokenizer { raw })
    }
}

/// The result of text generation.
#[derive(Debug, Clone, PartialEq)]
pub struct TextGeneration {
    /// The streamed pieces joined.
    pub text: String,
    pub stats: GenerateStats,
    pub cancelled: bool,
}

struct TextState<'a> {
    f: &'a mut dyn FnMut(&str) -> ControlFlow<()>,
    text: String,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn text_trampoline(piece: *const c_char, length: usize, payload: *mut c_void) -> c_int {
    let st = &mut *(payload as *mut TextState);
    let bytes = std::slice::from_raw_parts(piece as *const u8, length);
    let text = String::from_utf8_lossy(bytes);
    st.text.push_str(&text);
    match catch_unwind(AssertUnwindSafe(|| (st.f)(&text))) {
        Ok(ControlFlow::Continue(())) => 0,
        Ok(ControlFlow::Break(())) => 1,
        Err(p) => {
            st.panic = Some(p);
            1
        }
    }
}

impl<'m> Session<'m> {
    fn text_call(&mut self, on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
                 call: impl FnOnce(*mut sys::ep_generate_stats, *mut c_void) -> sys::ep_status) -> Result<TextGeneration> {
        let mut stats = new_stats();
        let mut state = TextState { f: on_text, text: String::new(), panic: None };
        let code = call(&mut stats as *mut _ as *mut sys::ep_generate_stats, &mut state as *mut TextState as *mut c_void);
        if let Some(p) = state.panic.take() {
            resume_unwind(p);
        }
        let cancelled = code == sys::EP_ERR_CANCELLED;
        if !cancelled {
            check(code)?;
        }
        Ok(TextGeneration { text: state.text, stats: stats.into(), cancelled })
    }

    /// Appends a text prompt and generates text, streaming complete UTF-8 pieces to `on_text`.
    pub fn generate_text(&mut self, tokenizer: &Tokenizer, prompt: &str, options: &GenerateOptions,
                         mut on_text: impl FnMut(&str) -> ControlFlow<()>) -> Result<TextGeneration> {
        let opts = options.to_raw()?;
        let p = c_string(prompt, "prompt")?;
        let raw = self.raw;
        self.text_call(&mut on_text, |stats, payload| {
            // SAFETY: valid pointers for the duration of the call.
            unsafe {
                sys::ep_generate_text(stats, raw, tokenizer.raw, p.as_ptr(),
                                      &opts.raw as *const _ as *const sys::ep_generate_options,
                                      Some(text_trampoline), payload)
            }
        })
    }

    /// Renders the conversation and generates the assistant's answer; keep the session for the
    /// next turn (the common prefix is reused).
    pub fn generate_chat(&mut self, tokenizer: &Tokenizer, messages: &[ChatMessage], chat: ChatOptions,
                         options: &GenerateOptions, mut on_text: impl FnMut(&str) -> ControlFlow<()>)
        -> Result<TextGeneration> {
        let opts = options.to_raw()?;
        let m = raw_messages(messages)?;
        let c = chat.to_raw();
        let raw = self.raw;
        self.text_call(&mut on_text, |stats, payload| {
            // SAFETY: valid pointers for the duration of the call.
            unsafe {
                sys::ep_generate_chat(stats, raw, tokenizer.raw, m.messages.as_ptr(), m.messages.len(), &c,
                                      &opts.raw as *const _ as *const sys::ep_generate_options,
                                      Some(text_trampoline), payload)
            }
        })
    }
}
