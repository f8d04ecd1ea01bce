package launch_test

import (
	"io"
	"net"
	"net/http"
	"strings"
)

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func httpPost(url, body, id string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}
