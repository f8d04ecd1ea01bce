package server_test

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestImage runs the image `make image` built (modelqual/qual-server:dev) the way the
// container launcher does: read-only root filesystem, bundle mounted read-only, listening on
// 0.0.0.0:8000 inside. Skipped where Docker or the image is absent.
func TestImage(t *testing.T) {
	const image = "modelqual/qual-server:dev"
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("docker not installed")
	}
	if err := exec.Command("docker", "image", "inspect", image).Run(); err != nil {
		t.Skipf("image %s not built; run make image", image)
	}
	bundle, err := filepath.EvalSymlinks(mockBundle(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	name := fmt.Sprintf("qual-server-test-%d", port)
	out, err := exec.Command("docker", "run", "-d", "--name", name, "--read-only",
		"-p", fmt.Sprintf("127.0.0.1:%d:8000", port), "-v", bundle+":/models/bundle.mqb:ro",
		image, "--model-name", "img", "--workers", "2").CombinedOutput()
	if err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := exec.Command("docker", "logs", name).CombinedOutput()
			t.Logf("container log:\n%s", logs)
		}
		_ = exec.Command("docker", "rm", "-f", name).Run()
	})
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	eventually(t, "the container to be ready", 30*time.Second, func() bool {
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"model":"img","prompt":"Hello","max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":4`) {
		t.Fatalf("completion in container: %d %s", resp.StatusCode, body)
	}
	user, _ := exec.Command("docker", "inspect", "-f", "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}", name).Output()
	if got := strings.TrimSpace(string(user)); got != "65532:65532 true" {
		t.Errorf("container user/read-only = %q, want non-root 65532 and a read-only root", got)
	}
	if out, err := exec.Command("docker", "stop", "-t", "20", name).CombinedOutput(); err != nil {
		t.Fatalf("docker stop: %v %s", err, out)
	}
	code, _ := exec.Command("docker", "inspect", "-f", "{{.State.ExitCode}}", name).Output()
	if strings.TrimSpace(string(code)) != "0" {
		t.Errorf("exit code after SIGTERM = %s, want 0", code)
	}
}
