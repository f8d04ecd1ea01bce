package launch_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelqual/modelqual/qual/gpu"
	"github.com/modelqual/modelqual/qual/launch"
	"github.com/modelqual/modelqual/qual/launch/launchtest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProcessLauncherStartsAndStops(t *testing.T) {
	bundle := launchtest.MockBundle(t, 0)
	dir := t.TempDir()
	ep, err := launch.Process(launch.WithBundle(bundle), launch.WithServerBin(launchtest.ServerBin(t)), launch.WithModel("mock"),
		launch.WithRunDir(dir), launch.WithFaults("server.nothing_real")).Start(context.Background())
	if ep != nil {
		defer ep.Stop(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ep.BaseURL, "http://127.0.0.1:") || ep.PID == 0 || ep.Kind != "process" {
		t.Fatalf("endpoint %+v", ep)
	}
	if code, body := get(t, ep.BaseURL+"/health"); code != 200 || !strings.Contains(body, "ready") {
		t.Fatalf("/health %d %s", code, body)
	}
	if code, body := get(t, ep.BaseURL+"/v1/models"); code != 200 || !strings.Contains(body, `"mock"`) {
		t.Fatalf("/v1/models %d %s", code, body)
	}
	if ep.RecordsPath != filepath.Join(dir, "server_records.jsonl") || len(ep.LogPaths) != 2 {
		t.Fatalf("artifacts %q %v", ep.RecordsPath, ep.LogPaths)
	}
	if !strings.Contains(strings.Join(ep.Env, " "), "MODELQUAL_FAULTS=server.nothing_real") {
		t.Errorf("faults not passed: %v", ep.Env)
	}
	if err := ep.Stop(context.Background()); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := http.Get(ep.BaseURL + "/health"); err == nil {
		t.Fatal("server still answers after Stop")
	}
	// The records of the (unrecorded) health probes and the logs stay as artifacts.
	for _, p := range ep.LogPaths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("log artifact: %v", err)
		}
	}
	if err := ep.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestProcessLauncherReportsEarlyExitWithLogTail(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.mqb")
	os.WriteFile(bad, []byte("MQBUNDLE but not really a bundle"), 0o644)
	ep, err := launch.Process(launch.WithBundle(bad), launch.WithServerBin(launchtest.ServerBin(t)),
		launch.WithRunDir(t.TempDir()), launch.WithStartupTimeout(30*time.Second)).Start(context.Background())
	if ep != nil {
		defer ep.Stop(context.Background())
	}
	if err == nil {
		t.Fatal("a corrupt bundle started")
	}
	if !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "server log tail") || !strings.Contains(err.Error(), "bad.mqb") {
		t.Fatalf("error does not explain: %v", err)
	}
}

func TestProcessLauncherInputErrors(t *testing.T) {
	_, err := launch.Process(launch.WithRunDir(t.TempDir())).Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "WithBundle") {
		t.Fatalf("no bundle: %v", err)
	}
	_, err = launch.Process(launch.WithBundle(launchtest.MockBundle(t, 0)), launch.WithServerBin("/nonexistent/qual-server"),
		launch.WithRunDir(t.TempDir())).Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("no binary: %v", err)
	}
	if _, err := launch.New("kubernetes"); err == nil || !strings.Contains(err.Error(), "process, container or external") {
		t.Fatalf("unknown launcher: %v", err)
	}
}

func TestExternalLauncherDrivesSeparateServer(t *testing.T) {
	srv := launchtest.Start(t, launchtest.MockBundle(t, 0))
	ep, err := launch.External(launch.WithURL(srv.BaseURL+"/v1/"), launch.WithModel("mock")).Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ep.BaseURL != srv.BaseURL || ep.Kind != "external" || ep.RecordsPath != "" {
		t.Fatalf("endpoint %+v", ep)
	}
	if code, _ := get(t, ep.BaseURL+"/v1/models"); code != 200 {
		t.Fatalf("models %d", code)
	}
	// Stop on an external endpoint leaves the server running.
	if err := ep.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, srv.BaseURL+"/health"); code != 200 {
		t.Fatal("external Stop stopped the server")
	}
}

func TestExternalLauncherModelsFallback(t *testing.T) {
	// A server without /health (llama.cpp-style variants) is ready when /v1/models answers.
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"data":[]}`) })
	hs := &http.Server{Handler: mux}
	l, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(l)
	defer hs.Close()
	if _, err := launch.External(launch.WithURL("http://" + l.Addr().String())).Start(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestExternalLauncherTimesOut(t *testing.T) {
	l, _ := netListen()
	addr := l.Addr().String()
	l.Close() // nothing listens here now
	_, err := launch.External(launch.WithURL("http://"+addr), launch.WithStartupTimeout(300*time.Millisecond)).Start(context.Background())
	if !errors.Is(err, launch.ErrNotReady) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("err = %v", err)
	}
	if _, err := launch.External(launch.WithURL("localhost:8000")).Start(context.Background()); err == nil {
		t.Fatal("URL without scheme accepted")
	}
}

func TestProcessLauncherGPUsNeedADriver(t *testing.T) {
	if gpu.Inspect().Available {
		t.Skip("this machine has an NVIDIA driver; the refusal cannot be shown here")
	}
	_, err := launch.Process(launch.WithBundle(launchtest.MockBundle(t, 0)), launch.WithServerBin(launchtest.ServerBin(t)),
		launch.WithRunDir(t.TempDir()), launch.WithGPUs("0")).Start(context.Background())
	if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), "run without --gpus") {
		t.Fatalf("err = %v", err)
	}
}
