#!/usr/bin/env python3
"""A check of qual-server's OpenEngine port with a client nobody here wrote the wire code of:
Python grpcio (e.g. Debian's python3-grpcio) with every message encoded and decoded by protoc
from the UPSTREAM .proto files (ai-dynamo/openengine, proto/ at the revision PROVENANCE.md names),
not from qual-server's copy. It streams a greedy Generate, checks that the deltas concatenate to
the HTTP completion's text, that bad requests are refused INVALID_ARGUMENT / NOT_FOUND, and that
the next request succeeds.

Usage: upstream_client.py UPSTREAM_PROTO_DIR HTTP_PORT GRPC_PORT   (server: --model-name any)
"""
import ast, json, subprocess, sys, urllib.request

import grpc

UP, HTTP, GRPC = sys.argv[1], sys.argv[2], sys.argv[3]


def protoc(mode, msg, data):
    return subprocess.run(["protoc", "-I", UP, "-I", "/usr/include", f"--{mode}=openengine.v1.{msg}",
                           "openengine/v1/openengine.proto"], input=data, capture_output=True, check=True).stdout


gen = grpc.insecure_channel(f"127.0.0.1:{GRPC}").unary_stream(
    "/openengine.v1.Inference/Generate", request_serializer=lambda b: b, response_deserializer=lambda b: b)


def stream(text):
    return [protoc("decode", "GenerateResponse", raw).decode() for raw in gen(protoc("encode", "GenerateRequest", text.encode()))]


def deltas(events):
    out = b""
    for d in events:
        for line in d.splitlines():
            line = line.strip()
            if line.startswith("text: "):  # protoc prints C-escaped bytes
                out += ast.literal_eval("b" + line[len("text: "):])
    return out.decode("utf-8")


ok = True
req = 'prompt: "Once upon a time" sampling { temperature: 0 } stopping { max_tokens: 20 }'
http = urllib.request.Request(f"http://127.0.0.1:{HTTP}/v1/completions", headers={"Content-Type": "application/json"},
                              data=json.dumps({"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}).encode())
want = json.load(urllib.request.urlopen(http))["choices"][0]["text"]
events = stream(req)
print(f"{len(events)} events; last:\n{events[-1]}")
ok &= deltas(events) == want and "finished" in events[-1] and "usage" in events[-1]
print("deltas concatenate to the HTTP completion:", deltas(events) == want)
for bad, code in [('prompt: "x" stopping { max_tokens: 0 }', grpc.StatusCode.INVALID_ARGUMENT),
                  ('model: "no-such-model" prompt: "x"', grpc.StatusCode.NOT_FOUND)]:
    try:
        stream(bad)
        ok = False
        print("NOT refused:", bad)
    except grpc.RpcError as e:
        ok &= e.code() == code
        print("refused:", e.code(), e.details())
    again = stream(req)
    ok &= deltas(again) == want
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
