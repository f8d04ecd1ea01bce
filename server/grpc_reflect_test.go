package server_test

import (
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// reflectClient is what grpcurl does, written against the gRPC server reflection v1 protocol
// only: it knows no OpenEngine type at compile time, lists services, fetches their descriptors
// from the server, builds requests from JSON and decodes responses dynamically.
type reflectClient struct {
	conn  *grpc.ClientConn
	files map[string]*descriptorpb.FileDescriptorProto
}

func (c *reflectClient) ask(t *testing.T, req *reflectpb.ServerReflectionRequest) *reflectpb.ServerReflectionResponse {
	t.Helper()
	st, err := reflectpb.NewServerReflectionClient(c.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	if err := st.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if e := resp.GetErrorResponse(); e != nil {
		t.Fatalf("reflection error %d: %s", e.ErrorCode, e.ErrorMessage)
	}
	return resp
}

func (c *reflectClient) services(t *testing.T) []string {
	var out []string
	for _, s := range c.ask(t, &reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}}).GetListServicesResponse().GetService() {
		out = append(out, s.GetName())
	}
	return out
}

// method resolves a fully qualified method (service/method) from the server's descriptors.
func (c *reflectClient) method(t *testing.T, service, name string) protoreflect.MethodDescriptor {
	t.Helper()
	resp := c.ask(t, &reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: service}})
	for _, raw := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(raw, fd); err != nil {
			t.Fatal(err)
		}
		c.files[fd.GetName()] = fd
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, fd := range c.files {
		set.File = append(set.File, fd)
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("descriptors from reflection: %v", err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		t.Fatal(err)
	}
	m := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name))
	if m == nil {
		t.Fatalf("%s has no method %s", service, name)
	}
	return m
}

// stream calls a server-streaming method with a JSON request and returns each response as
// JSON (protojson), then the call's status.
func (c *reflectClient) stream(t *testing.T, m protoreflect.MethodDescriptor, reqJSON string) ([]map[string]any, error) {
	t.Helper()
	in := dynamicpb.NewMessage(m.Input())
	if err := protojson.Unmarshal([]byte(reqJSON), in); err != nil {
		t.Fatalf("request %s: %v", reqJSON, err)
	}
	full := "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
	st, err := c.conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true}, full)
	if err != nil {
		return nil, err
	}
	if err := st.SendMsg(in); err != nil {
		return nil, err
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	var out []map[string]any
	for {
		msg := dynamicpb.NewMessage(m.Output())
		if err := st.RecvMsg(msg); err == io.EOF {
			return out, nil
		} else if err != nil {
			return out, err
		}
		b, err := protojson.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
}

// TestGRPCReflectionClient is the acceptance flow with a client that has no generated
// code: it lists openengine.v1.Inference through reflection, streams a Generate whose deltas
// concatenate to the HTTP completion's text, gets INVALID_ARGUMENT and NOT_FOUND for bad
// requests, and then succeeds.
func TestGRPCReflectionClient(t *testing.T) {
	g := startGRPCServer(t, qwenBundle(t))
	c := &reflectClient{conn: g.conn, files: map[string]*descriptorpb.FileDescriptorProto{}}
	svcs := c.services(t)
	for _, want := range []string{"openengine.v1.Inference", "openengine.v1.Control", "grpc.health.v1.Health"} {
		if !slices.Contains(svcs, want) {
			t.Errorf("reflection lists %v, without %s", svcs, want)
		}
	}
	gen := c.method(t, "openengine.v1.Inference", "Generate")
	const req = `{"prompt":"Once upon a time","sampling":{"temperature":0},"stopping":{"maxTokens":20}}`
	want := g.completion(t, `{"prompt":"Once upon a time","max_tokens":20,"temperature":0}`).Choices[0].Text

	check := func(when string) {
		events, err := c.stream(t, gen, req)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		var text strings.Builder
		var finished, usage bool
		for _, ev := range events {
			if tok, ok := ev["token"].(map[string]any); ok {
				s, _ := tok["text"].(string)
				text.WriteString(s)
			}
			if _, ok := ev["finished"]; ok {
				finished = true
				_, usage = ev["usage"]
			}
		}
		if text.String() != want || !finished || !usage {
			t.Errorf("%s: deltas %q (finished %v, usage %v), HTTP completion %q", when, text.String(), finished, usage, want)
		}
	}
	check("first")
	for _, bad := range []struct {
		req  string
		code codes.Code
	}{
		{`{"prompt":"x","stopping":{"maxTokens":0}}`, codes.InvalidArgument},
		{`{"prompt":"x","sampling":{"topP":1.5}}`, codes.InvalidArgument},
		{`{"model":"no-such-model","prompt":"x"}`, codes.NotFound},
	} {
		_, err := c.stream(t, gen, bad.req)
		if st, _ := status.FromError(err); st.Code() != bad.code {
			t.Errorf("%s: got %v, want %v", bad.req, err, bad.code)
		}
		check("after " + bad.req)
	}
}
