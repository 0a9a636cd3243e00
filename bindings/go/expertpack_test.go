package expertpack

// Tests against the small synthetic model made by scripts/test-bindings. Environment:
// EP_TEST_MODEL (an Expert Pack), EP_TEST_PROMPT, EP_TEST_SEED, EP_TEST_TEMP, EP_TEST_EXPECTED
// (the ids ep-run generated through the C API for them), EP_TEST_DIR (a scratch folder).

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func env(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run scripts/test-bindings", name)
	}
	return v
}

func ids(t *testing.T, s string) []int32 {
	var out []int32
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			v, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, int32(v))
		}
	}
	return out
}

type fixture struct {
	model    string
	prompt   []int32
	seed     uint64
	temp     float32
	expected []int32
}

func getFixture(t *testing.T) fixture {
	seed, err := strconv.ParseUint(env(t, "EP_TEST_SEED"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	temp, err := strconv.ParseFloat(env(t, "EP_TEST_TEMP"), 32)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{model: env(t, "EP_TEST_MODEL"), prompt: ids(t, env(t, "EP_TEST_PROMPT")), seed: seed,
		temp: float32(temp), expected: ids(t, env(t, "EP_TEST_EXPECTED"))}
}

func open(t *testing.T, f fixture) *Model {
	m, err := OpenModel(f.model, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return m
}

func TestVersionAndStatus(t *testing.T) {
	parts := strings.Split(Version(), ".")
	if len(parts) != 3 {
		t.Fatalf("version %q", Version())
	}
	ma, _ := strconv.Atoi(parts[0])
	mi, _ := strconv.Atoi(parts[1])
	pa, _ := strconv.Atoi(parts[2])
	if VersionNumber() != uint32(ma*10000+mi*100+pa) {
		t.Fatalf("version number %d vs %q", VersionNumber(), Version())
	}
	if ErrNotFound.String() != "EP_ERR_NOT_FOUND" || StatusOK.String() != "EP_OK" {
		t.Fatal("status strings")
	}
	if n, err := CUDADeviceCount(); err != nil || n < 0 {
		t.Fatal(n, err)
	}
}

func TestStreamMatchesCAPI(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	info, err := m.Info()
	if err != nil || info.Architecture != "deepseek4" || info.VocabSize == 0 {
		t.Fatal(info, err)
	}
	// the GPU when there is one (DeviceAuto), else the CPU
	if n, _ := CUDADeviceCount(); n == 0 && (info.Device != DeviceCPU || info.DeviceIndex != -1) {
		t.Fatalf("no GPU, yet the model runs on device %d index %d", info.Device, info.DeviceIndex)
	}
	if filepath.Ext(m.PackPath()) != ".epk" {
		t.Fatalf("pack path %q", m.PackPath())
	}
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	opts := DefaultGenerateOptions()
	opts.MaxNewTokens, opts.Temperature, opts.Seed = 8, f.temp, f.seed
	var streamed []int32
	var indices []uint32
	g, err := s.Generate(f.prompt, &opts, func(tok int32, idx uint32) bool {
		streamed = append(streamed, tok)
		indices = append(indices, idx)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Tokens, f.expected) || !reflect.DeepEqual(streamed, f.expected) {
		t.Fatalf("tokens %v, streamed %v, C API (ep-run) %v", g.Tokens, streamed, f.expected)
	}
	if !reflect.DeepEqual(indices, []uint32{0, 1, 2, 3, 4, 5, 6, 7}) || g.Cancelled {
		t.Fatal(indices, g.Cancelled)
	}
	if g.Stats.PrefillExpertBytes == 0 {
		t.Fatal("a fresh model read no expert bytes during the prompt")
	}
	if int(g.Stats.PromptTokens) != len(f.prompt) || g.Stats.GeneratedTokens != 8 {
		t.Fatalf("stats %+v", g.Stats)
	}
	if n, _ := s.Len(); int(n) != len(f.prompt)+8 {
		t.Fatal("session length", n)
	}
	st, err := m.StoreStats()
	if err != nil || st.Acquires == 0 || st.CacheHits+st.CacheMisses == 0 {
		t.Fatal(st, err)
	}
}

func TestCancelAndPanic(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	opts := DefaultGenerateOptions()
	opts.MaxNewTokens, opts.Temperature, opts.Seed = 8, f.temp, f.seed
	g, err := s.Generate(f.prompt, &opts, func(tok int32, idx uint32) bool { return idx < 2 })
	if err != nil || !g.Cancelled || !reflect.DeepEqual(g.Tokens, f.expected[:3]) {
		t.Fatal(g, err)
	}
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v", r)
			}
		}()
		s.Generate(f.prompt, nil, func(int32, uint32) bool { panic("boom") })
		t.Fatal("no panic")
	}()
}

func TestScoreAgreesWithGreedy(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	s, _ := m.NewSession()
	defer s.Close()
	opts := DefaultGenerateOptions()
	opts.MaxNewTokens = 1
	g, err := s.Generate(f.prompt, &opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, _ := m.NewSession()
	defer s2.Close()
	sc, err := s2.Score(f.prompt, 3)
	if err != nil {
		t.Fatal(err)
	}
	last := sc.Rows - 1
	if sc.RowIDs(last)[0] != g.Tokens[0] || sc.Row(last)[0] < sc.Row(last)[1] {
		t.Fatal(sc.RowIDs(last), sc.Row(last), g.Tokens)
	}
	s3, _ := m.NewSession()
	defer s3.Close()
	full, err := s3.Score(f.prompt[:2], 0)
	info, _ := m.Info()
	if err != nil || full.Width != int(info.VocabSize) || len(full.Logits) != 2*full.Width {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	missing := filepath.Join(env(t, "EP_TEST_DIR"), "no-such-model.gguf")
	opts := DefaultModelOptions()
	opts.PackBuild = false
	_, err := OpenModel(missing, &opts)
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrNotFound || !errors.Is(err, ErrNotFound) {
		t.Fatalf("error %v", err)
	}
	if !strings.Contains(e.Message, "no-such-model.gguf") {
		t.Fatalf("message %q does not name the file", e.Message)
	}
	f := getFixture(t)
	m := open(t, f)
	s, _ := m.NewSession()
	if _, err := s.Generate([]int32{100000000}, nil, nil); StatusOf(err) != ErrInvalidArgument {
		t.Fatal(err)
	}
	if err := m.Close(); !errors.Is(err, ErrBusy) {
		t.Fatal("closing a model with an open session:", err)
	}
	s.Close()
	s.Close() // idempotent
	if _, err := s.Len(); err == nil {
		t.Fatal("use after close")
	}
	if _, err := ReadStoreStats(filepath.Join(env(t, "EP_TEST_DIR"), "nope.json")); err == nil {
		t.Fatal("missing stats file")
	}
}

func TestPack(t *testing.T) {
	f := getFixture(t)
	p, err := OpenPack(f.model, ValidateFull)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.FormatVersion != 1 || info.NumLayers == 0 {
		t.Fatal(info, err)
	}
	o, err := p.Object(0, 0)
	if err != nil || o.Offset != info.DataStart || o.Offset%info.Alignment != 0 {
		t.Fatal(o, err)
	}
	if _, err := p.Object(info.NumLayers, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestLogCallback(t *testing.T) {
	f := getFixture(t)
	var mu sync.Mutex
	var seen []string
	if err := SetLogCallback(func(l LogLevel, msg string) {
		mu.Lock()
		seen = append(seen, msg)
		mu.Unlock()
	}, LogInfo); err != nil {
		t.Fatal(err)
	}
	m, err := OpenModel(f.model, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	SetLogCallback(nil, LogWarn)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("no log message at INFO while opening a model")
	}
}

func TestSessionsOnGoroutinesShareAModel(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	opts := DefaultGenerateOptions()
	opts.MaxNewTokens, opts.Temperature, opts.Seed = 8, f.temp, f.seed
	var wg sync.WaitGroup
	results := make([][]int32, 3)
	errs := make([]error, 3)
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := m.NewSession()
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			g, err := s.Generate(f.prompt, &opts, nil)
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = g.Tokens
		}(i)
	}
	wg.Wait()
	for i := range results {
		if errs[i] != nil || !reflect.DeepEqual(results[i], f.expected) {
			t.Fatalf("goroutine %d: %v %v, expected %v", i, results[i], errs[i], f.expected)
		}
	}
}

func TestNoPackReadsTheSource(t *testing.T) {
	// the GGUF the pack was built from, read through a source index in PackDir: the same tokens
	f := getFixture(t)
	dir := filepath.Join(env(t, "EP_TEST_DIR"), "go-index")
	opts := DefaultModelOptions()
	opts.Device, opts.NoPack, opts.PackDir = DeviceCPU, true, dir
	m, err := OpenModel(env(t, "EP_TEST_SOURCE"), &opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if filepath.Ext(m.PackPath()) != ".epx" {
		t.Fatalf("source index path %q", m.PackPath())
	}
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := DefaultGenerateOptions()
	g.MaxNewTokens, g.Temperature, g.Seed = 8, f.temp, f.seed
	out, err := s.Generate(f.prompt, &g, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out.Tokens, f.expected) {
		t.Fatalf("tokens %v, C API (ep-run) %v", out.Tokens, f.expected)
	}
	packs, _ := filepath.Glob(filepath.Join(dir, "*.epk"))
	if len(packs) != 0 {
		t.Fatalf("a pack was written: %v", packs)
	}
	bad := DefaultModelOptions()
	bad.NoPack = true
	if _, err := OpenModel(f.model, &bad); StatusOf(err) != ErrInvalidArgument {
		t.Fatal("a pack given with NoPack:", err)
	}
}
