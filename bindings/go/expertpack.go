// Package expertpack is the Go binding of libexpertpack (cgo over include/expertpack/expertpack.h).
//
// Build: the C headers come from this repository (../../include); the library is linked with
// -lexpertpack, so point the linker and loader at it, e.g.
//
//	CGO_LDFLAGS="-L$BUILD" LD_LIBRARY_PATH="$BUILD" go test ./...
//
// (or install it: then pkg-config's path works too). Build with -tags expertpack_notext against
// a library built before the text API, and with -tags expertpack_nobatch against one built before
// 0.2 (AppendMany, Session.Sample, Session.Fork, Session.Tokens, TextStream).
//
// Errors are *Error values carrying the C status and the library's message; errors.Is(err,
// expertpack.ErrNotFound) works. Handles are freed by Close (deterministic); a finalizer frees
// what was not closed.
package expertpack

/*
#cgo CFLAGS: -I${SRCDIR}/../../include -std=c99
#cgo LDFLAGS: -lexpertpack
#include <stdlib.h>
#include <string.h>
#include "expertpack/expertpack.h"
#include "helpers.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"sort"
	"sync"
	"unsafe"
)

// Status is a C ep_status. The non-OK values are errors themselves, for errors.Is.
type Status int32

const (
	StatusOK           Status = 0
	ErrInvalidArgument Status = -1
	ErrOutOfMemory     Status = -2
	ErrIO              Status = -3
	ErrNotFound        Status = -4
	ErrFormat          Status = -5
	ErrCorrupt         Status = -6
	ErrUnsupported     Status = -7
	ErrVersion         Status = -8
	ErrStructSize      Status = -9
	ErrShape           Status = -10
	ErrCUDA            Status = -11
	ErrNoDevice        Status = -12
	ErrBudget          Status = -13
	ErrCancelled       Status = -14
	ErrBusy            Status = -15
	ErrStale           Status = -16
	ErrInternal        Status = -17
)

// String is the C name of the status ("EP_ERR_NOT_FOUND"), from ep_status_str().
func (s Status) String() string { return C.GoString(C.ep_status_str(C.ep_status(s))) }

// Error makes a Status usable as an error (and as the target of errors.Is).
func (s Status) Error() string { return s.String() }

// Error is a failed call: which function, the status and ep_last_error()'s message.
type Error struct {
	Op      string
	Status  Status
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%s: %s", e.Op, e.Status)
	}
	return fmt.Sprintf("%s: %s: %s", e.Op, e.Status, e.Message)
}

// Unwrap gives the Status, so errors.Is(err, ErrNotFound) works.
func (e *Error) Unwrap() error { return e.Status }

// StatusOf returns the Status of an error from this package (StatusOK for nil, ErrInternal for
// other errors).
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	var s Status
	if errors.As(err, &s) {
		return s
	}
	return ErrInternal
}

// call runs f on a locked OS thread and turns its status into an error with the thread's
// ep_last_error() (a goroutine could otherwise move to another thread between the two calls).
func call(op string, f func() C.ep_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	if st == C.EP_OK {
		return nil
	}
	return &Error{Op: op, Status: Status(st), Message: C.GoString(C.ep_last_error())}
}

// LastError is ep_last_error() of the calling OS thread (prefer the Message of an *Error).
func LastError() string {
	return C.GoString(C.ep_last_error())
}

// Version is the loaded library's version (e.g. "0.6.0").
func Version() string { return C.GoString(C.ep_version_string()) }

// VersionNumber is major*10000 + minor*100 + patch of the loaded library.
func VersionNumber() uint32 { return uint32(C.ep_version_number()) }

// Feature bits of BuildFeatures.
const (
	FeatureCUDA    = uint32(C.EP_FEATURE_CUDA)
	FeatureIOUring = uint32(C.EP_FEATURE_IO_URING)
)

// BuildFeatures is ep_build_features(): FeatureCUDA | FeatureIOUring as compiled in.
func BuildFeatures() uint32 { return uint32(C.ep_build_features()) }

// CUDADeviceCount counts usable CUDA devices (0 without CUDA or a driver).
func CUDADeviceCount() (int, error) {
	var n C.int32_t
	err := call("ep_cuda_device_count", func() C.ep_status { return C.ep_cuda_device_count(&n) })
	return int(n), err
}

// LogLevel is the severity of a log message.
type LogLevel int32

const (
	LogTrace LogLevel = 0
	LogDebug LogLevel = 1
	LogInfo  LogLevel = 2
	LogWarn  LogLevel = 3
	LogError LogLevel = 4
	LogOff   LogLevel = 5
)

// SetLogLevel sets the process-wide minimum level.
func SetLogLevel(level LogLevel) error {
	return call("ep_set_log_level", func() C.ep_status { return C.ep_set_log_level(C.ep_log_level(level)) })
}

var (
	logMu   sync.RWMutex
	logSink func(LogLevel, string)
)

//export epGoLog
func epGoLog(level C.int32_t, message *C.char) {
	logMu.RLock()
	sink := logSink
	logMu.RUnlock()
	if sink != nil {
		sink(LogLevel(level), C.GoString(message))
	}
}

// SetLogCallback routes the library's log (process-wide) to sink; nil restores stderr. The sink
// may be called from library threads concurrently. With a level, the minimum level changes too.
func SetLogCallback(sink func(level LogLevel, message string), level ...LogLevel) error {
	logMu.Lock()
	logSink = sink
	logMu.Unlock()
	install := C.int(0)
	if sink != nil {
		install = 1
	}
	if len(level) == 0 {
		C.ep_go_set_log_callback(install)
		return nil
	}
	return call("ep_log_configure", func() C.ep_status { return C.ep_go_log_configure(install, C.ep_log_level(level[0])) })
}

// StoreStats are the counters of an expert store (ep_store_stats).
type StoreStats struct {
	Acquires, PackReads, PackReadBytes, PackReadNs     uint64
	CacheHits, CacheMisses, CacheEvictions             uint64
	ResidentExperts, ResidentBytes, H2DBytes, IOErrors uint64
	FallbackCount, CacheSlots, SlotBytes               uint64
	// HostHits are cache misses served from the host-RAM tier (one copy, no pack read);
	// HostMisses those not in the tier (read from the pack; 0 without a tier).
	HostHits, HostMisses uint64
	// Demotions are experts evicted from the cache and kept in the host tier.
	Demotions uint64
	// HostResidentBytes are the payload bytes the host tier holds now, in HostSlots slots (0: no tier).
	HostResidentBytes, HostSlots uint64
	// PrefetchIssued are experts loaded ahead of their layer (ModelOptions.Prefetch);
	// PrefetchUsed those their layer then asked for.
	PrefetchIssued, PrefetchUsed uint64
}

func storeStatsFromC(s *C.ep_store_stats) StoreStats {
	return StoreStats{
		Acquires: uint64(s.acquires), PackReads: uint64(s.pack_reads), PackReadBytes: uint64(s.pack_read_bytes),
		PackReadNs: uint64(s.pack_read_ns), CacheHits: uint64(s.cache_hits), CacheMisses: uint64(s.cache_misses),
		CacheEvictions: uint64(s.cache_evictions), ResidentExperts: uint64(s.resident_experts),
		ResidentBytes: uint64(s.resident_bytes), H2DBytes: uint64(s.h2d_bytes), IOErrors: uint64(s.io_errors),
		FallbackCount: uint64(s.fallback_count), CacheSlots: uint64(s.cache_slots), SlotBytes: uint64(s.slot_bytes),
		HostHits: uint64(s.host_hits), HostMisses: uint64(s.host_misses), Demotions: uint64(s.demotions),
		HostResidentBytes: uint64(s.host_resident_bytes), HostSlots: uint64(s.host_slots),
		PrefetchIssued: uint64(s.prefetch_issued), PrefetchUsed: uint64(s.prefetch_used),
	}
}

// ReadStoreStats reads a statistics JSON file written by an expert store.
func ReadStoreStats(path string) (StoreStats, error) {
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	var s C.ep_store_stats
	C.ep_store_stats_init(&s)
	err := call("ep_store_stats_read_file", func() C.ep_status { return C.ep_store_stats_read_file(&s, p) })
	return storeStatsFromC(&s), err
}

// ---------------------------------------------------------------------------------------------
// Pack
// ---------------------------------------------------------------------------------------------

// Validation is how much OpenPack checks.
type Validation int32

const (
	ValidateStructure Validation = 0
	ValidateSampled   Validation = 1
	ValidateFull      Validation = 2
)

// PackInfo is the geometry and identity of a pack.
type PackInfo struct {
	FormatVersion, NumLayers, NumExperts, NumRoles, TopK, FirstLayer uint32
	Alignment, DataStart, ObjectStride, MaxObjectBytes, FileSize     uint64
	SourceFilesSHA256, ModelIdentitySHA256, ConfigSHA256             [32]byte
}

// PackObject is where one expert's object lies in the pack.
type PackObject struct {
	Offset, Bytes uint64
	RoleOffset    [3]uint64
	RoleBytes     [3]uint64
	RoleGGMLType  [3]uint32
}

// Pack is an open, validated Expert Pack (immutable: safe for concurrent use).
type Pack struct {
	mu  sync.RWMutex
	ptr *C.ep_pack
}

// OpenPack opens and validates a pack file.
func OpenPack(path string, validation Validation) (*Pack, error) {
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	var o C.ep_pack_open_options
	C.ep_pack_open_options_init(&o)
	o.validation = C.ep_pack_validation(validation)
	var raw *C.ep_pack
	if err := call("ep_pack_open", func() C.ep_status { return C.ep_pack_open(&raw, p, &o) }); err != nil {
		return nil, err
	}
	pk := &Pack{ptr: raw}
	runtime.SetFinalizer(pk, (*Pack).Close)
	return pk, nil
}

var errClosed = &Error{Op: "expertpack", Status: ErrInvalidArgument, Message: "use of a closed handle"}

// Close frees the pack. It is safe to call more than once.
func (pk *Pack) Close() error {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.ptr != nil {
		C.ep_pack_close(pk.ptr)
		pk.ptr = nil
		runtime.SetFinalizer(pk, nil)
	}
	return nil
}

// Info describes the pack.
func (pk *Pack) Info() (PackInfo, error) {
	pk.mu.RLock()
	defer pk.mu.RUnlock()
	if pk.ptr == nil {
		return PackInfo{}, errClosed
	}
	var p C.ep_pack_properties
	C.ep_pack_properties_init(&p)
	if err := call("ep_pack_info", func() C.ep_status { return C.ep_pack_info(&p, pk.ptr) }); err != nil {
		return PackInfo{}, err
	}
	info := PackInfo{
		FormatVersion: uint32(p.format_version), NumLayers: uint32(p.num_layers), NumExperts: uint32(p.num_experts),
		NumRoles: uint32(p.num_roles), TopK: uint32(p.top_k), FirstLayer: uint32(p.first_layer),
		Alignment: uint64(p.alignment), DataStart: uint64(p.data_start), ObjectStride: uint64(p.object_stride),
		MaxObjectBytes: uint64(p.max_object_bytes), FileSize: uint64(p.file_size),
	}
	for i := 0; i < 32; i++ {
		info.SourceFilesSHA256[i] = byte(p.source_files_sha256[i])
		info.ModelIdentitySHA256[i] = byte(p.model_identity_sha256[i])
		info.ConfigSHA256[i] = byte(p.config_sha256[i])
	}
	return info, nil
}

// Object locates the object of one (layer, expert).
func (pk *Pack) Object(layer, expert uint32) (PackObject, error) {
	pk.mu.RLock()
	defer pk.mu.RUnlock()
	if pk.ptr == nil {
		return PackObject{}, errClosed
	}
	var o C.ep_pack_object_info
	err := call("ep_pack_object", func() C.ep_status {
		return C.ep_pack_object(&o, pk.ptr, C.uint32_t(layer), C.uint32_t(expert))
	})
	if err != nil {
		return PackObject{}, err
	}
	r := PackObject{Offset: uint64(o.offset), Bytes: uint64(o.bytes)}
	for i := 0; i < 3; i++ {
		r.RoleOffset[i] = uint64(o.role_offset[i])
		r.RoleBytes[i] = uint64(o.role_bytes[i])
		r.RoleGGMLType[i] = uint32(o.role_ggml_type[i])
	}
	return r, nil
}

// ---------------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------------

// Device is where a model computes.
type Device int32

const (
	DeviceAuto Device = 0
	DeviceCPU  Device = 1
	DeviceCUDA Device = 2
)

// ModelOptions are the options of OpenModel; start from DefaultModelOptions().
type ModelOptions struct {
	Device           Device
	DeviceIndex      int32
	CacheBudgetBytes uint64 // 0: room for every expert (at most half the memory)
	StagingSlots     uint32 // 0: automatic
	QueueDepth       uint32 // 0: automatic
	ReadSplits       uint32 // 0: automatic
	DirectIO         int32  // 1: O_DIRECT, 0: buffered, -1: automatic
	PackDir          string // "": $XDG_CACHE_HOME/expertpack
	PackBuild        bool   // build a missing pack, rebuild a stale one
	ResidentExperts  bool   // no pack: every routed expert in memory
	CPUThreads       int32  // threads of the CPU backend; 0: EP_CPU_THREADS, else the hardware concurrency
	// HostCacheBytes is a host-RAM tier below the expert cache (0: none): evicted experts asked
	// for at least twice come back with one copy instead of a pack read.
	HostCacheBytes uint64
	// OverlapReads computes a layer's cached experts while its misses are still read.
	OverlapReads bool
	// Prefetch lets each MoE layer read the next layer's predicted experts ahead.
	Prefetch bool
	// CachePolicy is the eviction policy: "decay", "decay-bypass", "lru", "sglang-lfu" ("": decay).
	CachePolicy string
	// NoPack reads the routed experts from the source files themselves, through a small source
	// index in PackDir, instead of an Expert Pack (not with a pack as the path, nor with
	// ResidentExperts).
	NoPack bool
	// KVBudgetBytes is what all sessions' decode state may take together (0: automatic: the free
	// GPU memory after the weights and the expert cache less 1 GiB, on the CPU a quarter of RAM).
	KVBudgetBytes uint64
	// Progress, if set, is called while a pack (or a source index) is built.
	Progress func(doneBytes, totalBytes uint64)
}

// DefaultModelOptions are the library's defaults (ep_model_options_init).
func DefaultModelOptions() ModelOptions {
	var o C.ep_model_options
	C.ep_model_options_init(&o)
	return ModelOptions{
		Device: Device(o.device), DeviceIndex: int32(o.device_index), CacheBudgetBytes: uint64(o.cache_budget_bytes),
		StagingSlots: uint32(o.staging_slots), QueueDepth: uint32(o.queue_depth), ReadSplits: uint32(o.read_splits),
		DirectIO: int32(o.direct_io), PackBuild: o.pack_build != 0, ResidentExperts: o.resident_experts != 0,
		CPUThreads: int32(o.cpu_threads), HostCacheBytes: uint64(o.host_cache_bytes), OverlapReads: o.overlap_reads != 0,
		Prefetch: o.prefetch != 0, NoPack: o.no_pack != 0, KVBudgetBytes: uint64(o.kv_budget_bytes),
	}
}

// ModelInfo describes an open model.
type ModelInfo struct {
	Architecture                                                  string
	VocabSize, NumLayers, HiddenSize, NumExperts, ExpertsPerToken uint32
	WeightBytes                                                   uint64
	Device                                                        Device // DeviceCPU or DeviceCUDA: what DeviceAuto chose
	DeviceIndex                                                   int32  // the CUDA device's ordinal; -1 on the CPU
}

// Model is an open model. Close it after its sessions. Methods may be called from any
// goroutine; the library serialises what needs it.
type Model struct {
	mu       sync.Mutex
	ptr      *C.ep_model
	sessions int
}

type progressState struct {
	f     func(uint64, uint64)
	panic interface{}
}

//export epGoProgress
func epGoProgress(done, total C.uint64_t, handle C.uintptr_t) {
	st := cgo.Handle(handle).Value().(*progressState)
	if st.panic != nil {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			st.panic = r
		}
	}()
	st.f(uint64(done), uint64(total))
}

func b2i(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// OpenModel opens a model: a .gguf, a safetensors checkpoint folder, or an Expert Pack (.epk).
// opts nil means DefaultModelOptions().
func OpenModel(path string, opts *ModelOptions) (*Model, error) {
	if opts == nil {
		d := DefaultModelOptions()
		opts = &d
	}
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	var o C.ep_model_options
	C.ep_model_options_init(&o)
	o.device = C.ep_device_kind(opts.Device)
	o.device_index = C.int32_t(opts.DeviceIndex)
	o.cache_budget_bytes = C.uint64_t(opts.CacheBudgetBytes)
	o.staging_slots = C.uint32_t(opts.StagingSlots)
	o.queue_depth = C.uint32_t(opts.QueueDepth)
	o.read_splits = C.uint32_t(opts.ReadSplits)
	o.direct_io = C.int32_t(opts.DirectIO)
	if opts.PackDir != "" {
		o.pack_dir = C.CString(opts.PackDir)
		defer C.free(unsafe.Pointer(o.pack_dir))
	}
	o.pack_build = b2i(opts.PackBuild)
	o.resident_experts = b2i(opts.ResidentExperts)
	o.cpu_threads = C.int32_t(opts.CPUThreads)
	o.host_cache_bytes = C.uint64_t(opts.HostCacheBytes)
	o.overlap_reads = b2i(opts.OverlapReads)
	o.prefetch = b2i(opts.Prefetch)
	o.no_pack = b2i(opts.NoPack)
	o.kv_budget_bytes = C.uint64_t(opts.KVBudgetBytes)
	if opts.CachePolicy != "" {
		o.cache_policy = C.CString(opts.CachePolicy)
		defer C.free(unsafe.Pointer(o.cache_policy))
	}
	var handle C.uintptr_t
	var st *progressState
	if opts.Progress != nil {
		st = &progressState{f: opts.Progress}
		h := cgo.NewHandle(st)
		defer h.Delete()
		handle = C.uintptr_t(h)
	}
	var raw *C.ep_model
	err := call("ep_model_open", func() C.ep_status { return C.ep_go_model_open(&raw, p, &o, handle) })
	if st != nil && st.panic != nil {
		if raw != nil {
			C.ep_model_close(raw)
		}
		panic(st.panic)
	}
	if err != nil {
		return nil, err
	}
	m := &Model{ptr: raw}
	runtime.SetFinalizer(m, (*Model).finalize)
	return m, nil
}

func (m *Model) finalize() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr != nil { // sessions hold the model: a finalized model has no live session
		C.ep_model_close(m.ptr)
		m.ptr = nil
	}
}

// Close frees the model. It fails with ErrBusy while sessions on it are open. It is safe to
// call more than once.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == nil {
		return nil
	}
	if m.sessions > 0 {
		return &Error{Op: "Model.Close", Status: ErrBusy,
			Message: fmt.Sprintf("%d session(s) still open on the model: close them first", m.sessions)}
	}
	C.ep_model_close(m.ptr)
	m.ptr = nil
	runtime.SetFinalizer(m, nil)
	return nil
}

func (m *Model) raw() (*C.ep_model, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == nil {
		return nil, errClosed
	}
	return m.ptr, nil
}

// PackPath is the Expert Pack serving the routed experts ("" with resident experts).
func (m *Model) PackPath() string {
	r, err := m.raw()
	if err != nil {
		return ""
	}
	p := C.ep_model_pack_path(r)
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// Info describes the model.
func (m *Model) Info() (ModelInfo, error) {
	r, err := m.raw()
	if err != nil {
		return ModelInfo{}, err
	}
	var p C.ep_model_properties
	C.ep_model_properties_init(&p)
	if err := call("ep_model_info", func() C.ep_status { return C.ep_model_info(&p, r) }); err != nil {
		return ModelInfo{}, err
	}
	return ModelInfo{
		Architecture: C.GoString(&p.architecture[0]), VocabSize: uint32(p.vocab_size), NumLayers: uint32(p.num_layers),
		HiddenSize: uint32(p.hidden_size), NumExperts: uint32(p.num_experts),
		ExpertsPerToken: uint32(p.experts_per_token), WeightBytes: uint64(p.weight_bytes),
		Device: Device(p.device), DeviceIndex: int32(p.device_index),
	}, nil
}

// StoreStats are the counters of the model's expert store.
func (m *Model) StoreStats() (StoreStats, error) {
	r, err := m.raw()
	if err != nil {
		return StoreStats{}, err
	}
	var s C.ep_store_stats
	C.ep_store_stats_init(&s)
	err = call("ep_model_store_stats", func() C.ep_status { return C.ep_model_store_stats(&s, r) })
	return storeStatsFromC(&s), err
}

// ---------------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------------

// Session is one sequence's decode state. Not safe for concurrent use.
type Session struct {
	model *Model
	ptr   *C.ep_session
}

// NewSession starts an empty sequence on the model.
func (m *Model) NewSession() (*Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == nil {
		return nil, errClosed
	}
	var raw *C.ep_session
	if err := call("ep_session_open", func() C.ep_status { return C.ep_session_open(&raw, m.ptr) }); err != nil {
		return nil, err
	}
	m.sessions++
	s := &Session{model: m, ptr: raw}
	runtime.SetFinalizer(s, (*Session).Close)
	return s, nil
}

// Close frees the session. It is safe to call more than once.
func (s *Session) Close() error {
	if s.ptr == nil {
		return nil
	}
	C.ep_session_close(s.ptr)
	s.ptr = nil
	runtime.SetFinalizer(s, nil)
	s.model.mu.Lock()
	s.model.sessions--
	s.model.mu.Unlock()
	return nil
}

func (s *Session) raw() (*C.ep_session, error) {
	if s.ptr == nil {
		return nil, errClosed
	}
	return s.ptr, nil
}

// Reset empties the session.
func (s *Session) Reset() error {
	r, err := s.raw()
	if err != nil {
		return err
	}
	return call("ep_session_reset", func() C.ep_status { return C.ep_session_reset(r) })
}

// Len is the number of tokens the session holds.
func (s *Session) Len() (uint64, error) {
	r, err := s.raw()
	if err != nil {
		return 0, err
	}
	var n C.uint64_t
	err = call("ep_session_length", func() C.ep_status { return C.ep_session_length(&n, r) })
	return uint64(n), err
}

// GenerateOptions are the options of generation; start from DefaultGenerateOptions().
type GenerateOptions struct {
	MaxNewTokens      uint32
	Temperature       float32 // <= 0: greedy
	TopK              int32
	TopP              float32
	Seed              uint64
	StopToken         int32 // -1: none
	MinP              float32
	RepetitionPenalty float32
	RepetitionWindow  uint32
	StopTokens        []int32
	StopStrings       []string // text generation only
	IgnoreEOS         bool     // text generation: do not stop at EOS / end of turn
	// LogitBias maps token ids to biases in -100..100 added to their logits before sampling
	// (OpenAI's logit_bias: +100 in effect forces a token, -100 forbids it).
	LogitBias map[int32]float32
}

// DefaultGenerateOptions are the library's defaults (ep_generate_options_init).
func DefaultGenerateOptions() GenerateOptions {
	var o C.ep_generate_options
	C.ep_generate_options_init(&o)
	return GenerateOptions{
		MaxNewTokens: uint32(o.max_new_tokens), Temperature: float32(o.temperature), TopK: int32(o.top_k),
		TopP: float32(o.top_p), Seed: uint64(o.seed), StopToken: int32(o.stop_token), MinP: float32(o.min_p),
		RepetitionPenalty: float32(o.repetition_penalty), RepetitionWindow: uint32(o.repetition_window),
		IgnoreEOS: o.ignore_eos != 0,
	}
}

// cOptions is a C ep_generate_options in C memory (its arrays too: C may not hold Go pointers).
type cOptions struct {
	o     *C.ep_generate_options
	frees []unsafe.Pointer
}

func (g *GenerateOptions) toC() *cOptions {
	if g == nil {
		d := DefaultGenerateOptions()
		g = &d
	}
	c := &cOptions{o: (*C.ep_generate_options)(C.calloc(1, C.sizeof_ep_generate_options))}
	c.frees = append(c.frees, unsafe.Pointer(c.o))
	o := c.o
	C.ep_generate_options_init(o)
	o.max_new_tokens = C.uint32_t(g.MaxNewTokens)
	o.temperature = C.float(g.Temperature)
	o.top_k = C.int32_t(g.TopK)
	o.top_p = C.float(g.TopP)
	o.seed = C.uint64_t(g.Seed)
	o.stop_token = C.int32_t(g.StopToken)
	o.min_p = C.float(g.MinP)
	o.repetition_penalty = C.float(g.RepetitionPenalty)
	o.repetition_window = C.uint32_t(g.RepetitionWindow)
	o.ignore_eos = b2i(g.IgnoreEOS)
	if n := len(g.StopTokens); n > 0 {
		arr := (*[1 << 28]C.int32_t)(C.malloc(C.size_t(n) * 4))[:n:n]
		for i, t := range g.StopTokens {
			arr[i] = C.int32_t(t)
		}
		o.stop_tokens = &arr[0]
		o.n_stop_tokens = C.size_t(n)
		c.frees = append(c.frees, unsafe.Pointer(&arr[0]))
	}
	if n := len(g.LogitBias); n > 0 {
		arr := (*[1 << 26]C.ep_logit_bias)(C.malloc(C.size_t(n) * C.sizeof_ep_logit_bias))[:n:n]
		ids := make([]int32, 0, n)
		for id := range g.LogitBias {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
		for i, id := range ids {
			arr[i] = C.ep_logit_bias{token: C.int32_t(id), bias: C.float(g.LogitBias[id])}
		}
		o.logit_bias = &arr[0]
		o.n_logit_bias = C.size_t(n)
		c.frees = append(c.frees, unsafe.Pointer(&arr[0]))
	}
	if n := len(g.StopStrings); n > 0 {
		arr := (*[1 << 28]*C.char)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0)))))[:n:n]
		for i, s := range g.StopStrings {
			arr[i] = C.CString(s)
			c.frees = append(c.frees, unsafe.Pointer(arr[i]))
		}
		o.stop_strings = &arr[0]
		o.n_stop_strings = C.size_t(n)
		c.frees = append(c.frees, unsafe.Pointer(&arr[0]))
	}
	return c
}

func (c *cOptions) free() {
	for _, p := range c.frees {
		C.free(p)
	}
}

// StopReason is why generation stopped.
type StopReason int32

const (
	StopLength    StopReason = 0
	StopToken     StopReason = 1
	StopString    StopReason = 2
	StopCancelled StopReason = 3
)

// GenerateStats are the statistics of one generation call.
type GenerateStats struct {
	PromptTokens, GeneratedTokens                 uint32
	PrefillSeconds, DecodeSeconds                 float64
	StopReason                                    StopReason
	ReusedTokens                                  uint32
	PrefillTokensPerSecond, DecodeTokensPerSecond float64
	SessionTokens                                 uint64
	PrefillExpertBytes, DecodeExpertBytes         uint64 // routed-expert bytes read from the pack: prompt pass / generation steps
}

func statsFromC(s *C.ep_generate_stats) GenerateStats {
	return GenerateStats{
		PromptTokens: uint32(s.prompt_tokens), GeneratedTokens: uint32(s.generated_tokens),
		PrefillSeconds: float64(s.prefill_seconds), DecodeSeconds: float64(s.decode_seconds),
		StopReason: StopReason(s.stop_reason), ReusedTokens: uint32(s.reused_tokens),
		PrefillTokensPerSecond: float64(s.prefill_tokens_per_second),
		DecodeTokensPerSecond:  float64(s.decode_tokens_per_second), SessionTokens: uint64(s.session_tokens),
		PrefillExpertBytes: uint64(s.prefill_expert_bytes), DecodeExpertBytes: uint64(s.decode_expert_bytes),
	}
}

// Generation is the result of Generate.
type Generation struct {
	Tokens    []int32 // every generated token, including the one the callback stopped at
	Stats     GenerateStats
	Cancelled bool // the callback returned false
}

type tokenState struct {
	f      func(int32, uint32) bool
	tokens []int32
	panic  interface{}
}

//export epGoToken
func epGoToken(token C.int32_t, index C.uint32_t, handle C.uintptr_t) C.int {
	st := cgo.Handle(handle).Value().(*tokenState)
	st.tokens = append(st.tokens, int32(token))
	if st.f == nil {
		return 0
	}
	keepGoing := false
	func() {
		defer func() {
			if r := recover(); r != nil {
				st.panic = r
			}
		}()
		keepGoing = st.f(int32(token), uint32(index))
	}()
	if !keepGoing {
		return 1
	}
	return 0
}

// Generate appends prompt to the session and generates tokens after it. onToken (may be nil)
// is called with each token as it is produced; returning false stops the generation (then
// Cancelled is true). A panic in onToken stops the generation and is re-raised here. opts nil
// means DefaultGenerateOptions().
func (s *Session) Generate(prompt []int32, opts *GenerateOptions, onToken func(token int32, index uint32) bool) (*Generation, error) {
	r, err := s.raw()
	if err != nil {
		return nil, err
	}
	co := opts.toC()
	defer co.free()
	st := &tokenState{f: onToken}
	h := cgo.NewHandle(st)
	defer h.Delete()
	var stats C.ep_generate_stats
	C.ep_generate_stats_init(&stats)
	var p *C.int32_t
	if len(prompt) > 0 {
		p = (*C.int32_t)(unsafe.Pointer(&prompt[0]))
	}
	err = call("ep_generate", func() C.ep_status {
		return C.ep_go_generate(&stats, r, p, C.size_t(len(prompt)), co.o, C.uintptr_t(h))
	})
	runtime.KeepAlive(prompt)
	if st.panic != nil {
		panic(st.panic)
	}
	g := &Generation{Tokens: st.tokens, Stats: statsFromC(&stats)}
	if errors.Is(err, ErrCancelled) {
		g.Cancelled = true
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Scores are the result of Score: Rows × Width values, row-major.
type Scores struct {
	Rows, Width int
	IDs         []int32 // top-k scoring only
	Logits      []float32
}

// Row returns the logits of row i.
func (sc *Scores) Row(i int) []float32 { return sc.Logits[i*sc.Width : (i+1)*sc.Width] }

// RowIDs returns the token ids of row i (top-k scoring only).
func (sc *Scores) RowIDs(i int) []int32 { return sc.IDs[i*sc.Width : (i+1)*sc.Width] }

// Score runs teacher-forced scoring: appends tokens; row i predicts the token after position
// i. topK 0 gives full logits (VocabSize per row), otherwise the k largest, descending.
func (s *Session) Score(tokens []int32, topK uint32) (*Scores, error) {
	r, err := s.raw()
	if err != nil {
		return nil, err
	}
	if len(tokens) == 0 {
		return nil, &Error{Op: "ep_score", Status: ErrInvalidArgument, Message: "no tokens"}
	}
	width := int(topK)
	if topK == 0 {
		info, err := s.model.Info()
		if err != nil {
			return nil, err
		}
		width = int(info.VocabSize)
	}
	sc := &Scores{Rows: len(tokens), Width: width, Logits: make([]float32, len(tokens)*width)}
	var ids *C.int32_t
	if topK > 0 {
		sc.IDs = make([]int32, len(tokens)*width)
		ids = (*C.int32_t)(unsafe.Pointer(&sc.IDs[0]))
	}
	err = call("ep_score", func() C.ep_status {
		return C.ep_score(r, (*C.int32_t)(unsafe.Pointer(&tokens[0])), C.size_t(len(tokens)), C.uint32_t(topK), ids,
			(*C.float)(unsafe.Pointer(&sc.Logits[0])))
	})
	if err != nil {
		return nil, err
	}
	return sc, nil
}
