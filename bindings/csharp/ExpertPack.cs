// C# binding of libexpertpack (P/Invoke over include/expertpack/*.h). Builds with mono's mcs
// (C# 7) or any .NET SDK: errors throw ExpertPackException (Status + the library's message);
// handles are SafeHandles, so they are freed by Dispose() (deterministic) or, if forgotten, by
// the finalizer; a session keeps its model's handle alive.
//
// The library is loaded as "expertpack" (libexpertpack.so on Linux: LD_LIBRARY_PATH, or next to
// the assembly). The text API (Tokenizer, GenerateText, GenerateChat) needs a library that has
// it: otherwise EntryPointNotFoundException at the first call. So do the 0.2 session functions
// (Session.Fork, Sample, Append, Tokens, AppendMany, StepBatch, TextStream) with an older library,
// and Session.SampleMany (0.6) with a library before 0.6.
using System;
using System.Collections.Generic;
using System.Runtime.ExceptionServices;
using System.Runtime.InteropServices;
using System.Text;

namespace ExpertPack
{
    /// <summary>A C ep_status.</summary>
    public enum Status : int
    {
        Ok = 0, InvalidArgument = -1, OutOfMemory = -2, Io = -3, NotFound = -4, Format = -5, Corrupt = -6,
        Unsupported = -7, Version = -8, StructSize = -9, Shape = -10, Cuda = -11, NoDevice = -12, Budget = -13,
        Cancelled = -14, Busy = -15, Stale = -16, Internal = -17,
    }

    public enum LogLevel : int { Trace = 0, Debug = 1, Info = 2, Warn = 3, Error = 4, Off = 5 }
    public enum Device : int { Auto = 0, Cpu = 1, Cuda = 2 }
    public enum Validation : int { Structure = 0, Sampled = 1, Full = 2 }
    public enum StopReason : int { Length = 0, Token = 1, String = 2, Cancelled = 3 }
    public enum ChatTemplate : int { Auto = 0, DeepseekV4 = 1, KimiK3 = 2, None = 3 }

    /// <summary>A failed libexpertpack call.</summary>
    public class ExpertPackException : Exception
    {
        public Status Status { get; }
        /// <summary>ep_last_error(): names the file, offset or tensor.</summary>
        public string NativeMessage { get; }
        public string Function { get; }

        public ExpertPackException(string function, Status status, string message)
            : base(Native.StatusName(status) + ": " + message)
        {
            Function = function;
            Status = status;
            NativeMessage = message;
        }
    }

    // ------------------------------------------------------------------------------------------
    // Raw declarations
    // ------------------------------------------------------------------------------------------
    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate void LogFn(int level, IntPtr message, IntPtr payload);
    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate int TokenFn(int token, uint index, IntPtr payload);
    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate void ProgressFn(ulong done, ulong total, IntPtr payload);
    [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
    internal delegate int TextFn(IntPtr piece, UIntPtr length, IntPtr payload);

    [StructLayout(LayoutKind.Sequential)]
    internal struct LogOptions { public UIntPtr struct_size; public int min_level; public IntPtr callback; public IntPtr payload; }

    [StructLayout(LayoutKind.Sequential)]
    internal struct PackOpenOptions { public UIntPtr struct_size; public int validation; }

    [StructLayout(LayoutKind.Sequential)]
    internal unsafe struct PackProperties
    {
        public UIntPtr struct_size;
        public uint format_version, num_layers, num_experts, num_roles, top_k, first_layer;
        public ulong alignment, data_start, object_stride, max_object_bytes, file_size;
        public fixed byte source_files_sha256[32];
        public fixed byte model_identity_sha256[32];
        public fixed byte config_sha256[32];
    }

    [StructLayout(LayoutKind.Sequential)]
    internal unsafe struct PackObjectInfo
    {
        public ulong offset, bytes;
        public fixed ulong role_offset[3];
        public fixed ulong role_bytes[3];
        public fixed uint role_ggml_type[3];
        public uint reserved;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct StoreStatsRaw
    {
        public UIntPtr struct_size;
        public ulong acquires, pack_reads, pack_read_bytes, pack_read_ns, cache_hits, cache_misses, cache_evictions,
            resident_experts, resident_bytes, h2d_bytes, io_errors, fallback_count, cache_slots, slot_bytes;
        // appended after the first version:
        public ulong host_hits, host_misses, demotions, host_resident_bytes, host_slots, prefetch_issued, prefetch_used;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct ModelOptionsRaw
    {
        public UIntPtr struct_size;
        public int device, device_index;
        public ulong cache_budget_bytes;
        public uint staging_slots, queue_depth, read_splits;
        public int direct_io;
        public IntPtr pack_dir;
        public int pack_build, resident_experts;
        public IntPtr progress, progress_payload;
        public int cpu_threads;
        public ulong host_cache_bytes;
        public int overlap_reads, prefetch;
        public IntPtr cache_policy;
        public int no_pack;  // appended after 0.2.0
        public ulong kv_budget_bytes;  // appended after 0.4.0
    }

    [StructLayout(LayoutKind.Sequential)]
    internal unsafe struct ModelProperties
    {
        public UIntPtr struct_size;
        public fixed byte architecture[32];
        public uint vocab_size, num_layers, hidden_size, num_experts, experts_per_token;
        public ulong weight_bytes;
        public int device, device_index;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct GenerateOptionsRaw
    {
        public UIntPtr struct_size;
        public uint max_new_tokens;
        public float temperature;
        public int top_k;
        public float top_p;
        public ulong seed;
        public int stop_token;
        // appended after the first version:
        public float min_p, repetition_penalty;
        public uint repetition_window;
        public IntPtr stop_tokens;
        public UIntPtr n_stop_tokens;
        public IntPtr stop_strings;
        public UIntPtr n_stop_strings;
        public int ignore_eos;
        // 0.4:
        public IntPtr logit_bias;
        public UIntPtr n_logit_bias;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal unsafe struct TokenLogprobsRaw
    {
        public UIntPtr struct_size;
        public int token;
        public float logprob;
        public uint n_top;
        public fixed int top_tokens[20];
        public fixed float top_logprobs[20];
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct GenerateStatsRaw
    {
        public UIntPtr struct_size;
        public uint prompt_tokens, generated_tokens;
        public double prefill_seconds, decode_seconds;
        // appended after the first version:
        public int stop_reason;
        public uint reused_tokens;
        public double prefill_tokens_per_second, decode_tokens_per_second;
        public ulong session_tokens;
        public ulong prefill_expert_bytes, decode_expert_bytes;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct TokenizerProperties
    {
        public UIntPtr struct_size;
        public uint vocab_size;
        public int bos_id, eos_id, end_of_turn_id, chat_template;
    }

    [StructLayout(LayoutKind.Sequential)]
    internal struct ChatMessageRaw { public IntPtr role, content, reasoning_content; }

    [StructLayout(LayoutKind.Sequential)]
    internal struct ChatOptionsRaw { public UIntPtr struct_size; public int chat_template, thinking, add_generation_prompt; }

    internal static class Native
    {
        const string Lib = "expertpack";

        [DllImport(Lib)] public static extern IntPtr ep_status_str(int status);
        [DllImport(Lib)] public static extern IntPtr ep_last_error();
        [DllImport(Lib)] public static extern uint ep_version_number();
        [DllImport(Lib)] public static extern IntPtr ep_version_string();
        [DllImport(Lib)] public static extern void ep_log_options_init(IntPtr options);
        [DllImport(Lib)] public static extern int ep_log_configure(ref LogOptions options);
        [DllImport(Lib)] public static extern void ep_set_log_callback(IntPtr callback, IntPtr payload);
        [DllImport(Lib)] public static extern int ep_set_log_level(int level);
        [DllImport(Lib)] public static extern uint ep_build_features();
        [DllImport(Lib)] public static extern int ep_cuda_device_count(out int count);

        [DllImport(Lib)] public static extern void ep_pack_open_options_init(IntPtr options);
        [DllImport(Lib)] public static extern int ep_pack_open(out PackHandle pack, byte[] path, ref PackOpenOptions options);
        [DllImport(Lib)] public static extern int ep_pack_info(ref PackProperties props, PackHandle pack);
        [DllImport(Lib)] public static extern int ep_pack_object(out PackObjectInfo obj, PackHandle pack, uint layer, uint expert);
        [DllImport(Lib)] public static extern void ep_pack_close(IntPtr pack);

        [DllImport(Lib)] public static extern void ep_store_stats_init(IntPtr stats);
        [DllImport(Lib)] public static extern int ep_store_stats_read_file(ref StoreStatsRaw stats, byte[] path);

        [DllImport(Lib)] public static extern void ep_model_options_init(IntPtr options);
        [DllImport(Lib)] public static extern int ep_model_open(out ModelHandle model, byte[] path, ref ModelOptionsRaw options);
        [DllImport(Lib)] public static extern void ep_model_close(IntPtr model);
        [DllImport(Lib)] public static extern IntPtr ep_model_pack_path(ModelHandle model);
        [DllImport(Lib)] public static extern int ep_model_store_stats(ref StoreStatsRaw stats, ModelHandle model);
        [DllImport(Lib)] public static extern int ep_model_info(ref ModelProperties props, ModelHandle model);
        [DllImport(Lib)] public static extern int ep_session_open(out IntPtr session, ModelHandle model);
        [DllImport(Lib)] public static extern void ep_session_close(IntPtr session);
        [DllImport(Lib)] public static extern int ep_session_reset(SessionHandle session);
        [DllImport(Lib)] public static extern int ep_session_length(out ulong length, SessionHandle session);
        [DllImport(Lib)] public static extern void ep_generate_options_init(IntPtr options);
        [DllImport(Lib)] public static extern void ep_generate_stats_init(IntPtr stats);
        [DllImport(Lib)] public static extern int ep_generate(ref GenerateStatsRaw stats, SessionHandle session, int[] prompt,
                                                              UIntPtr n_prompt, ref GenerateOptionsRaw options, TokenFn callback, IntPtr payload);
        [DllImport(Lib)] public static extern int ep_score(SessionHandle session, int[] tokens, UIntPtr n_tokens, uint top_k,
                                                           int[] out_ids, float[] out_logits);

        [DllImport(Lib)] public static extern int ep_tokenizer_open(out TokenizerHandle tok, byte[] path);
        [DllImport(Lib)] public static extern int ep_tokenizer_open_model(out TokenizerHandle tok, ModelHandle model);
        [DllImport(Lib)] public static extern void ep_tokenizer_close(IntPtr tok);
        [DllImport(Lib)] public static extern void ep_tokenizer_properties_init(IntPtr props);
        [DllImport(Lib)] public static extern int ep_tokenizer_info(ref TokenizerProperties props, TokenizerHandle tok);
        [DllImport(Lib)] public static extern int ep_tokenizer_token_id(out int id, TokenizerHandle tok, byte[] token);
        [DllImport(Lib)] public static extern int ep_tokenize(int[] ids, UIntPtr capacity, out UIntPtr count, TokenizerHandle tok,
                                                              byte[] text, UIntPtr length, uint flags);
        [DllImport(Lib)] public static extern int ep_detokenize(byte[] text, UIntPtr capacity, out UIntPtr length, TokenizerHandle tok,
                                                                int[] ids, UIntPtr n_ids, uint flags);
        [DllImport(Lib)] public static extern void ep_chat_options_init(IntPtr options);
        [DllImport(Lib)] public static extern int ep_chat_render(byte[] text, UIntPtr capacity, out UIntPtr length, TokenizerHandle tok,
                                                                 ChatMessageRaw[] messages, UIntPtr n, ref ChatOptionsRaw options);
        [DllImport(Lib)] public static extern int ep_generate_text(ref GenerateStatsRaw stats, SessionHandle session, TokenizerHandle tok,
                                                                   byte[] prompt, ref GenerateOptionsRaw options, TextFn callback, IntPtr payload);
        [DllImport(Lib)] public static extern int ep_generate_chat(ref GenerateStatsRaw stats, SessionHandle session, TokenizerHandle tok,
                                                                   ChatMessageRaw[] messages, UIntPtr n, ref ChatOptionsRaw chat,
                                                                   ref GenerateOptionsRaw options, TextFn callback, IntPtr payload);

        // 0.2
        [DllImport(Lib)] public static extern int ep_sessions_append(IntPtr[] sessions, IntPtr[] tokens, UIntPtr[] n_tokens, UIntPtr n_sessions);
        [DllImport(Lib)] public static extern int ep_session_sample(out int token, SessionHandle session, ref GenerateOptionsRaw options);
        [DllImport(Lib)] public static extern int ep_session_sample_logprobs(ref TokenLogprobsRaw logprobs, SessionHandle session,
                                                                             ref GenerateOptionsRaw options, uint topLogprobs);
        [DllImport(Lib)] public static extern int ep_session_fork(out IntPtr session, SessionHandle original);
        [DllImport(Lib)] public static extern int ep_session_tokens(int[] tokens, UIntPtr capacity, out UIntPtr count, SessionHandle session);
        [DllImport(Lib)] public static extern int ep_text_stream_open(out IntPtr stream, TokenizerHandle tok, IntPtr[] stop_strings, UIntPtr n);
        [DllImport(Lib)] public static extern int ep_text_stream_push(TextStreamHandle stream, int token, TextFn callback, IntPtr payload, out int stopped);
        [DllImport(Lib)] public static extern int ep_text_stream_finish(TextStreamHandle stream, TextFn callback, IntPtr payload, out int stopped);
        [DllImport(Lib)] public static extern void ep_text_stream_close(IntPtr stream);

        // 0.5
        [DllImport(Lib)] public static extern int ep_sessions_sample(int[] out_tokens, IntPtr[] out_logprobs, IntPtr[] sessions,
                                                                     IntPtr[] options, uint[] top_logprobs, UIntPtr n_sessions);

        public static string Utf8(IntPtr p)
        {
            if (p == IntPtr.Zero) return null;
            int n = 0;
            while (Marshal.ReadByte(p, n) != 0) n++;
            var bytes = new byte[n];
            Marshal.Copy(p, bytes, 0, n);
            return Encoding.UTF8.GetString(bytes);
        }

        public static byte[] CString(string s)
        {
            if (s.IndexOf('\0') >= 0) throw new ArgumentException("string contains a NUL character");
            var b = Encoding.UTF8.GetBytes(s);
            Array.Resize(ref b, b.Length + 1);
            return b;
        }

        public static IntPtr AllocCString(string s)
        {
            var b = CString(s);
            var p = Marshal.AllocHGlobal(b.Length);
            Marshal.Copy(b, 0, p, b.Length);
            return p;
        }

        public static string StatusName(Status s) { return Utf8(ep_status_str((int)s)); }

        public static void Check(int status, string function)
        {
            if (status != 0) throw new ExpertPackException(function, (Status)status, Utf8(ep_last_error()) ?? "");
        }

        public delegate void InitFn(IntPtr p);

        /// <summary>Runs a C _init() into a buffer big enough for any later version of the struct
        /// and returns the defaults with struct_size = min(library's size, this layout's size).</summary>
        public static T Negotiated<T>(InitFn init) where T : struct
        {
            int mine = Marshal.SizeOf(typeof(T));
            IntPtr buf = Marshal.AllocHGlobal(2048);
            try
            {
                for (int i = 0; i < 2048; i++) Marshal.WriteByte(buf, i, 0);
                init(buf);
                long lib = Marshal.ReadIntPtr(buf).ToInt64();
                Marshal.WriteIntPtr(buf, new IntPtr(Math.Min(lib, mine)));
                return (T)Marshal.PtrToStructure(buf, typeof(T));
            }
            finally { Marshal.FreeHGlobal(buf); }
        }

        public static bool Covers<T>(UIntPtr structSize, string field)
        {
            long end = Marshal.OffsetOf(typeof(T), field).ToInt64() + 4;
            return (long)structSize.ToUInt64() >= end;
        }
    }

    // ------------------------------------------------------------------------------------------
    // Handles
    // ------------------------------------------------------------------------------------------
    internal sealed class PackHandle : SafeHandle
    {
        public PackHandle() : base(IntPtr.Zero, true) { }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected override bool ReleaseHandle() { Native.ep_pack_close(handle); return true; }
    }

    internal sealed class ModelHandle : SafeHandle
    {
        public ModelHandle() : base(IntPtr.Zero, true) { }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected override bool ReleaseHandle() { Native.ep_model_close(handle); return true; }
    }

    /// <summary>A handle whose C object uses another one (a session its model, a text stream its
    /// tokenizer): it holds a reference on that handle, which is so freed only after it.</summary>
    internal abstract class DependentHandle : SafeHandle
    {
        readonly SafeHandle parent;
        protected DependentHandle(IntPtr raw, SafeHandle parent) : base(IntPtr.Zero, true)
        {
            bool added = false;
            parent.DangerousAddRef(ref added);
            this.parent = parent;
            SetHandle(raw);
        }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected abstract void Close(IntPtr raw);
        protected override bool ReleaseHandle()
        {
            Close(handle);
            parent.DangerousRelease();
            return true;
        }
    }

    internal sealed class SessionHandle : DependentHandle
    {
        public SessionHandle(IntPtr raw, ModelHandle model) : base(raw, model) { }
        protected override void Close(IntPtr raw) { Native.ep_session_close(raw); }
    }

    internal sealed class TokenizerHandle : SafeHandle
    {
        public TokenizerHandle() : base(IntPtr.Zero, true) { }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected override bool ReleaseHandle() { Native.ep_tokenizer_close(handle); return true; }
    }

    internal sealed class TextStreamHandle : DependentHandle
    {
        public TextStreamHandle(IntPtr raw, TokenizerHandle tokenizer) : base(raw, tokenizer) { }
        protected override void Close(IntPtr raw) { Native.ep_text_stream_close(raw); }
    }

    // ------------------------------------------------------------------------------------------
    // Public API
    // ------------------------------------------------------------------------------------------
    /// <summary>Library-wide functions: version, status names, logging, devices.</summary>
    public static class Library
    {
        public static string Version { get { return Native.Utf8(Native.ep_version_string()); } }
        public static uint VersionNumber { get { return Native.ep_version_number(); } }
        public static uint BuildFeatures { get { return Native.ep_build_features(); } }
        public const uint FeatureCuda = 1, FeatureIoUring = 2;
        public static string StatusName(Status s) { return Native.StatusName(s); }
        /// <summary>ep_last_error() of the calling thread.</summary>
        public static string LastError { get { return Native.Utf8(Native.ep_last_error()) ?? ""; } }

        public static int CudaDeviceCount()
        {
            int n;
            Native.Check(Native.ep_cuda_device_count(out n), "ep_cuda_device_count");
            return n;
        }

        public static void SetLogLevel(LogLevel level) { Native.Check(Native.ep_set_log_level((int)level), "ep_set_log_level"); }

        static readonly object logLock = new object();
        static LogFn logDelegate;          // referenced while the library may call it
        static Action<LogLevel, string> logSink;

        static void OnLog(int level, IntPtr message, IntPtr payload)
        {
            var sink = logSink;
            if (sink == null) return;
            try { sink((LogLevel)level, Native.Utf8(message) ?? ""); }
            catch (Exception) { /* a log sink cannot fail into C */ }
        }

        /// <summary>Routes the library's log (process-wide) to sink; null restores stderr. The sink
        /// may run on library threads. With a level, the minimum level changes too.</summary>
        public static void SetLogCallback(Action<LogLevel, string> sink, LogLevel? level = null)
        {
            lock (logLock)
            {
                logSink = sink;
                if (logDelegate == null) logDelegate = OnLog;
                IntPtr fn = sink == null ? IntPtr.Zero : Marshal.GetFunctionPointerForDelegate(logDelegate);
                if (level == null)
                {
                    Native.ep_set_log_callback(fn, IntPtr.Zero);
                    return;
                }
                var o = Native.Negotiated<LogOptions>(Native.ep_log_options_init);
                o.min_level = (int)level.Value;
                o.callback = fn;
                Native.Check(Native.ep_log_configure(ref o), "ep_log_configure");
            }
        }

        /// <summary>Reads a statistics JSON file written by an expert store.</summary>
        public static StoreStats ReadStoreStats(string path)
        {
            var s = StoreStats.NewRaw();
            Native.Check(Native.ep_store_stats_read_file(ref s, Native.CString(path)), "ep_store_stats_read_file");
            return new StoreStats(s);
        }
    }

    /// <summary>Counters of an expert store.</summary>
    public sealed class StoreStats
    {
        public ulong Acquires, PackReads, PackReadBytes, PackReadNs, CacheHits, CacheMisses, CacheEvictions,
            ResidentExperts, ResidentBytes, H2DBytes, IoErrors, FallbackCount, CacheSlots, SlotBytes;
        /// <summary>Cache misses served from the host-RAM tier (one copy, no pack read); null with a library older than the counter (so are the ones below).</summary>
        public ulong? HostHits;
        /// <summary>Cache misses not in the host tier (read from the pack); 0 without a tier.</summary>
        public ulong? HostMisses;
        /// <summary>Experts evicted from the cache and kept in the host tier.</summary>
        public ulong? Demotions;
        /// <summary>Payload bytes held by the host tier now.</summary>
        public ulong? HostResidentBytes;
        /// <summary>Slots of the host tier (0: no tier).</summary>
        public ulong? HostSlots;
        /// <summary>Experts loaded ahead of their layer from a prediction (ModelOptions.Prefetch).</summary>
        public ulong? PrefetchIssued;
        /// <summary>Prefetched experts their layer then asked for.</summary>
        public ulong? PrefetchUsed;

        /// <summary>A struct whose struct_size the loaded library accepts (its own or this layout's).</summary>
        internal static StoreStatsRaw NewRaw() { return Native.Negotiated<StoreStatsRaw>(Native.ep_store_stats_init); }

        internal StoreStats(StoreStatsRaw s)
        {
            if ((long)s.struct_size.ToUInt64() >= Marshal.SizeOf(typeof(StoreStatsRaw)))
            {
                HostHits = s.host_hits; HostMisses = s.host_misses; Demotions = s.demotions;
                HostResidentBytes = s.host_resident_bytes; HostSlots = s.host_slots;
                PrefetchIssued = s.prefetch_issued; PrefetchUsed = s.prefetch_used;
            }
            Acquires = s.acquires; PackReads = s.pack_reads; PackReadBytes = s.pack_read_bytes; PackReadNs = s.pack_read_ns;
            CacheHits = s.cache_hits; CacheMisses = s.cache_misses; CacheEvictions = s.cache_evictions;
            ResidentExperts = s.resident_experts; ResidentBytes = s.resident_bytes; H2DBytes = s.h2d_bytes;
            IoErrors = s.io_errors; FallbackCount = s.fallback_count; CacheSlots = s.cache_slots; SlotBytes = s.slot_bytes;
        }
    }

    public sealed class PackInfo
    {
        public uint FormatVersion, NumLayers, NumExperts, NumRoles, TopK, FirstLayer;
        public ulong Alignment, DataStart, ObjectStride, MaxObjectBytes, FileSize;
        public byte[] SourceFilesSha256, ModelIdentitySha256, ConfigSha256;
    }

    public sealed class PackObject
    {
        public ulong Offset, Bytes;
        public ulong[] RoleOffset = new ulong[3], RoleBytes = new ulong[3];
        public uint[] RoleGgmlType = new uint[3];
    }

    /// <summary>An open, validated Expert Pack (read-only).</summary>
    public sealed class Pack : IDisposable
    {
        readonly PackHandle h;
        public Pack(string path, Validation validation = Validation.Sampled)
        {
            var o = Native.Negotiated<PackOpenOptions>(Native.ep_pack_open_options_init);
            o.validation = (int)validation;
            Native.Check(Native.ep_pack_open(out h, Native.CString(path), ref o), "ep_pack_open");
        }

        static unsafe byte[] Copy(byte* p) { var b = new byte[32]; for (int i = 0; i < 32; i++) b[i] = p[i]; return b; }

        public unsafe PackInfo Info()
        {
            var p = new PackProperties { struct_size = new UIntPtr((uint)sizeof(PackProperties)) };
            Native.Check(Native.ep_pack_info(ref p, h), "ep_pack_info");
            return new PackInfo
            {
                FormatVersion = p.format_version, NumLayers = p.num_layers, NumExperts = p.num_experts, NumRoles = p.num_roles,
                TopK = p.top_k, FirstLayer = p.first_layer, Alignment = p.alignment, DataStart = p.data_start,
                ObjectStride = p.object_stride, MaxObjectBytes = p.max_object_bytes, FileSize = p.file_size,
                SourceFilesSha256 = Copy(p.source_files_sha256), ModelIdentitySha256 = Copy(p.model_identity_sha256),
                ConfigSha256 = Copy(p.config_sha256),
            };
        }

        public unsafe PackObject Object(uint layer, uint expert)
        {
            PackObjectInfo o;
            Native.Check(Native.ep_pack_object(out o, h, layer, expert), "ep_pack_object");
            var r = new PackObject { Offset = o.offset, Bytes = o.bytes };
            for (int i = 0; i < 3; i++) { r.RoleOffset[i] = o.role_offset[i]; r.RoleBytes[i] = o.role_bytes[i]; r.RoleGgmlType[i] = o.role_ggml_type[i]; }
            return r;
        }

        public void Dispose() { h.Dispose(); }
    }

    /// <summary>Options of Model.Open; the defaults are the library's.</summary>
    public sealed class ModelOptions
    {
        public Device Device = Device.Auto;
        public int DeviceIndex;
        /// <summary>Expert cache budget in bytes; 0 = room for every expert.</summary>
        public ulong CacheBudgetBytes;
        public uint StagingSlots, QueueDepth, ReadSplits;
        /// <summary>true: O_DIRECT, false: buffered, null: automatic.</summary>
        public bool? DirectIo;
        /// <summary>Where packs built from sources go; null: $XDG_CACHE_HOME/expertpack.</summary>
        public string PackDir;
        /// <summary>false: never build or rebuild a pack (NotFound / Stale instead); null: the library's
        /// default (build a missing pack, rebuild a stale one).</summary>
        public bool? PackBuild;
        public bool ResidentExperts;
        /// <summary>Called with (doneBytes, totalBytes) while a pack is built.</summary>
        public Action<ulong, ulong> Progress;
        /// <summary>Threads of the CPU backend; 0: EP_CPU_THREADS, else the hardware concurrency.</summary>
        public int CpuThreads;
        /// <summary>Bytes of a host-RAM tier below the expert cache (evicted experts asked for at least
        /// twice come back with one copy instead of a pack read); 0: no tier.</summary>
        public ulong HostCacheBytes;
        /// <summary>false: a layer's reads all complete before its experts are computed; null: the
        /// library's default (overlapped).</summary>
        public bool? OverlapReads;
        /// <summary>true: each MoE layer reads the next layer's predicted experts ahead; null: the
        /// library's default (off).</summary>
        public bool? Prefetch;
        /// <summary>Eviction policy of the cache and the host tier: "decay", "decay-bypass", "lru",
        /// "sglang-lfu"; null: "decay".</summary>
        public string CachePolicy;
        /// <summary>true: the routed experts are read from the source files themselves, through a
        /// small source index in PackDir, instead of an Expert Pack (not with a pack as the path,
        /// nor with ResidentExperts).</summary>
        public bool NoPack;
        /// <summary>Bytes all sessions' decode state may take together; an append, open or fork past it
        /// fails with Status.Budget and changes nothing. 0: automatic (the free GPU memory after the
        /// weights and the expert cache less 1 GiB; on the CPU a quarter of the physical memory).</summary>
        public ulong KvBudgetBytes;
    }

    public sealed class ModelInfo
    {
        public string Architecture;
        public uint VocabSize, NumLayers, HiddenSize, NumExperts, ExpertsPerToken;
        public ulong WeightBytes;
        /// <summary>Where the model runs: Cpu or Cuda (what Auto chose).</summary>
        public Device Device;
        /// <summary>The CUDA device's ordinal; -1 on the CPU.</summary>
        public int DeviceIndex;
    }

    /// <summary>An open model. Sessions keep it alive until they are disposed.</summary>
    public sealed class Model : IDisposable
    {
        internal readonly ModelHandle h;

        public Model(string path, ModelOptions options = null)
        {
            options = options ?? new ModelOptions();
            var o = Native.Negotiated<ModelOptionsRaw>(Native.ep_model_options_init);
            o.device = (int)options.Device;
            o.device_index = options.DeviceIndex;
            o.cache_budget_bytes = options.CacheBudgetBytes;
            o.staging_slots = options.StagingSlots;
            o.queue_depth = options.QueueDepth;
            o.read_splits = options.ReadSplits;
            o.direct_io = options.DirectIo == null ? -1 : (options.DirectIo.Value ? 1 : 0);
            if (options.PackBuild != null) o.pack_build = options.PackBuild.Value ? 1 : 0;
            o.resident_experts = options.ResidentExperts ? 1 : 0;
            bool appended = options.CpuThreads != 0 || options.HostCacheBytes != 0 || options.OverlapReads != null ||
                            options.Prefetch != null || options.CachePolicy != null;
            long librarySize = (long)o.struct_size.ToUInt64();
            if (appended && librarySize < (long)Marshal.OffsetOf(typeof(ModelOptionsRaw), "no_pack"))
                throw new ExpertPackException("ep_model_open", Status.Unsupported,
                    "CpuThreads, HostCacheBytes, OverlapReads, Prefetch and CachePolicy need a newer libexpertpack");
            if (appended)
            {
                o.cpu_threads = options.CpuThreads;
                o.host_cache_bytes = options.HostCacheBytes;
                if (options.OverlapReads != null) o.overlap_reads = options.OverlapReads.Value ? 1 : 0;
                if (options.Prefetch != null) o.prefetch = options.Prefetch.Value ? 1 : 0;
            }
            if (options.NoPack)
            {
                if (librarySize < (long)Marshal.OffsetOf(typeof(ModelOptionsRaw), "no_pack") + sizeof(int))
                    throw new ExpertPackException("ep_model_open", Status.Unsupported, "NoPack needs a newer libexpertpack");
                o.no_pack = 1;
            }
            if (options.KvBudgetBytes != 0)
            {
                if (librarySize < Marshal.SizeOf(typeof(ModelOptionsRaw)))
                    throw new ExpertPackException("ep_model_open", Status.Unsupported, "KvBudgetBytes needs a newer libexpertpack");
                o.kv_budget_bytes = options.KvBudgetBytes;
            }
            IntPtr cachePolicy = options.CachePolicy == null ? IntPtr.Zero : Native.AllocCString(options.CachePolicy);
            IntPtr packDir = options.PackDir == null ? IntPtr.Zero : Native.AllocCString(options.PackDir);
            Exception pending = null;
            ProgressFn progress = null;
            if (options.Progress != null)
            {
                var cb = options.Progress;
                progress = (done, total, payload) =>
                {
                    if (pending != null) return;
                    try { cb(done, total); } catch (Exception e) { pending = e; }
                };
                o.progress = Marshal.GetFunctionPointerForDelegate(progress);
            }
            try
            {
                o.pack_dir = packDir;
                if (appended) o.cache_policy = cachePolicy;
                int st = Native.ep_model_open(out h, Native.CString(path), ref o);
                GC.KeepAlive(progress);
                if (pending != null) { h.Dispose(); ExceptionDispatchInfo.Capture(pending).Throw(); }
                Native.Check(st, "ep_model_open");
            }
            finally
            {
                if (packDir != IntPtr.Zero) Marshal.FreeHGlobal(packDir);
                if (cachePolicy != IntPtr.Zero) Marshal.FreeHGlobal(cachePolicy);
            }
        }

        /// <summary>The Expert Pack serving the routed experts (null with resident experts).</summary>
        public string PackPath { get { return Native.Utf8(Native.ep_model_pack_path(h)); } }

        public unsafe ModelInfo Info()
        {
            var p = new ModelProperties { struct_size = new UIntPtr((uint)sizeof(ModelProperties)) };
            Native.Check(Native.ep_model_info(ref p, h), "ep_model_info");
            return new ModelInfo
            {
                Architecture = Native.Utf8(new IntPtr(p.architecture)), VocabSize = p.vocab_size, NumLayers = p.num_layers,
                HiddenSize = p.hidden_size, NumExperts = p.num_experts, ExpertsPerToken = p.experts_per_token,
                WeightBytes = p.weight_bytes, Device = (Device)p.device, DeviceIndex = p.device_index,
            };
        }

        public StoreStats StoreStats()
        {
            var s = ExpertPack.StoreStats.NewRaw();
            Native.Check(Native.ep_model_store_stats(ref s, h), "ep_model_store_stats");
            return new StoreStats(s);
        }

        /// <summary>Starts an empty sequence on this model.</summary>
        public Session NewSession() { return new Session(this); }

        /// <summary>The model's own tokenizer (text API); it may outlive the model.</summary>
        public Tokenizer Tokenizer()
        {
            TokenizerHandle t;
            Native.Check(Native.ep_tokenizer_open_model(out t, h), "ep_tokenizer_open_model");
            return new Tokenizer(t);
        }

        /// <summary>Closes the model now, or when its last session is disposed.</summary>
        public void Dispose() { h.Dispose(); }
    }

    /// <summary>Options of generation; the defaults are the library's. Null fields keep them.</summary>
    public sealed class GenerateOptions
    {
        public uint MaxNewTokens = 16;
        public float Temperature;
        public int TopK;
        public float TopP = 1;
        public ulong Seed;
        public int? StopToken;
        public float? MinP, RepetitionPenalty;
        public uint? RepetitionWindow;
        public int[] StopTokens;
        /// <summary>Text generation only.</summary>
        public string[] StopStrings;
        public bool IgnoreEos;
        /// <summary>Token id to a bias in -100..100 added to its logit before sampling (OpenAI's
        /// logit_bias: +100 in effect forces a token, -100 forbids it). Needs a 0.4 library.</summary>
        public IDictionary<int, float> LogitBias;
    }

    /// <summary>A sampled token with its log-probability and the most likely alternatives
    /// (Session.SampleLogprobs), most likely first.</summary>
    public sealed class TokenLogprobs
    {
        public int Token;
        public float Logprob;
        public int[] TopTokens;
        public float[] TopLogprobs;
    }

    public sealed class GenerateStats
    {
        public uint PromptTokens, GeneratedTokens;
        public double PrefillSeconds, DecodeSeconds;
        /// <summary>The fields below are null with a library older than them.</summary>
        public StopReason? StopReason;
        public uint? ReusedTokens;
        public double? PrefillTokensPerSecond, DecodeTokensPerSecond;
        public ulong? SessionTokens;
        /// <summary>Routed-expert bytes read from the Expert Pack during the prompt pass / the generation steps.</summary>
        public ulong? PrefillExpertBytes, DecodeExpertBytes;

        internal GenerateStats(GenerateStatsRaw s)
        {
            PromptTokens = s.prompt_tokens; GeneratedTokens = s.generated_tokens;
            PrefillSeconds = s.prefill_seconds; DecodeSeconds = s.decode_seconds;
            long size = (long)s.struct_size.ToUInt64();
            if (size >= (long)Marshal.OffsetOf(typeof(GenerateStatsRaw), "prefill_expert_bytes"))
            {
                StopReason = (StopReason)s.stop_reason; ReusedTokens = s.reused_tokens;
                PrefillTokensPerSecond = s.prefill_tokens_per_second; DecodeTokensPerSecond = s.decode_tokens_per_second;
                SessionTokens = s.session_tokens;
            }
            if (size >= Marshal.SizeOf(typeof(GenerateStatsRaw)))
            {
                PrefillExpertBytes = s.prefill_expert_bytes; DecodeExpertBytes = s.decode_expert_bytes;
            }
        }
    }

    public sealed class Generation
    {
        /// <summary>Every generated token, including the one the callback stopped at.</summary>
        public List<int> Tokens = new List<int>();
        public GenerateStats Stats;
        /// <summary>The callback returned false.</summary>
        public bool Cancelled;
    }

    public sealed class TextGeneration
    {
        public string Text;
        public GenerateStats Stats;
        public bool Cancelled;
    }

    public sealed class Scores
    {
        public int Rows, Width;
        /// <summary>Row-major ids (top-k scoring only).</summary>
        public int[] Ids;
        /// <summary>Row-major logits.</summary>
        public float[] Logits;
    }

    public sealed class ChatMessage
    {
        public string Role, Content, ReasoningContent;
        public ChatMessage(string role, string content, string reasoningContent = null)
        { Role = role; Content = content; ReasoningContent = reasoningContent; }
    }

    public sealed class ChatOptions
    {
        public ChatTemplate Template = ChatTemplate.Auto;
        /// <summary>null: the template's default.</summary>
        public bool? Thinking;
        public bool AddGenerationPrompt = true;

        internal ChatOptionsRaw ToRaw()
        {
            var o = Native.Negotiated<ChatOptionsRaw>(Native.ep_chat_options_init);
            o.chat_template = (int)Template;
            o.thinking = Thinking == null ? -1 : (Thinking.Value ? 1 : 0);
            o.add_generation_prompt = AddGenerationPrompt ? 1 : 0;
            return o;
        }
    }

    /// <summary>C memory a call's options point into; freed by Dispose.</summary>
    internal sealed class NativeScope : IDisposable
    {
        readonly List<IntPtr> blocks = new List<IntPtr>();
        public IntPtr Alloc(int bytes) { var p = Marshal.AllocHGlobal(bytes); blocks.Add(p); return p; }
        public IntPtr Str(string s) { var p = Native.AllocCString(s); blocks.Add(p); return p; }
        public void Dispose() { foreach (var p in blocks) Marshal.FreeHGlobal(p); blocks.Clear(); }

        public GenerateOptionsRaw Options(GenerateOptions g)
        {
            g = g ?? new GenerateOptions();
            var o = Native.Negotiated<GenerateOptionsRaw>(Native.ep_generate_options_init);
            o.max_new_tokens = g.MaxNewTokens; o.temperature = g.Temperature; o.top_k = g.TopK; o.top_p = g.TopP; o.seed = g.Seed;
            if (g.StopToken != null) o.stop_token = g.StopToken.Value;
            bool wantsV2 = g.MinP != null || g.RepetitionPenalty != null || g.RepetitionWindow != null ||
                           (g.StopTokens != null && g.StopTokens.Length > 0) || (g.StopStrings != null && g.StopStrings.Length > 0) || g.IgnoreEos;
            bool hasV2 = Native.Covers<GenerateOptionsRaw>(o.struct_size, "ignore_eos");
            if (wantsV2 && !hasV2)
                throw new ExpertPackException("ep_generate", Status.Unsupported,
                    "MinP, RepetitionPenalty, StopTokens, StopStrings and IgnoreEos need a newer libexpertpack");
            if (g.LogitBias != null && g.LogitBias.Count > 0)
            {
                if (!Native.Covers<GenerateOptionsRaw>(o.struct_size, "n_logit_bias"))
                    throw new ExpertPackException("ep_generate", Status.Unsupported, "LogitBias needs libexpertpack 0.4");
                o.logit_bias = Alloc(8 * g.LogitBias.Count);
                int at = 0;
                foreach (var kv in g.LogitBias)
                {
                    Marshal.WriteInt32(o.logit_bias, at, kv.Key);
                    Marshal.WriteInt32(o.logit_bias, at + 4, BitConverter.ToInt32(BitConverter.GetBytes(kv.Value), 0));
                    at += 8;
                }
                o.n_logit_bias = new UIntPtr((uint)g.LogitBias.Count);
            }
            if (!hasV2) return o;
            if (g.MinP != null) o.min_p = g.MinP.Value;
            if (g.RepetitionPenalty != null) o.repetition_penalty = g.RepetitionPenalty.Value;
            if (g.RepetitionWindow != null) o.repetition_window = g.RepetitionWindow.Value;
            if (g.StopTokens != null && g.StopTokens.Length > 0)
            {
                o.stop_tokens = Alloc(4 * g.StopTokens.Length);
                Marshal.Copy(g.StopTokens, 0, o.stop_tokens, g.StopTokens.Length);
                o.n_stop_tokens = new UIntPtr((uint)g.StopTokens.Length);
            }
            if (g.StopStrings != null && g.StopStrings.Length > 0)
            {
                o.stop_strings = Alloc(IntPtr.Size * g.StopStrings.Length);
                for (int i = 0; i < g.StopStrings.Length; i++) Marshal.WriteIntPtr(o.stop_strings, i * IntPtr.Size, Str(g.StopStrings[i]));
                o.n_stop_strings = new UIntPtr((uint)g.StopStrings.Length);
            }
            o.ignore_eos = g.IgnoreEos ? 1 : 0;
            return o;
        }

        public ChatMessageRaw[] Messages(IList<ChatMessage> msgs)
        {
            var r = new ChatMessageRaw[msgs.Count];
            for (int i = 0; i < msgs.Count; i++)
            {
                r[i].role = Str(msgs[i].Role);
                r[i].content = msgs[i].Content == null ? IntPtr.Zero : Str(msgs[i].Content);
                r[i].reasoning_content = msgs[i].ReasoningContent == null ? IntPtr.Zero : Str(msgs[i].ReasoningContent);
            }
            return r;
        }
    }

    /// <summary>One sequence's decode state. Not for concurrent use.</summary>
    public sealed class Session : IDisposable
    {
        readonly SessionHandle h;
        readonly Model model;

        internal Session(Model model)
        {
            this.model = model;
            IntPtr raw;
            Native.Check(Native.ep_session_open(out raw, model.h), "ep_session_open");
            h = new SessionHandle(raw, model.h);
        }

        Session(Model model, IntPtr raw)
        {
            this.model = model;
            h = new SessionHandle(raw, model.h);
        }

        /// <summary>A copy of this session (ep_session_fork): the same tokens, decode state, last
        /// logits and sampler position. Appending to either leaves the other as it is, so a prompt's
        /// state can be kept and continued later without running the prompt again.</summary>
        public Session Fork()
        {
            IntPtr raw;
            Native.Check(Native.ep_session_fork(out raw, h), "ep_session_fork");
            return new Session(model, raw);
        }

        /// <summary>The token ids the session holds, in order (ep_session_tokens).</summary>
        public int[] Tokens
        {
            get
            {
                UIntPtr count;
                Native.Check(Native.ep_session_tokens(null, UIntPtr.Zero, out count, h), "ep_session_tokens");
                while (true)
                {
                    var cap = count;
                    var ids = new int[Math.Max(1, (int)cap.ToUInt64())];
                    Native.Check(Native.ep_session_tokens(ids, cap, out count, h), "ep_session_tokens");
                    if (count.ToUInt64() <= cap.ToUInt64()) { Array.Resize(ref ids, (int)count.ToUInt64()); return ids; }
                }
            }
        }

        /// <summary>Appends token ids without generating (AppendMany of this one session); Sample
        /// then draws the token after them.</summary>
        public void Append(int[] tokens) { AppendMany(new[] { this }, new[] { tokens }); }

        /// <summary>Draws the next token from the logits after the session's last token, where they
        /// were computed (ep_session_sample); the token is not appended. Of the options, Temperature,
        /// TopK, TopP, MinP, Seed, RepetitionPenalty and RepetitionWindow apply; null: greedy. The
        /// session's draw counter advances, so sample-and-append with a seed repeats what Generate
        /// gives for that seed.</summary>
        public int Sample(GenerateOptions options = null)
        {
            using (var scope = new NativeScope())
            {
                var o = scope.Options(options);
                int token;
                Native.Check(Native.ep_session_sample(out token, h, ref o), "ep_session_sample");
                return token;
            }
        }

        /// <summary>Sample with log-probabilities (ep_session_sample_logprobs, 0.4): the token, its
        /// log-probability and the topLogprobs (0..20) most likely tokens with theirs. They are the
        /// model's own: log-softmax of the raw logits, before the repetition penalty, the logit bias,
        /// the temperature and the top_k / top_p / min_p cuts.</summary>
        public unsafe TokenLogprobs SampleLogprobs(int topLogprobs, GenerateOptions options = null)
        {
            using (var scope = new NativeScope())
            {
                var o = scope.Options(options);
                var raw = new TokenLogprobsRaw();
                raw.struct_size = new UIntPtr((uint)sizeof(TokenLogprobsRaw));
                Native.Check(Native.ep_session_sample_logprobs(ref raw, h, ref o, (uint)topLogprobs), "ep_session_sample_logprobs");
                int n = (int)Math.Min(raw.n_top, 20u);
                var r = new TokenLogprobs { Token = raw.token, Logprob = raw.logprob, TopTokens = new int[n], TopLogprobs = new float[n] };
                for (int i = 0; i < n; i++) { r.TopTokens[i] = raw.top_tokens[i]; r.TopLogprobs[i] = raw.top_logprobs[i]; }
                return r;
            }
        }

        /// <summary>Appends tokens[i] (at least one id each: a prefill chunk or one decode token) to
        /// sessions[i] for every i in one forward pass (ep_sessions_append): the routed experts of
        /// all of them are read once. The sessions must be distinct and of one model; each one's
        /// logits are those of appending its tokens alone. After an error other than
        /// InvalidArgument, every session of the call must be reset.</summary>
        public static void AppendMany(IList<Session> sessions, IList<int[]> tokens)
        {
            if (sessions.Count != tokens.Count)
                throw new ExpertPackException("ep_sessions_append", Status.InvalidArgument,
                    "AppendMany: " + sessions.Count + " sessions but " + tokens.Count + " token lists");
            int n = sessions.Count;
            var raws = new IntPtr[n];
            var ptrs = new IntPtr[n];
            var counts = new UIntPtr[n];
            var added = new bool[n];
            using (var scope = new NativeScope())
            {
                try
                {
                    for (int i = 0; i < n; i++)
                    {
                        sessions[i].h.DangerousAddRef(ref added[i]);
                        raws[i] = sessions[i].h.DangerousGetHandle();
                        var t = tokens[i] ?? new int[0];
                        ptrs[i] = scope.Alloc(4 * Math.Max(1, t.Length));
                        Marshal.Copy(t, 0, ptrs[i], t.Length);
                        counts[i] = new UIntPtr((uint)t.Length);
                    }
                    Native.Check(Native.ep_sessions_append(raws, ptrs, counts, new UIntPtr((uint)n)), "ep_sessions_append");
                }
                finally
                {
                    for (int i = 0; i < n; i++) if (added[i]) sessions[i].h.DangerousRelease();
                }
            }
        }

        /// <summary>The next token of every session (distinct, of one model, each holding a token) in
        /// one call (ep_sessions_sample, 0.6: one sampling launch and one download for all of them).
        /// options: null (greedy defaults) or one entry per session (null: the defaults). topLogprobs:
        /// null (no log-probabilities) or one entry per session: null, or the alternatives wanted
        /// (0..20) with the token's log-probability. Each result is what Sample (or SampleLogprobs)
        /// gives for the session alone, and each draw counter advances the same way; a refused call
        /// (InvalidArgument naming the session's index) changes no session. Where no
        /// log-probabilities were asked for, Logprob is 0 and the alternatives empty.</summary>
        public static unsafe TokenLogprobs[] SampleMany(IList<Session> sessions, IList<GenerateOptions> options = null,
                                                        IList<int?> topLogprobs = null)
        {
            int n = sessions.Count;
            if ((options != null && options.Count != n) || (topLogprobs != null && topLogprobs.Count != n))
                throw new ExpertPackException("ep_sessions_sample", Status.InvalidArgument,
                    "SampleMany: " + n + " sessions, " + (options == null ? 0 : options.Count) + " option sets and " +
                    (topLogprobs == null ? 0 : topLogprobs.Count) + " log-probability counts");
            var raws = new IntPtr[n];
            var optPtrs = new IntPtr[n];
            var lpPtrs = new IntPtr[n];
            var tops = new uint[n];
            var tokens = new int[n];
            var added = new bool[n];
            using (var scope = new NativeScope())
            {
                try
                {
                    for (int i = 0; i < n; i++)
                    {
                        sessions[i].h.DangerousAddRef(ref added[i]);
                        raws[i] = sessions[i].h.DangerousGetHandle();
                        var o = scope.Options(options == null ? null : options[i]);
                        optPtrs[i] = scope.Alloc(Marshal.SizeOf(typeof(GenerateOptionsRaw)));
                        Marshal.StructureToPtr(o, optPtrs[i], false);
                        if (topLogprobs != null && topLogprobs[i].HasValue)
                        {
                            if (topLogprobs[i].Value < 0)
                                throw new ExpertPackException("ep_sessions_sample", Status.InvalidArgument,
                                    "SampleMany: topLogprobs[" + i + "] is " + topLogprobs[i].Value);
                            lpPtrs[i] = scope.Alloc(sizeof(TokenLogprobsRaw));
                            var raw = new TokenLogprobsRaw();
                            raw.struct_size = new UIntPtr((uint)sizeof(TokenLogprobsRaw));
                            *(TokenLogprobsRaw*)lpPtrs[i] = raw;
                            tops[i] = (uint)topLogprobs[i].Value;
                        }
                    }
                    Native.Check(Native.ep_sessions_sample(tokens, topLogprobs == null ? null : lpPtrs, raws, optPtrs,
                                                           topLogprobs == null ? null : tops, new UIntPtr((uint)n)), "ep_sessions_sample");
                    var result = new TokenLogprobs[n];
                    for (int i = 0; i < n; i++)
                    {
                        if (lpPtrs[i] == IntPtr.Zero)
                        {
                            result[i] = new TokenLogprobs { Token = tokens[i], TopTokens = new int[0], TopLogprobs = new float[0] };
                            continue;
                        }
                        var raw = *(TokenLogprobsRaw*)lpPtrs[i];
                        int k = (int)Math.Min(raw.n_top, 20u);
                        var r = new TokenLogprobs { Token = tokens[i], Logprob = raw.logprob, TopTokens = new int[k], TopLogprobs = new float[k] };
                        for (int j = 0; j < k; j++) { r.TopTokens[j] = raw.top_tokens[j]; r.TopLogprobs[j] = raw.top_logprobs[j]; }
                        result[i] = r;
                    }
                    return result;
                }
                finally
                {
                    for (int i = 0; i < n; i++) if (added[i]) sessions[i].h.DangerousRelease();
                }
            }
        }

        /// <summary>One decode step of a continuous batch: samples each session's next token with the
        /// options (Sample), appends all of them in one AppendMany call, and returns them in the
        /// order of the sessions.</summary>
        public static int[] StepBatch(IList<Session> sessions, GenerateOptions options = null)
        {
            var next = new int[sessions.Count];
            var lists = new int[sessions.Count][];
            for (int i = 0; i < sessions.Count; i++) { next[i] = sessions[i].Sample(options); lists[i] = new[] { next[i] }; }
            AppendMany(sessions, lists);
            return next;
        }

        public void Reset() { Native.Check(Native.ep_session_reset(h), "ep_session_reset"); }

        public ulong Length
        {
            get { ulong n; Native.Check(Native.ep_session_length(out n, h), "ep_session_length"); return n; }
        }

        internal static GenerateStatsRaw NewStats() { return Native.Negotiated<GenerateStatsRaw>(Native.ep_generate_stats_init); }

        /// <summary>Appends prompt and generates tokens; onToken(token, index) is called with each
        /// and returns false to stop (then Cancelled is true). An exception in it stops the
        /// generation and is rethrown here.</summary>
        public Generation Generate(int[] prompt, GenerateOptions options = null, Func<int, uint, bool> onToken = null)
        {
            var result = new Generation();
            Exception pending = null;
            TokenFn cb = (token, index, payload) =>
            {
                result.Tokens.Add(token);
                if (onToken == null) return 0;
                try { return onToken(token, index) ? 0 : 1; }
                catch (Exception e) { pending = e; return 1; }
            };
            using (var scope = new NativeScope())
            {
                var o = scope.Options(options);
                var stats = NewStats();
                prompt = prompt ?? new int[0];
                int st = Native.ep_generate(ref stats, h, prompt.Length == 0 ? null : prompt, new UIntPtr((uint)prompt.Length), ref o, cb, IntPtr.Zero);
                GC.KeepAlive(cb);
                if (pending != null) ExceptionDispatchInfo.Capture(pending).Throw();
                result.Cancelled = st == (int)Status.Cancelled;
                if (!result.Cancelled) Native.Check(st, "ep_generate");
                result.Stats = new GenerateStats(stats);
            }
            return result;
        }

        /// <summary>Teacher-forced scoring: row i holds the logits predicting the token after
        /// position i; topK 0 gives full logits (VocabSize per row).</summary>
        public Scores Score(int[] tokens, uint topK = 0)
        {
            int width = topK == 0 ? (int)model.Info().VocabSize : (int)topK;
            var r = new Scores { Rows = tokens.Length, Width = width, Logits = new float[tokens.Length * width] };
            if (topK > 0) r.Ids = new int[tokens.Length * width];
            Native.Check(Native.ep_score(h, tokens, new UIntPtr((uint)tokens.Length), topK, r.Ids, r.Logits), "ep_score");
            return r;
        }

        TextGeneration TextCall(string function, Func<string, bool> onText, Func<TextFn, GenerateStatsRaw[], int> call)
        {
            var sb = new StringBuilder();
            Exception pending = null;
            TextFn cb = (piece, length, payload) =>
            {
                var bytes = new byte[(int)length.ToUInt64()];
                Marshal.Copy(piece, bytes, 0, bytes.Length);
                var s = Encoding.UTF8.GetString(bytes);
                sb.Append(s);
                if (onText == null) return 0;
                try { return onText(s) ? 0 : 1; }
                catch (Exception e) { pending = e; return 1; }
            };
            var stats = new[] { NewStats() };
            int st = call(cb, stats);
            GC.KeepAlive(cb);
            if (pending != null) ExceptionDispatchInfo.Capture(pending).Throw();
            var r = new TextGeneration { Text = sb.ToString(), Stats = new GenerateStats(stats[0]), Cancelled = st == (int)Status.Cancelled };
            if (!r.Cancelled) Native.Check(st, function);
            return r;
        }

        /// <summary>Appends a text prompt and generates text; onText gets complete UTF-8 pieces
        /// and returns false to stop.</summary>
        public TextGeneration GenerateText(Tokenizer tokenizer, string prompt, GenerateOptions options = null, Func<string, bool> onText = null)
        {
            using (var scope = new NativeScope())
            {
                var o = scope.Options(options);
                var p = Native.CString(prompt);
                return TextCall("ep_generate_text", onText, (cb, stats) =>
                    Native.ep_generate_text(ref stats[0], h, tokenizer.h, p, ref o, cb, IntPtr.Zero));
            }
        }

        /// <summary>Renders the conversation and generates the assistant's answer; keep the session
        /// for the next turn (the common prefix is reused).</summary>
        public TextGeneration GenerateChat(Tokenizer tokenizer, IList<ChatMessage> messages, ChatOptions chat = null,
                                           GenerateOptions options = null, Func<string, bool> onText = null)
        {
            using (var scope = new NativeScope())
            {
                var o = scope.Options(options);
                var m = scope.Messages(messages);
                var c = (chat ?? new ChatOptions()).ToRaw();
                return TextCall("ep_generate_chat", onText, (cb, stats) =>
                    Native.ep_generate_chat(ref stats[0], h, tokenizer.h, m, new UIntPtr((uint)m.Length), ref c, ref o, cb, IntPtr.Zero));
            }
        }

        public void Dispose() { h.Dispose(); }
    }

    /// <summary>Incremental text of generated tokens for hosts that sample themselves
    /// (ep_text_stream_*): Push each token and get the text it completes, as GenerateText would
    /// stream it (complete UTF-8 only, special tokens left out, text that may begin a stop string
    /// held back until it is known not to). Keeps its tokenizer alive; one stream per generation,
    /// not for concurrent use.</summary>
    public sealed class TextStream : IDisposable
    {
        readonly TextStreamHandle h;
        readonly StringBuilder text = new StringBuilder();

        /// <summary>Opens a stream over the tokenizer; the text ends where one of the stop strings
        /// (non-empty) appears.</summary>
        public TextStream(Tokenizer tokenizer, params string[] stopStrings)
        {
            stopStrings = stopStrings ?? new string[0];
            using (var scope = new NativeScope())
            {
                var ptrs = new IntPtr[stopStrings.Length];
                for (int i = 0; i < ptrs.Length; i++) ptrs[i] = scope.Str(stopStrings[i]);
                IntPtr raw;
                Native.Check(Native.ep_text_stream_open(out raw, tokenizer.h, ptrs.Length == 0 ? null : ptrs,
                                                        new UIntPtr((uint)ptrs.Length)), "ep_text_stream_open");
                h = new TextStreamHandle(raw, tokenizer.h);
            }
        }

        /// <summary>Whether a stop string appeared: the text before it was delivered, later tokens add nothing.</summary>
        public bool Stopped { get; private set; }

        /// <summary>Everything delivered so far.</summary>
        public string Text { get { return text.ToString(); } }

        string Step(string function, Func<TextFn, int[], int> call)
        {
            var bytes = new List<byte>();
            TextFn cb = (piece, length, payload) =>
            {
                var chunk = new byte[(int)length.ToUInt64()];
                Marshal.Copy(piece, chunk, 0, chunk.Length);
                bytes.AddRange(chunk);
                return 0;
            };
            var stopped = new int[1];
            int st = call(cb, stopped);
            GC.KeepAlive(cb);
            Native.Check(st, function);
            Stopped = stopped[0] != 0;
            var s = Encoding.UTF8.GetString(bytes.ToArray());
            text.Append(s);
            return s;
        }

        /// <summary>Adds one generated token; returns the text it completes (often "", at times
        /// several tokens' worth).</summary>
        public string Push(int token)
        {
            return Step("ep_text_stream_push", (cb, stopped) => Native.ep_text_stream_push(h, token, cb, IntPtr.Zero, out stopped[0]));
        }

        /// <summary>Ends the text: returns what was held back (an incomplete UTF-8 sequence is dropped).</summary>
        public string Finish()
        {
            return Step("ep_text_stream_finish", (cb, stopped) => Native.ep_text_stream_finish(h, cb, IntPtr.Zero, out stopped[0]));
        }

        /// <summary>Frees the stream (and its reference on the tokenizer).</summary>
        public void Dispose() { h.Dispose(); }
    }

    public sealed class TokenizerInfo
    {
        public uint VocabSize;
        public int BosId, EosId, EndOfTurnId;
        public ChatTemplate ChatTemplate;
    }

    /// <summary>A tokenizer (text API); immutable, usable from any thread.</summary>
    public sealed class Tokenizer : IDisposable
    {
        internal readonly TokenizerHandle h;
        internal Tokenizer(TokenizerHandle h) { this.h = h; }

        /// <summary>Opens a .gguf, a tokenizer.json (or its folder), or a tiktoken file.</summary>
        public Tokenizer(string path)
        {
            Native.Check(Native.ep_tokenizer_open(out h, Native.CString(path)), "ep_tokenizer_open");
        }

        public TokenizerInfo Info()
        {
            var p = Native.Negotiated<TokenizerProperties>(Native.ep_tokenizer_properties_init);
            Native.Check(Native.ep_tokenizer_info(ref p, h), "ep_tokenizer_info");
            return new TokenizerInfo { VocabSize = p.vocab_size, BosId = p.bos_id, EosId = p.eos_id, EndOfTurnId = p.end_of_turn_id,
                                       ChatTemplate = (ChatTemplate)p.chat_template };
        }

        public int TokenId(string token)
        {
            int id;
            Native.Check(Native.ep_tokenizer_token_id(out id, h, Native.CString(token)), "ep_tokenizer_token_id");
            return id;
        }

        public int[] Encode(string text, bool addSpecial = false, bool specialAsText = false)
        {
            var b = Encoding.UTF8.GetBytes(text);
            uint flags = (addSpecial ? 1u : 0u) | (specialAsText ? 2u : 0u);
            UIntPtr count;
            Native.Check(Native.ep_tokenize(null, UIntPtr.Zero, out count, h, b, new UIntPtr((uint)b.Length), flags), "ep_tokenize");
            while (true)
            {
                var cap = count;
                var ids = new int[Math.Max(1, (int)cap.ToUInt64())];
                Native.Check(Native.ep_tokenize(ids, cap, out count, h, b, new UIntPtr((uint)b.Length), flags), "ep_tokenize");
                if (count.ToUInt64() <= cap.ToUInt64()) { Array.Resize(ref ids, (int)count.ToUInt64()); return ids; }
            }
        }

        static string Fill(string function, Func<byte[], UIntPtr, UIntPtr[], int> call)
        {
            var len = new UIntPtr[1];
            Native.Check(call(null, UIntPtr.Zero, len), function);
            while (true)
            {
                int cap = (int)len[0].ToUInt64() + 1;
                var buf = new byte[cap];
                Native.Check(call(buf, new UIntPtr((uint)cap), len), function);
                if ((int)len[0].ToUInt64() < cap) return Encoding.UTF8.GetString(buf, 0, (int)len[0].ToUInt64());
            }
        }

        public string Decode(int[] ids, bool skipSpecial = false)
        {
            return Fill("ep_detokenize", (buf, cap, len) =>
                Native.ep_detokenize(buf, cap, out len[0], h, ids, new UIntPtr((uint)ids.Length), skipSpecial ? 1u : 0u));
        }

        public string RenderChat(IList<ChatMessage> messages, ChatOptions options = null)
        {
            using (var scope = new NativeScope())
            {
                var m = scope.Messages(messages);
                var o = (options ?? new ChatOptions()).ToRaw();
                return Fill("ep_chat_render", (buf, cap, len) =>
                    Native.ep_chat_render(buf, cap, out len[0], h, m, new UIntPtr((uint)m.Length), ref o));
            }
        }

        public void Dispose() { h.Dispose(); }
    }
}
