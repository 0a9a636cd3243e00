//! Safe Rust bindings of libexpertpack (the C API of `include/expertpack/expertpack.h`).
//!
//! Every fallible call returns [`Result`]; the [`Error`] carries the C status ([`Status`]) and
//! the library's message (`ep_last_error()`, naming the file, offset or tensor). Handles free
//! themselves on `Drop`; a [`Session`] borrows its [`Model`], so a model cannot be closed while
//! a session on it is alive.
//!
//! ```no_run
//! use expertpack::{GenerateOptions, Model, ModelOptions};
//! use std::ops::ControlFlow;
//! let model = Model::open("model.epk", &ModelOptions::default())?;
//! let mut session = model.session()?;
//! let opts = GenerateOptions { max_new_tokens: 8, temperature: 0.8, seed: 7, ..Default::default() };
//! let out = session.generate(&[1, 2, 3], &opts, |token, _index| {
//!     println!("{}", token);
//!     ControlFlow::Continue(())
//! })?;
//! # Ok::<(), expertpack::Error>(())
//! ```
use std::any::Any;
use std::ffi::{CStr, CString};
use std::fmt;
use std::ops::ControlFlow;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Mutex;

pub use expertpack_sys as sys;

// ---------------------------------------------------------------------------------------------
// Status and errors
// ---------------------------------------------------------------------------------------------

/// A C `ep_status` other than `EP_OK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    OutOfMemory,
    Io,
    NotFound,
    Format,
    Corrupt,
    Unsupported,
    Version,
    StructSize,
    Shape,
    Cuda,
    NoDevice,
    Budget,
    Cancelled,
    Busy,
    Stale,
    Internal,
    /// A code this binding does not know (from a newer library).
    Other(i32),
}

impl Status {
    /// The status of a raw code (`EP_OK` is not a `Status`: `None`).
    pub fn from_raw(code: sys::ep_status) -> Option<Status> {
        use Status::*;
        Some(match code {
            sys::EP_OK => return None,
            sys::EP_ERR_INVALID_ARGUMENT => InvalidArgument,
            sys::EP_ERR_OUT_OF_MEMORY => OutOfMemory,
            sys::EP_ERR_IO => Io,
            sys::EP_ERR_NOT_FOUND => NotFound,
            sys::EP_ERR_FORMAT => Format,
            sys::EP_ERR_CORRUPT => Corrupt,
            sys::EP_ERR_UNSUPPORTED => Unsupported,
            sys::EP_ERR_VERSION => Version,
            sys::EP_ERR_STRUCT_SIZE => StructSize,
            sys::EP_ERR_SHAPE => Shape,
            sys::EP_ERR_CUDA => Cuda,
            sys::EP_ERR_NO_DEVICE => NoDevice,
            sys::EP_ERR_BUDGET => Budget,
            sys::EP_ERR_CANCELLED => Cancelled,
            sys::EP_ERR_BUSY => Busy,
            sys::EP_ERR_STALE => Stale,
            sys::EP_ERR_INTERNAL => Internal,
            other => Other(other),
        })
    }

    /// The raw C code.
    pub fn raw(self) -> sys::ep_status {
        use Status::*;
        match self {
            InvalidArgument => sys::EP_ERR_INVALID_ARGUMENT,
            OutOfMemory => sys::EP_ERR_OUT_OF_MEMORY,
            Io => sys::EP_ERR_IO,
            NotFound => sys::EP_ERR_NOT_FOUND,
            Format => sys::EP_ERR_FORMAT,
            Corrupt => sys::EP_ERR_CORRUPT,
            Unsupported => sys::EP_ERR_UNSUPPORTED,
            Version => sys::EP_ERR_VERSION,
            StructSize => sys::EP_ERR_STRUCT_SIZE,
            Shape => sys::EP_ERR_SHAPE,
            Cuda => sys::EP_ERR_CUDA,
            NoDevice => sys::EP_ERR_NO_DEVICE,
            Budget => sys::EP_ERR_BUDGET,
            Cancelled => sys::EP_ERR_CANCELLED,
            Busy => sys::EP_ERR_BUSY,
            Stale => sys::EP_ERR_STALE,
            Internal => sys::EP_ERR_INTERNAL,
            Other(c) => c,
        }
    }

    /// The C name of the code ("EP_ERR_NOT_FOUND"), from `ep_status_str()`.
    pub fn name(self) -> &'static str {
        status_str(self.raw())
    }
}

/// The name of any raw status code, `ep_status_str()` ("EP_OK", "EP_ERR_IO", ...).
pub fn status_str(code: sys::ep_status) -> &'static str {
    // SAFETY: ep_status_str returns a static, NUL-terminated string for any value.
    unsafe { static_str(sys::ep_status_str(code)) }
}

unsafe fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    CStr::from_ptr(p).to_str().unwrap_or("")
}

/// A failed call: the status and the library's one-line message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl Error {
    fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// `ep_last_error()` of the calling thread.
pub fn last_error() -> String {
    // SAFETY: never NULL; valid until the next call on this thread; copied at once.
    unsafe { CStr::from_ptr(sys::ep_last_error()).to_string_lossy().into_owned() }
}

fn check(code: sys::ep_status) -> Result<()> {
    match Status::from_raw(code) {
        None => Ok(()),
        Some(status) => Err(Error { status, message: last_error() }),
    }
}

fn c_path(path: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::new(Status::InvalidArgument, format!("{}: path contains a NUL byte", path.display())))
}

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(Status::InvalidArgument, format!("{}: contains a NUL byte", what)))
}

// ---------------------------------------------------------------------------------------------
// Options structs: negotiating struct_size with the loaded library
// ---------------------------------------------------------------------------------------------

/// Runs a C `_init()` into a buffer large enough for any later version of the struct, and
/// returns the defaults as `T` with `struct_size` = min(library's size, size of `T`), which both
/// sides understand (fields past it keep the library's defaults).
/// `U` is `T` or a later layout of it (`sys::*_v2`, which starts with `T`).
unsafe fn negotiated<T, U: Copy>(init: unsafe extern "C" fn(*mut T)) -> U {
    let mut buf = [0u64; 256];
    assert!(std::mem::size_of::<U>() <= std::mem::size_of_val(&buf));
    init(buf.as_mut_ptr() as *mut T);
    let lib_size = buf[0] as usize;
    let mut value: U = ptr::read(buf.as_ptr() as *const U);
    let size = lib_size.min(std::mem::size_of::<U>());
    ptr::write(&mut value as *mut U as *mut usize, size);
    value
}

fn struct_size_of<T>(v: &T) -> usize {
    // SAFETY: every struct passed here starts with its size_t struct_size.
    unsafe { *(v as *const T as *const usize) }
}

// ---------------------------------------------------------------------------------------------
// Version, features, logging
// ---------------------------------------------------------------------------------------------

/// The loaded library's version as text (e.g. "0.6.0").
pub fn version() -> &'static str {
    // SAFETY: a static string.
    unsafe { static_str(sys::ep_version_string()) }
}

/// The loaded library's version, `major * 10000 + minor * 100 + patch`.
pub fn version_number() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::ep_version_number() }
}

/// `ep_build_features()`: a bitwise OR of `sys::EP_FEATURE_*`.
pub fn build_features() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::ep_build_features() }
}

/// Number of usable CUDA devices (0 without CUDA or a driver).
pub fn cuda_device_count() -> Result<i32> {
    let mut n = 0i32;
    // SAFETY: valid out pointer.
    check(unsafe { sys::ep_cuda_device_count(&mut n) })?;
    Ok(n)
}

/// Severity of a log message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Off = 5,
}

impl LogLevel {
    fn from_raw(v: i32) -> LogLevel {
        match v {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            _ => LogLevel::Off,
        }
    }
}

/// Sets the process-wide minimum log level.
pub fn set_log_level(level: LogLevel) -> Result<()> {
    // SAFETY: plain value.
    check(unsafe { sys::ep_set_log_level(level as i32) })
}

type LogSink = Box<dyn Fn(LogLevel, &str) + Send + Sync>;
// The process-wide sink of set_log_callback(). The library's log sink is process-wide too, so
// this is the one place a global belongs; the lock also keeps a sink alive while it runs.
static LOG_SINK: Mutex<Option<LogSink>> = Mutex::new(None);

unsafe extern "C" fn log_trampoline(level: i32, message: *const c_char, _payload: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let text = if message.is_null() { std::borrow::Cow::Borrowed("") } else { CStr::from_ptr(message).to_string_lossy() };
        if let Ok(guard) = LOG_SINK.lock() {
            if let Some(sink) = guard.as_ref() {
                sink(LogLevel::from_raw(level), &text);
            }
        }
    }));
}

/// Routes the library's log messages to `sink` (`None`: back to stderr), and sets the minimum
/// level when `min_level` is given. The sink may be called from library threads; panics in it
/// are caught and dropped.
pub fn set_log_callback(sink: Option<LogSink>, min_level: Option<LogLevel>) -> Result<()> {
    let install = sink.is_some();
    *LOG_SINK.lock().unwrap_or_else(|e| e.into_inner()) = sink;
    let cb: sys::ep_log_fn = if install { Some(log_trampoline) } else { None };
    match min_level {
        None => {
            // SAFETY: a valid function pointer or NULL.
            unsafe { sys::ep_set_log_callback(cb, ptr::null_mut()) };
            Ok(())
        }
        Some(level) => {
            // SAFETY: the init writes into a buffer large enough for any version.
            let mut o: sys::ep_log_options = unsafe { negotiated(sys::ep_log_options_init) };
            o.min_level = level as i32;
            o.callback = cb;
            // SAFETY: a valid options struct.
            check(unsafe { sys::ep_log_configure(&o) })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Store statistics
// ---------------------------------------------------------------------------------------------

/// Counters of an expert store (`ep_store_stats`). The counters after `slot_bytes` are `None`
/// with a library older than them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub acquires: u64,
    pub pack_reads: u64,
    pub pack_read_bytes: u64,
    pub pack_read_ns: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    pub resident_experts: u64,
    pub resident_bytes: u64,
    pub h2d_bytes: u64,
    pub io_errors: u64,
    pub fallback_count: u64,
    pub cache_slots: u64,
    pub slot_bytes: u64,
    /// Cache misses served from the host-RAM tier (one copy, no pack read).
    pub host_hits: Option<u64>,
    /// Cache misses not in the host tier (read from the pack); 0 without a tier.
    pub host_misses: Option<u64>,
    /// Experts evicted from the cache and kept in the host tier.
    pub demotions: Option<u64>,
    /// Payload bytes held by the host tier now.
    pub host_resident_bytes: Option<u64>,
    /// Slots of the host tier (0: no tier).
    pub host_slots: Option<u64>,
    /// Experts loaded ahead of their layer from a prediction ([`ModelOptions::prefetch`]).
    pub prefetch_issued: Option<u64>,
    /// Prefetched experts their layer then asked for.
    pub prefetch_used: Option<u64>,
}

impl From<sys::ep_store_stats> for StoreStats {
    fn from(s: sys::ep_store_stats) -> Self {
        let v2 = |v: u64| if s.struct_size >= std::mem::size_of::<sys::ep_store_stats>() { Some(v) } else { None };
        StoreStats {
            host_hits: v2(s.host_hits),
            host_misses: v2(s.host_misses),
            demotions: v2(s.demotions),
            host_resident_bytes: v2(s.host_resident_bytes),
            host_slots: v2(s.host_slots),
            prefetch_issued: v2(s.prefetch_issued),
            prefetch_used: v2(s.prefetch_used),
            acquires: s.acquires,
            pack_reads: s.pack_reads,
            pack_read_bytes: s.pack_read_bytes,
            pack_read_ns: s.pack_read_ns,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_evictions: s.cache_evictions,
            resident_experts: s.resident_experts,
            resident_bytes: s.resident_bytes,
            h2d_bytes: s.h2d_bytes,
            io_errors: s.io_errors,
            fallback_count: s.fallback_count,
            cache_slots: s.cache_slots,
            slot_bytes: s.slot_bytes,
        }
    }
}

/// An `ep_store_stats` with a struct_size the loaded library accepts (its own or this layout's).
fn empty_store_stats() -> sys::ep_store_stats {
    // SAFETY: buffer large enough for any version of the struct.
    unsafe { negotiated(sys::ep_store_stats_init) }
}

/// Reads a statistics JSON file written by an expert store (`ep_store_stats_read_file`).
pub fn read_store_stats(path: impl AsRef<Path>) -> Result<StoreStats> {
    let p = c_path(path.as_ref())?;
    let mut s = empty_store_stats();
    // SAFETY: valid pointers.
    check(unsafe { sys::ep_store_stats_read_file(&mut s, p.as_ptr()) })?;
    Ok(s.into())
}

// ---------------------------------------------------------------------------------------------
// Pack
// ---------------------------------------------------------------------------------------------

/// How much [`Pack::open`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validation {
    Structure = 0,
    Sampled = 1,
    Full = 2,
}

/// Geometry and identity of a pack (`ep_pack_properties`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackInfo {
    pub format_version: u32,
    pub num_layers: u32,
    pub num_experts: u32,
    pub num_roles: u32,
    pub top_k: u32,
    pub first_layer: u32,
    pub alignment: u64,
    pub data_start: u64,
    pub object_stride: u64,
    pub max_object_bytes: u64,
    pub file_size: u64,
    pub source_files_sha256: [u8; 32],
    pub model_identity_sha256: [u8; 32],
    pub config_sha256: [u8; 32],
}

/// Where one expert's object lies (`ep_pack_object_info`).
pub type PackObject = sys::ep_pack_object_info;

/// An open, validated Expert Pack (read-only; `Send + Sync`: the C object is immutable).
pub struct Pack {
    raw: *mut sys::ep_pack,
}

// SAFETY: pack.h: an ep_pack is immutable after opening; any thread may use it concurrently.
unsafe impl Send for Pack {}
unsafe impl Sync for Pack {}

impl Pack {
    pub fn open(path: impl AsRef<Path>, validation: Validation) -> Result<Pack> {
        let p = c_path(path.as_ref())?;
        // SAFETY: buffer large enough for any version of the struct.
        let mut o: sys::ep_pack_open_options = unsafe { negotiated(sys::ep_pack_open_options_init) };
        o.validation = validation as i32;
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_pack_open(&mut raw, p.as_ptr(), &o) })?;
        Ok(Pack { raw })
    }

    pub fn info(&self) -> Result<PackInfo> {
        // SAFETY: zeroed POD with struct_size set.
        let mut p: sys::ep_pack_properties = unsafe { std::mem::zeroed() };
        p.struct_size = std::mem::size_of::<sys::ep_pack_properties>();
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_pack_info(&mut p, self.raw) })?;
        Ok(PackInfo {
            format_version: p.format_version,
            num_layers: p.num_layers,
            num_experts: p.num_experts,
            num_roles: p.num_roles,
            top_k: p.top_k,
            first_layer: p.first_layer,
            alignment: p.alignment,
            data_start: p.data_start,
            object_stride: p.object_stride,
            max_object_bytes: p.max_object_bytes,
            file_size: p.file_size,
            source_files_sha256: p.source_files_sha256,
            model_identity_sha256: p.model_identity_sha256,
            config_sha256: p.config_sha256,
        })
    }

    pub fn object(&self, layer: u32, expert: u32) -> Result<PackObject> {
        let mut o = PackObject::default();
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_pack_object(&mut o, self.raw, layer, expert) })?;
        Ok(o)
    }
}

impl Drop for Pack {
    fn drop(&mut self) {
        // SAFETY: owned handle, closed once.
        unsafe { sys::ep_pack_close(self.raw) }
    }
}

// ---------------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------------

/// Where a model computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Auto = 0,
    Cpu = 1,
    Cuda = 2,
}

/// Options of [`Model::open`] (`ep_model_options`). `Default` gives the library's defaults.
#[derive(Debug, Clone, Default)]
pub struct ModelOptions {
    pub device: Device,
    pub device_index: i32,
    /// Expert cache budget in bytes; 0 = room for every expert (at most half the memory).
    pub cache_budget_bytes: u64,
    pub staging_slots: u32,
    pub queue_depth: u32,
    pub read_splits: u32,
    /// `Some(true)`: O_DIRECT; `Some(false)`: buffered; `None`: automatic.
    pub direct_io: Option<bool>,
    /// Where packs built from sources go (`None`: `$XDG_CACHE_HOME/expertpack`).
    pub pack_dir: Option<PathBuf>,
    /// `Some(false)`: never build or rebuild a pack (NotFound / Stale instead); `None`: the
    /// library's default (build a missing pack, rebuild a stale one).
    pub pack_build: Option<bool>,
    /// Read every routed expert into memory at open instead of serving them from a pack.
    pub resident_experts: bool,
    /// Threads of the CPU backend; 0: `EP_CPU_THREADS`, else the hardware concurrency (results
    /// are bitwise the same for any count).
    pub cpu_threads: i32,
    /// Bytes of a host-RAM tier below the expert cache (evicted experts asked for at least twice
    /// come back with one copy instead of a pack read); 0: no tier. More than the process may
    /// still take fails with [`Status::Budget`].
    pub host_cache_bytes: u64,
    /// `Some(false)`: every read of a layer completes before its experts are computed;
    /// `None`: the library's default (overlapped). Results are bitwise the same.
    pub overlap_reads: Option<bool>,
    /// `Some(true)`: each MoE layer predicts the next layer's experts and reads the missing ones
    /// ahead; `None`: the library's default (off). Results are bitwise the same.
    pub prefetch: Option<bool>,
    /// Eviction policy of the cache and the host tier: "decay", "decay-bypass", "lru",
    /// "sglang-lfu"; `None`: "decay".
    pub cache_policy: Option<String>,
    /// Read the routed experts from the source files themselves, through a small source index in
    /// `pack_dir`, instead of an Expert Pack (not with a pack as the path, nor with
    /// `resident_experts`).
    pub no_pack: bool,
    /// Bytes all sessions' decode state may take together; an append, open or fork past it fails
    /// with [`Status::Budget`] and changes nothing. 0: automatic (the free GPU memory after the
    /// weights and the expert cache less 1 GiB; on the CPU a quarter of the physical memory).
    pub kv_budget_bytes: u64,
}

/// What a model is (`ep_model_properties`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub architecture: String,
    pub vocab_size: u32,
    pub num_layers: u32,
    pub hidden_size: u32,
    pub num_experts: u32,
    pub experts_per_token: u32,
    pub weight_bytes: u64,
    /// Where the model runs: [`Device::Cpu`] or [`Device::Cuda`] (what [`Device::Auto`] chose).
    pub device: Device,
    /// The CUDA device's ordinal; -1 on the CPU.
    pub device_index: i32,
}

/// An open model. Sessions borrow it; it is `Sync`: sessions on several threads may share it.
pub struct Model {
    raw: *mut sys::ep_model,
}

// SAFETY: model.h: a model may be shared by sessions used from any number of threads at once
// (the library serialises its forward passes); it has no thread affinity.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

struct ProgressState<'a> {
    f: &'a mut dyn FnMut(u64, u64),
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn progress_trampoline(done: u64, total: u64, payload: *mut c_void) {
    let st = &mut *(payload as *mut ProgressState);
    if st.panic.is_some() {
        return;
    }
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| (st.f)(done, total))) {
        st.panic = Some(p);
    }
}

impl Model {
    /// Opens a model: a .gguf, a safetensors checkpoint folder, or an Expert Pack (.epk).
    pub fn open(path: impl AsRef<Path>, options: &ModelOptions) -> Result<Model> {
        Self::open_impl(path.as_ref(), options, None)
    }

    /// As [`Model::open`], calling `progress(done_bytes, total_bytes)` while a pack is built.
    pub fn open_with_progress(path: impl AsRef<Path>, options: &ModelOptions, mut progress: impl FnMut(u64, u64))
        -> Result<Model> {
        Self::open_impl(path.as_ref(), options, Some(&mut progress))
    }

    fn open_impl(path: &Path, options: &ModelOptions, progress: Option<&mut dyn FnMut(u64, u64)>) -> Result<Model> {
        let p = c_path(path)?;
        let pack_dir = match &options.pack_dir {
            Some(d) => Some(c_path(d)?),
            None => None,
        };
        // SAFETY: buffer large enough for any version of the struct.
        let mut o: sys::ep_model_options = unsafe { negotiated(sys::ep_model_options_init) };
        o.device = options.device as i32;
        o.device_index = options.device_index;
        o.cache_budget_bytes = options.cache_budget_bytes;
        o.staging_slots = options.staging_slots;
        o.queue_depth = options.queue_depth;
        o.read_splits = options.read_splits;
        o.direct_io = match options.direct_io {
            None => -1,
            Some(true) => 1,
            Some(false) => 0,
        };
        o.pack_dir = pack_dir.as_ref().map_or(ptr::null(), |d| d.as_ptr());
        if let Some(v) = options.pack_build {
            o.pack_build = v as i32;
        }
        o.resident_experts = options.resident_experts as i32;
        let policy = match &options.cache_policy {
            Some(p) => Some(c_string(p, "cache_policy")?),
            None => None,
        };
        let appended = options.cpu_threads != 0
            || options.host_cache_bytes != 0
            || options.overlap_reads.is_some()
            || options.prefetch.is_some()
            || policy.is_some();
        if appended {
            if o.struct_size < sys::EP_MODEL_OPTIONS_V2_SIZE {
                return Err(Error::new(Status::Unsupported, format!(
                    "model options: cpu_threads, host_cache_bytes, overlap_reads, prefetch and cache_policy need a newer \
                     libexpertpack (its ep_model_options has {} bytes)", o.struct_size)));
            }
            o.cpu_threads = options.cpu_threads;
            o.host_cache_bytes = options.host_cache_bytes;
            if let Some(v) = options.overlap_reads {
                o.overlap_reads = v as i32;
            }
            if let Some(v) = options.prefetch {
                o.prefetch = v as i32;
            }
            o.cache_policy = policy.as_ref().map_or(ptr::null(), |p| p.as_ptr());
        }
        if options.no_pack {
            if o.struct_size < sys::EP_MODEL_OPTIONS_V3_SIZE {
                return Err(Error::new(Status::Unsupported, format!(
                    "model options: no_pack needs a newer libexpertpack (its ep_model_options has {} bytes)", o.struct_size)));
            }
            o.no_pack = 1;
        }
        if options.kv_budget_bytes != 0 {
            if o.struct_size < std::mem::size_of::<sys::ep_model_options>() {
                return Err(Error::new(Status::Unsupported, format!(
                    "model options: kv_budget_bytes needs a newer libexpertpack (its ep_model_options has {} bytes)",
                    o.struct_size)));
            }
            o.kv_budget_bytes = options.kv_budget_bytes;
        }
        let mut state = progress.map(|f| ProgressState { f, panic: None });
        if let Some(st) = state.as_mut() {
            o.progress = Some(progress_trampoline);
            o.progress_payload = st as *mut ProgressState as *mut c_void;
        }
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers; the payload outlives the call.
        let code = unsafe { sys::ep_model_open(&mut raw, p.as_ptr(), &o) };
        let model = if raw.is_null() { None } else { Some(Model { raw }) };
        if let Some(p) = state.and_then(|s| s.panic) {
            drop(model);
            resume_unwind(p);
        }
        check(code)?;
        model.ok_or_else(|| Error::new(Status::Internal, "ep_model_open returned no model"))
    }

    /// The Expert Pack serving the routed experts (`None` with resident experts).
    pub fn pack_path(&self) -> Option<PathBuf> {
        // SAFETY: valid handle; the string is copied at once.
        let p = unsafe { sys::ep_model_pack_path(self.raw) };
        if p.is_null() {
            return None;
        }
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: NUL-terminated, valid while the model is open.
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(p) }.to_bytes())))
    }

    pub fn info(&self) -> Result<ModelInfo> {
        // SAFETY: zeroed POD.
        let mut p: sys::ep_model_properties = unsafe { std::mem::zeroed() };
        p.struct_size = std::mem::size_of::<sys::ep_model_properties>();
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_model_info(&mut p, self.raw) })?;
        // SAFETY: the library NUL-terminates architecture.
        let arch = unsafe { CStr::from_ptr(p.architecture.as_ptr()) }.to_string_lossy().into_owned();
        Ok(ModelInfo {
            architecture: arch,
            vocab_size: p.vocab_size,
            num_layers: p.num_layers,
            hidden_size: p.hidden_size,
            num_experts: p.num_experts,
            experts_per_token: p.experts_per_token,
            weight_bytes: p.weight_bytes,
            device: if p.device == Device::Cuda as i32 { Device::Cuda } else { Device::Cpu },
            device_index: p.device_index,
        })
    }

    /// Counters of the model's expert store.
    pub fn store_stats(&self) -> Result<StoreStats> {
        let mut s = empty_store_stats();
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_model_store_stats(&mut s, self.raw) })?;
        Ok(s.into())
    }

    /// Starts an empty sequence on this model.
    pub fn session(&self) -> Result<Session<'_>> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid pointers; the session's lifetime is tied to &self.
        check(unsafe { sys::ep_session_open(&mut raw, self.raw) })?;
        Ok(Session { raw, model: self })
    }

    /// The raw handle (still owned by `self`).
    pub fn as_raw(&self) -> *mut sys::ep_model {
        self.raw
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: owned handle; sessions borrow the model, so none is alive here.
        unsafe { sys::ep_model_close(self.raw) }
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions and generation
// ---------------------------------------------------------------------------------------------

/// Options of generation (`ep_generate_options`). `Default` gives the library's defaults;
/// `None` fields keep the library's default.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: u32,
    /// <= 0: greedy.
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u64,
    pub stop_token: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub repetition_window: Option<u32>,
    pub stop_tokens: Vec<i32>,
    /// Text generation only.
    pub stop_strings: Vec<String>,
    /// Text generation: do not stop at EOS / end of turn.
    pub ignore_eos: bool,
    /// (token, bias) pairs added to the logits before sampling (OpenAI's logit_bias): distinct
    /// tokens of the vocabulary, biases in -100..=100 (+100 in effect forces a token, -100
    /// forbids it). Needs a 0.4 library.
    pub logit_bias: Vec<(i32, f32)>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 16,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            stop_token: None,
            min_p: None,
            repetition_penalty: None,
            repetition_window: None,
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            ignore_eos: false,
            logit_bias: Vec::new(),
        }
    }
}

/// The C options and the buffers they point into.
struct RawGenerateOptions {
    raw: sys::ep_generate_options_v2,
    _stop_strings: Vec<CString>,
    _stop_string_ptrs: Vec<*const c_char>,
    _logit_bias: Vec<sys::ep_logit_bias>,
}

impl GenerateOptions {
    fn to_raw(&self) -> Result<RawGenerateOptions> {
        // SAFETY: buffer large enough for any version of the struct.
        let mut o: sys::ep_generate_options_v2 = unsafe { negotiated(sys::ep_generate_options_init) };
        let size = o.struct_size;
        let extended = size >= std::mem::offset_of!(sys::ep_generate_options_v2, logit_bias);
        let has_bias = size >= std::mem::size_of::<sys::ep_generate_options_v2>();
        if !self.logit_bias.is_empty() && !has_bias {
            return Err(Error::new(Status::Unsupported, "generate options: logit_bias needs libexpertpack 0.4"));
        }
        o.max_new_tokens = self.max_new_tokens;
        o.temperature = self.temperature;
        o.top_k = self.top_k;
        o.top_p = self.top_p;
        o.seed = self.seed;
        if let Some(t) = self.stop_token {
            o.stop_token = t;
        }
        let wants_extended = self.min_p.is_some()
            || self.repetition_penalty.is_some()
            || self.repetition_window.is_some()
            || !self.stop_tokens.is_empty()
            || !self.stop_strings.is_empty()
            || self.ignore_eos;
        if wants_extended && !extended {
            return Err(Error::new(Status::Unsupported,
                "generate options: min_p, repetition_penalty, stop_tokens, stop_strings and ignore_eos need a newer libexpertpack"));
        }
        let strings = self.stop_strings.iter().map(|s| c_string(s, "stop string")).collect::<Result<Vec<_>>>()?;
        let ptrs: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        if extended {
            if let Some(v) = self.min_p {
                o.min_p = v;
            }
            if let Some(v) = self.repetition_penalty {
                o.repetition_penalty = v;
            }
            if let Some(v) = self.repetition_window {
                o.repetition_window = v;
            }
            o.stop_tokens = if self.stop_tokens.is_empty() { ptr::null() } else { self.stop_tokens.as_ptr() };
            o.n_stop_tokens = self.stop_tokens.len();
            o.stop_strings = if ptrs.is_empty() { ptr::null() } else { ptrs.as_ptr() };
            o.n_stop_strings = ptrs.len();
            o.ignore_eos = self.ignore_eos as i32;
        }
        let bias: Vec<sys::ep_logit_bias> =
            self.logit_bias.iter().map(|&(token, bias)| sys::ep_logit_bias { token, bias }).collect();
        if has_bias {
            o.logit_bias = if bias.is_empty() { ptr::null() } else { bias.as_ptr() };
            o.n_logit_bias = bias.len();
        }
        Ok(RawGenerateOptions { raw: o, _stop_strings: strings, _stop_string_ptrs: ptrs, _logit_bias: bias })
    }
}

/// Why generation stopped (`ep_stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Length,
    Token,
    String,
    Cancelled,
    Other(i32),
}

/// Statistics of one generation call. The fields after `decode_seconds` are `None` with a
/// library older than them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateStats {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub stop_reason: Option<StopReason>,
    pub reused_tokens: Option<u32>,
    pub prefill_tokens_per_second: Option<f64>,
    pub decode_tokens_per_second: Option<f64>,
    pub session_tokens: Option<u64>,
    /// Routed-expert bytes read from the Expert Pack during the prompt pass (0 with resident experts).
    pub prefill_expert_bytes: Option<u64>,
    /// The same during the generation steps.
    pub decode_expert_bytes: Option<u64>,
}

fn new_stats() -> sys::ep_generate_stats_v2 {
    // SAFETY: buffer large enough for any version of the struct.
    unsafe { negotiated(sys::ep_generate_stats_init) }
}

impl From<sys::ep_generate_stats_v2> for GenerateStats {
    fn from(s: sys::ep_generate_stats_v2) -> Self {
        let size = struct_size_of(&s);
        let full = size >= std::mem::offset_of!(sys::ep_generate_stats_v2, prefill_expert_bytes);
        let bytes = size >= std::mem::size_of::<sys::ep_generate_stats_v2>();
        GenerateStats {
            prompt_tokens: s.v1.prompt_tokens,
            generated_tokens: s.v1.generated_tokens,
            prefill_seconds: s.v1.prefill_seconds,
            decode_seconds: s.v1.decode_seconds,
            stop_reason: if full {
                Some(match s.stop_reason {
                    sys::EP_STOP_LENGTH => StopReason::Length,
                    sys::EP_STOP_TOKEN => StopReason::Token,
                    sys::EP_STOP_STRING => StopReason::String,
                    sys::EP_STOP_CANCELLED => StopReason::Cancelled,
                    o => StopReason::Other(o),
                })
            } else {
                None
            },
            reused_tokens: if full { Some(s.reused_tokens) } else { None },
            prefill_tokens_per_second: if full { Some(s.prefill_tokens_per_second) } else { None },
            decode_tokens_per_second: if full { Some(s.decode_tokens_per_second) } else { None },
            session_tokens: if full { Some(s.session_tokens) } else { None },
            prefill_expert_bytes: if bytes { Some(s.prefill_expert_bytes) } else { None },
            decode_expert_bytes: if bytes { Some(s.decode_expert_bytes) } else { None },
        }
    }
}

/// The result of [`Session::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Every generated token, including the one the callback stopped at.
    pub tokens: Vec<i32>,
    pub stats: GenerateStats,
    /// The callback returned `ControlFlow::Break`.
    pub cancelled: bool,
}

/// Scores of [`Session::score`].
#[derive(Debug, Clone, PartialEq)]
pub struct Scores {
    /// Positions scored.
    pub n_tokens: usize,
    /// Values per position: top_k, or the vocabulary size for full logits.
    pub width: usize,
    /// Token ids, `n_tokens × width` row-major (empty for full logits).
    pub ids: Vec<i32>,
    /// Logits, `n_tokens × width` row-major (descending per row with top_k).
    pub logits: Vec<f32>,
}

impl Scores {
    /// Logits of row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.width..(i + 1) * self.width]
    }
    /// Ids of row `i` (top_k scoring only).
    pub fn row_ids(&self, i: usize) -> &[i32] {
        &self.ids[i * self.width..(i + 1) * self.width]
    }
}

/// One sequence's decode state on a [`Model`].
pub struct Session<'m> {
    raw: *mut sys::ep_session,
    model: &'m Model,
}

// SAFETY: model.h: a session may be used from any thread, but not from two at once: it is Send
// (its methods take &mut self or read-only queries) and not Sync.
unsafe impl Send for Session<'_> {}

struct TokenState<'a> {
    f: &'a mut dyn FnMut(i32, u32) -> ControlFlow<()>,
    tokens: Vec<i32>,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn token_trampoline(token: i32, index: u32, payload: *mut c_void) -> c_int {
    let st = &mut *(payload as *mut TokenState);
    st.tokens.push(token);
    match catch_unwind(AssertUnwindSafe(|| (st.f)(token, index))) {
        Ok(ControlFlow::Continue(())) => 0,
        Ok(ControlFlow::Break(())) => 1,
        Err(p) => {
            st.panic = Some(p);
            1
        }
    }
}

impl<'m> Session<'m> {
    /// Empties the session (position 0 again).
    pub fn reset(&mut self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { sys::ep_session_reset(self.raw) })
    }

    /// Tokens the session holds.
    pub fn len(&self) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid pointers.
        check(unsafe { sys::ep_session_length(&mut n, self.raw) })?;
        Ok(n)
    }

    /// Whether the session holds no token.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Appends `prompt` and generates tokens, calling `on_token(token, index)` for each;
    /// `ControlFlow::Break(())` stops (then `cancelled` is true). A panic in `on_token` stops
    /// the generation and is resumed here.
    pub fn generate(&mut self, prompt: &[i32], options: &GenerateOptions,
                    mut on_token: impl FnMut(i32, u32) -> ControlFlow<()>) -> Result<Generation> {
        let opts = options.to_raw()?;
        let mut stats = new_stats();
        let mut state = TokenState { f: &mut on_token, tokens: Vec::new(), panic: None };
        // SAFETY: valid pointers; state outlives the call; the v2 structs start with the v1 layout
        // and carry a struct_size the library accepts.
        let code = unsafe {
            sys::ep_generate(&mut stats as *mut _ as *mut sys::ep_generate_stats, self.raw,
                             if prompt.is_empty() { ptr::null() } else { prompt.as_ptr() }, prompt.len(),
                             &opts.raw as *const _ as *const sys::ep_generate_options, Some(token_trampoline),
                             &mut state as *mut TokenState as *mut c_void)
        };
        if let Some(p) = state.panic.take() {
            resume_unwind(p);
        }
        let cancelled = code == sys::EP_ERR_CANCELLED;
        if !cancelled {
            check(code)?;
        }
        Ok(Generation { tokens: state.tokens, stats: stats.into(), cancelled })
    }

    /// Teacher-forced scoring: appends `tokens`; row i holds the logits predicting the token
    /// after position i. `top_k` 0: full logits (`vocab_size` per row).
    pub fn score(&mut self, tokens: &[i32], top_k: u32) -> Result<Scores> {
        let width = if top_k == 0 { self.model.info()?.vocab_size as usize } else { top_k as usize };
        let mut ids = vec![0i32; if top_k == 0 { 0 } else { tokens.len() * width }];
        let mut logits = vec![0f32; tokens.len() * width];
        // SAFETY: buffers of n_tokens × width (ids unused and NULL with top_k 0).
        check(unsafe {
            sys::ep_score(self.raw, if tokens.is_empty() { ptr::null() } else { tokens.as_ptr() }, tokens.len(), top_k,
                          if top_k == 0 { ptr::null_mut() } else { ids.as_mut_ptr() }, logits.as_mut_ptr())
        })?;
        Ok(Scores { n_tokens: tokens.len(), width, ids, logits })
    }

    /// The model the session runs on.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The raw handle (still owned by `self`).
    pub fn as_raw(&self) -> *mut sys::ep_session {
        self.raw
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // SAFETY: owned handle, closed once.
        unsafe { sys::ep_session_close(self.raw) }
    }
}

#[cfg(feature = "text")]
mod text;
#[cfg(feature = "text")]
pub use text::*;

#[cfg(feature = "batch")]
mod batch;
#[cfg(feature = "batch")]
pub use batch::*;
