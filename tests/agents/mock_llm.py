#!/usr/bin/env python3
"""A scripted model server for the agent tests: speaks just enough of the Anthropic Messages,
OpenAI Chat Completions / Responses and Gemini generateContent APIs for a real client to run.

usage: mock_llm.py PORT_FILE LOG_FILE [SCRIPT_JSON [CERT_PEM KEY_PEM]]

Binds 127.0.0.1 on a free port and writes it to PORT_FILE. Every request is appended to
LOG_FILE as one JSON line (method, path, Host header, and for Anthropic the tool results the
client sent back). SCRIPT_JSON is a list of steps, each a shell command (a Bash call) or
{"tool": NAME, "input": {...}} (any tool, offered or not: a model that insists): while an
Anthropic request that offers tools has fewer tool results than the script has steps, the
answer is a tool_use for the next one (for Gemini, a functionCall while it has fewer function
responses than steps, tool steps only); then a final text "MOCK-DONE". Exits after 300 s at
most. With CERT_PEM and KEY_PEM it speaks HTTPS (the credential brokering tests); each entry then
also has the credential headers it got (x-api-key, authorization, x-goog-api-key).
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT_FILE, LOG_FILE = sys.argv[1], sys.argv[2]
SCRIPT = json.loads(sys.argv[3]) if len(sys.argv) > 3 else []
TLS = sys.argv[4:6] if len(sys.argv) > 5 else None
LOCK = threading.Lock()


def log(entry):
    with LOCK, open(LOG_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")


def tool_results(messages):
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    c = block.get("content")
                    if isinstance(c, list):
                        c = "".join(x.get("text", "") for x in c if isinstance(x, dict))
                    out.append({"is_error": bool(block.get("is_error")), "content": c})
    return out


def user_texts(messages):
    """The text blocks of the user's turns (hooks' context for the model lands there)."""
    out = []
    for m in messages:
        if m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, str):
            out.append(content[:20000])
        elif isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "text":
                    out.append(str(block.get("text", ""))[:20000])
    return out


def sse(events):
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events
    ).encode()


def anthropic(body):
    results = tool_results(body.get("messages", []))
    tools = [t.get("name") for t in body.get("tools", []) if isinstance(t, dict)]
    step = len(results)
    if tools and step < len(SCRIPT):
        entry = SCRIPT[step]
        if isinstance(entry, str):
            name, args = "Bash", {"command": entry, "description": "scripted step"}
        else:
            name, args = entry["tool"], entry["input"]
        block = {"type": "tool_use", "id": f"toolu_{step}", "name": name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(args)}
        stop = "tool_use"
        full = dict(block, input=args)
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": "MOCK-DONE"}
        stop = "end_turn"
        full = {"type": "text", "text": "MOCK-DONE"}
    usage = {"input_tokens": 1, "output_tokens": 1}
    message = {
        "id": f"msg_{step}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "mock"),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        return "application/json", json.dumps(
            dict(message, content=[full], stop_reason=stop)
        ).encode(), results
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]
    return "text/event-stream", sse(events), results


def openai_chat(body):
    msg = {"role": "assistant", "content": "MOCK-DONE"}
    if body.get("stream"):
        chunks = [
            {"id": "c1", "object": "chat.completion.chunk", "model": "mock",
             "choices": [{"index": 0, "delta": msg, "finish_reason": None}]},
            {"id": "c1", "object": "chat.completion.chunk", "model": "mock",
             "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
        data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return "text/event-stream", data.encode()
    return "application/json", json.dumps({
        "id": "c1", "object": "chat.completion", "model": "mock",
        "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }).encode()


def openai_responses():
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "MOCK-DONE", "annotations": []}]}
    usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 2}
    base = {"id": "resp_1", "object": "response", "model": "mock", "output": []}
    events = [
        {"type": "response.created", "response": dict(base, status="in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": dict(item, status="in_progress", content=[])},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0,
         "item_id": "msg_1", "delta": "MOCK-DONE"},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed",
         "response": dict(base, status="completed", output=[item], usage=usage)},
    ]
    return "text/event-stream", sse(events)


def gemini_results(body):
    out = []
    for c in body.get("contents", []):
        for part in c.get("parts", []) if isinstance(c, dict) else []:
            if isinstance(part, dict) and "functionResponse" in part:
                out.append(json.dumps(part["functionResponse"].get("response")))
    return out


def gemini(body, offered):
    results = gemini_results(body)
    step = len(results)
    part = {"text": "MOCK-DONE"}
    if offered and step < len(SCRIPT) and isinstance(SCRIPT[step], dict):
        part = {"functionCall": {"name": SCRIPT[step]["tool"], "args": SCRIPT[step]["input"]}}
    return results, "application/json", json.dumps({
        "candidates": [{"content": {"role": "model", "parts": [part]},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1,
                          "totalTokenCount": 2},
    }).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, ctype, data, code=200):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def keys(self, entry):
        if TLS:
            for h in ("x-api-key", "authorization", "x-goog-api-key"):
                entry[h] = self.headers.get(h)
        return entry

    def do_GET(self):
        log(self.keys({"method": "GET", "path": self.path, "host": self.headers.get("Host")}))
        if "/models" in self.path:
            self.reply("application/json", json.dumps(
                {"object": "list", "data": [{"id": "mock", "object": "model"}]}).encode())
        else:
            self.reply("application/json", b"{}")

    def do_HEAD(self):
        log({"method": "HEAD", "path": self.path, "host": self.headers.get("Host")})
        self.reply("application/json", b"")

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        entry = {"method": "POST", "path": self.path, "host": self.headers.get("Host")}
        path = self.path.split("?")[0]
        if path.endswith("/messages"):
            ctype, data, results = anthropic(body)
            entry["tools"] = len(body.get("tools", []))
            entry["tool_names"] = [
                t.get("name") for t in body.get("tools", []) if isinstance(t, dict)
            ]
            entry["tool_results"] = results
            entry["texts"] = user_texts(body.get("messages", []))
        elif path.endswith("/chat/completions"):
            ctype, data = openai_chat(body)
        elif path.endswith("/responses"):
            ctype, data = openai_responses()
        elif ":generateContent" in path or ":streamGenerateContent" in path:
            entry["tools"] = [
                f.get("name")
                for t in body.get("tools", []) if isinstance(t, dict)
                for f in t.get("functionDeclarations", []) if isinstance(f, dict)
            ]
            entry["gemini_results"], ctype, data = gemini(body, entry["tools"])
            if ":streamGenerateContent" in path:
                ctype, data = "text/event-stream", b"data: " + data + b"\r\n\r\n"
        else:
            ctype, data = "application/json", b"{}"
        log(self.keys(entry))
        self.reply(ctype, data)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
if TLS:
    import ssl  # noqa: E402

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS[0], TLS[1])
    server.socket = context.wrap_socket(server.socket, server_side=True)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os  # noqa: E402

os.rename(PORT_FILE + ".tmp", PORT_FILE)
threading.Timer(300, server.shutdown).start()
server.serve_forever()
