"""Real clients against a real `choreo serve` on 127.0.0.1 (run by tests/serve/serve_test.cc, one section each).

Sections:
  openai     the openai package: chat completions streamed and not, n=2, a stop string, cached_tokens,
             completions, responses with previous_response_id and streamed (stream=True and the stream()
             helper), and each error status as the SDK's own class
  anthropic  the anthropic package: messages with cache_control blocks, streamed and not, cache reads
  equality   32 concurrent clients; each text equals its sequential `choreo generate --chat` output
  faults     malformed JSON, wrong types, oversized bodies, 10^5 messages, a slow body, a client gone
             mid-stream, more requests than --max-concurrency; the server keeps serving after each
  langgraph  a LangGraph graph of three agents debating through ChatOpenAI; later rounds hit the cache, and a
             restarted server gives the same text at temperature 0
  extensions choreo's extensions through extra_body: ids, item_reference parents (reordered, answers as parents),
             output ids, retention; every answer equals `choreo exec` of the same calls; 8 concurrent requests
             share forward passes; unknown ids (404), ids reused with another text (409), cycles (400)
  tiers      served messages in T1 (a small T0), T2 (kill -9, restart: the documents load from the store) and T3
             (Redis); /metrics per tier; every answer equals `choreo exec` of the same calls
  workflows  POST /choreo/v1/workflows/{name}: the text equals `choreo run`'s stdout, the record its --json

Exit status 0 when every check of the section holds; the first failed check is printed with what was seen.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

MODEL_ID = None


class Server:
    """`choreo serve` on a free port, stopped at exit."""

    def __init__(self, choreo, model, *extra):
        budget = [] if "--cache-mib" in extra else ["--cache-mib", "1024"]
        self.proc = subprocess.Popen([choreo, "serve", "-m", model, "--port", "0", *budget, *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "listening on http://" not in line:
            raise SystemExit(f"FAIL: the server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = line.split("listening on ")[1].split(";")[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        global MODEL_ID
        MODEL_ID = line.split("models: ")[1].split(";")[0].split(",")[0].strip()
        # Drain stderr so that the request log never blocks the server.
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def stop(self):
        if self.proc.poll() is not None:  # killed by the test
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise SystemExit("FAIL: the server did not stop within 30 s of SIGTERM")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def check(cond, what, seen=None):
    if not cond:
        raise SystemExit(f"FAIL: {what}" + (f"\n  seen: {seen!r}" if seen is not None else ""))
    print(f"ok    {what}")


def raw(server, method, path, body=None, headers=None, timeout=60):
    """(status, parsed JSON or text) of one request, without an SDK."""
    req = urllib.request.Request(server.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        data, status = e.read().decode(), e.code
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data


def healthy(server):
    status, body = raw(server, "GET", "/health")
    return status == 200 and body == {"status": "ok"}


def generate_reference(choreo, model, prompt, seed, n, temp, top_k, top_p):
    out = subprocess.run([choreo, "generate", "-m", model, "--chat", "-p", prompt, "-s", str(seed), "-n", str(n),
                          "--temp", str(temp), "--top-k", str(top_k), "--top-p", str(top_p)],
                         capture_output=True, check=True)
    text = out.stdout.decode()
    assert text.endswith("\n")
    return text[:-1]


# ---- sections ---------------------------------------------------------------------------------------------

def section_openai(args):
    import openai
    with Server(args.choreo, args.model) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        q = [{"role": "system", "content": "You are a terse assistant."},
             {"role": "user", "content": "Name three primary colors."}]
        r1 = c.chat.completions.create(model=MODEL_ID, messages=q, max_tokens=24, temperature=0)
        check(r1.choices[0].message.content.strip() != "", "chat completion: text", r1)
        d = r1.usage.prompt_tokens_details
        check(d is not None and d.cached_tokens == 0, "usage.prompt_tokens_details.cached_tokens is present and 0 "
              "on a first request", r1.usage)
        r2 = c.chat.completions.create(model=MODEL_ID, messages=q, max_tokens=24, temperature=0)
        check(r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1,
              "a repeated prompt is cached but its last token", r2.usage)
        check(r2.choices[0].message.content == r1.choices[0].message.content, "greedy: the same text again")
        chunks = list(c.chat.completions.create(model=MODEL_ID, messages=q, max_tokens=24, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        check(streamed == r1.choices[0].message.content, "streamed text equals the whole answer", streamed)
        check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r1.usage.completion_tokens,
              "stream_options.include_usage: a last chunk with usage", chunks[-1])
        two = c.chat.completions.create(model=MODEL_ID, messages=q, max_tokens=24, temperature=1.0, seed=7, n=2)
        one = c.chat.completions.create(model=MODEL_ID, messages=q, max_tokens=24, temperature=1.0, seed=7)
        check(len(two.choices) == 2 and [x.index for x in two.choices] == [0, 1], "n=2: two choices", two.choices)
        check(two.choices[0].message.content == one.choices[0].message.content,
              "n=2: choice 0 is the n=1 answer of the same seed")
        check(two.choices[1].message.content != two.choices[0].message.content, "n=2: the second choice samples "
              "with its own seed", two.choices)
        words = r1.choices[0].message.content.split()
        stop = words[1] if len(words) > 1 else words[0]
        st = c.chat.completions.create(model=MODEL_ID, messages=q, max_tokens=24, temperature=0, stop=[stop])
        full = r1.choices[0].message.content
        check(st.choices[0].message.content == full[:full.index(stop)] and st.choices[0].finish_reason == "stop",
              f"stop string {stop!r}: the text ends before it", st.choices[0])
        cmp = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=0)
        check(cmp.choices[0].text != "" and cmp.usage.completion_tokens <= 8, "completions: text", cmp)

        a = c.responses.create(model=MODEL_ID, input="Say hello.", max_output_tokens=16, temperature=0)
        check(a.output_text != "" and a.id.startswith("resp_"), "responses: output_text", a)
        b = c.responses.create(model=MODEL_ID, previous_response_id=a.id, input="Now say goodbye.",
                               max_output_tokens=16, temperature=0)
        check(b.usage.input_tokens_details.cached_tokens >= a.usage.input_tokens,
              "responses: previous_response_id continues the conversation from the cache", b.usage)
        check(b.previous_response_id == a.id, "responses: previous_response_id is echoed")
        # Streamed: one answer that ends by itself (response.completed), one cut at max_output_tokens
        # (response.incomplete, as OpenAI ends those).
        for prompt, limit, last in [("What is 2+2? Answer with one number.", 32, "response.completed"),
                                    ("Say hello.", 16, "response.incomplete")]:
            whole = c.responses.create(model=MODEL_ID, input=prompt, max_output_tokens=limit, temperature=0)
            events = list(c.responses.create(model=MODEL_ID, input=prompt, max_output_tokens=limit, temperature=0,
                                             stream=True))
            types = [e.type for e in events]
            check(types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                                "response.content_part.added"] and
                  types[-4:] == ["response.output_text.done", "response.content_part.done",
                                 "response.output_item.done", last] and
                  set(types[4:-4]) == {"response.output_text.delta"},
                  f"responses stream=True: the Responses event sequence, ending {last}", types)
            check([e.sequence_number for e in events] == list(range(len(events))), "responses stream: sequence numbers")
            streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            done = events[-1].response
            check(streamed == whole.output_text == done.output_text and events[-4].text == streamed,
                  "responses stream: the deltas add up to the answer (and equal the unstreamed one)",
                  (streamed, whole.output_text))
            check(done.status == whole.status and done.usage.input_tokens == whole.usage.input_tokens and
                  done.usage.input_tokens_details.cached_tokens > 0 and events[2].item.id == done.output[0].id,
                  "responses stream: the last event has the status, the usage and the output item", done)
        with c.responses.stream(model=MODEL_ID, input="What is 2+2? Answer with one number.", max_output_tokens=32,
                                temperature=0) as st:
            final = st.get_final_response()
        check(final.output_text != "" and final.status == "completed", "responses.stream() helper: the final response",
              final)

        try:
            c.chat.completions.create(model="no-such-model", messages=q, max_tokens=4)
            check(False, "an unknown model raises NotFoundError")
        except openai.NotFoundError as e:
            check(e.status_code == 404 and e.body.get("code") == "model_not_found", "unknown model: NotFoundError")
        try:
            c.chat.completions.create(model=MODEL_ID, messages=q, max_tokens="many")
            check(False, "a wrong type raises BadRequestError")
        except openai.BadRequestError as e:
            check(e.body.get("param") == "max_tokens", "a wrong type: BadRequestError naming the field", e.body)
        try:
            c.responses.create(model=MODEL_ID, previous_response_id="resp_missing", input="x")
            check(False, "an unknown previous_response_id raises NotFoundError")
        except openai.NotFoundError:
            check(True, "an unknown previous_response_id: NotFoundError")
    with Server(args.choreo, args.model, "--api-key", "sesame", "--max-body-mib", "1") as s:
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        try:
            bad.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            check(False, "a bad key raises AuthenticationError")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "a bad key: AuthenticationError")
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0)
        check(good.models.list().data[0].id == MODEL_ID, "the right key: /v1/models lists the model")
        try:
            good.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x" * (2 << 20)}],
                                         max_tokens=4)
            check(False, "an oversized body raises an APIStatusError 413")
        except openai.APIStatusError as e:
            check(e.status_code == 413, "an oversized body: 413", e.status_code)
        check(healthy(s), "the server still serves after the errors")


def section_anthropic(args):
    import anthropic
    with Server(args.choreo, args.model) as s:
        c = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
        system = [{"type": "text", "text": "You are a helpful assistant who answers about the solar system. " * 8,
                   "cache_control": {"type": "ephemeral"}}]
        msgs = [{"role": "user", "content": [{"type": "text", "text": "Which planet is largest?"}]}]
        m1 = c.messages.create(model=MODEL_ID, max_tokens=24, system=system, messages=msgs,
                              extra_body={"temperature": 0})
        check(m1.content[0].type == "text" and m1.content[0].text != "", "messages: a text block", m1)
        check(m1.usage.cache_creation_input_tokens > 0 and m1.usage.cache_read_input_tokens == 0,
              "a first request with cache_control writes the cache", m1.usage)
        m2 = c.messages.create(model=MODEL_ID, max_tokens=24, system=system, messages=msgs,
                              extra_body={"temperature": 0})
        check(m2.usage.cache_read_input_tokens > 0, "a repeated request reads the cache", m2.usage)
        total = m2.usage.input_tokens + m2.usage.cache_read_input_tokens + m2.usage.cache_creation_input_tokens
        check(total == m1.usage.input_tokens + m1.usage.cache_read_input_tokens + m1.usage.cache_creation_input_tokens,
              "input, cache read and cache creation add up to the same prompt", (m1.usage, m2.usage))
        with c.messages.stream(model=MODEL_ID, max_tokens=24, system=system, messages=msgs,
                              extra_body={"temperature": 0}) as st:
            text = "".join(st.text_stream)
            final = st.get_final_message()
        check(text == m1.content[0].text and final.content[0].text == text, "streamed events give the same text",
              text)
        check(final.stop_reason in ("end_turn", "max_tokens"), "stop_reason", final.stop_reason)
        ss = c.messages.create(model=MODEL_ID, max_tokens=24, system=system, messages=msgs,
                               stop_sequences=[m1.content[0].text.split()[1]], extra_body={"temperature": 0})
        check(ss.stop_reason == "stop_sequence" and ss.stop_sequence == m1.content[0].text.split()[1],
              "stop_sequences: stop_reason stop_sequence", ss)
        try:
            c.messages.create(model="nope", max_tokens=4, messages=msgs)
            check(False, "an unknown model raises NotFoundError")
        except anthropic.NotFoundError:
            check(True, "anthropic: an unknown model is NotFoundError")


def section_equality(args):
    """32 concurrent clients; each text must equal `choreo generate --chat` run alone."""
    import openai
    topics = ["the moon", "rivers", "bread", "owls", "chess", "rain", "glass", "bees"]
    cases = []
    for i in range(32):
        # Shared prefixes on purpose: four clients per topic, so prompts extend and copy cached sessions.
        prompt = f"Write one sentence about {topics[i % 8]}." + (" Be brief." if i >= 16 else "")
        cases.append((prompt, 1000 + i))
    n, temp, top_k, top_p = 24, 0.8, 40, 0.95
    with Server(args.choreo, args.model, "--max-concurrency", "64", "--metrics") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        barrier = threading.Barrier(len(cases))

        def ask(case):
            prompt, seed = case
            barrier.wait()
            r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": prompt}],
                                          max_tokens=n, temperature=temp, top_p=top_p, seed=seed,
                                          extra_body={"top_k": top_k}, stream=seed % 2 == 0)
            if seed % 2 == 0:
                return "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices)
            return r.choices[0].message.content

        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            served = list(pool.map(ask, cases))
        _, metrics = raw(s, "GET", "/metrics")
        log = "".join(s.log)
    value = lambda name: float([l for l in metrics.splitlines() if l.startswith(name)][0].split()[-1])
    rows, steps = value("choreo_decode_rows_total"), value("choreo_decode_steps_total")
    check(rows / steps > 4, f"the clients' decodes were batched together: {rows / steps:.1f} choices per step")
    check(value('choreo_session_events_total{event="copied"}') > 0,
          "shared prompt prefixes were copied between sessions")
    batched = [int(x.split("=")[1]) for x in log.split() if x.startswith("computed=")]
    check(len(batched) == 32, "every request was logged", log[-2000:])
    for (prompt, seed), text in zip(cases, served):
        ref = generate_reference(args.choreo, args.model, prompt, seed, n, temp, top_k, top_p)
        check(text == ref, f"seed {seed}: the served text equals choreo generate --chat's", (text, ref))


def section_faults(args):
    with Server(args.choreo, args.model, "--timeout", "3", "--max-concurrency", "2", "--max-body-mib", "8",
                "--metrics") as s:
        post = lambda body, **kw: raw(s, "POST", "/v1/chat/completions", body, {"Content-Type": "application/json"}, **kw)
        st, b = post(b"{not json")
        check(st == 400 and b["error"]["code"] == "invalid_json", "malformed JSON: 400 invalid_json", b)
        st, b = post(json.dumps({"messages": "hello"}).encode())
        check(st == 400 and b["error"]["param"] == "messages", "wrong type: 400 naming the field", b)
        st, b = post(json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode())
        check(st == 400 and "role" in b["error"]["message"], "an unknown role: 400", b)
        st, b = post(b"[" * 100000 + b"]" * 100000)
        check(st == 400, "a body nested 10^5 deep: 400", b)
        st, b = post(b"x" * (9 << 20))
        check(st == 413, "a body over --max-body-mib: 413", st)
        t0 = time.time()
        msgs = [{"role": "user", "content": "hi"}] * 100000
        st, b = post(json.dumps({"messages": msgs, "max_tokens": 4}).encode())
        check(st == 400 and b["error"]["code"] == "context_length_exceeded",
              f"10^5 messages: 400 context_length_exceeded in {time.time() - t0:.1f} s", b)
        check(healthy(s), "still serving")

        # A client that sends its body one byte a second is cut at --timeout.
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        t0 = time.time()
        closed = False
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(1)
            if time.time() - t0 > 10:
                break
        try:
            closed = closed or sock.recv(1) == b""
        except OSError:
            closed = True
        check(closed and time.time() - t0 < 8, f"a body trickled a byte a second is cut at --timeout 3 "
              f"({time.time() - t0:.1f} s)")
        sock.close()
        check(healthy(s), "still serving")

        # A client gone mid-stream: its generation is cancelled and its session released.
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"messages": [{"role": "user", "content": "Tell a long story."}], "max_tokens": 2000,
                           "temperature": 0, "stream": True}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += sock.recv(4096)
        sock.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            _, metrics = raw(s, "GET", "/metrics")
            if "choreo_requests_in_flight 0" in metrics:
                break
            time.sleep(0.2)
        check("choreo_requests_in_flight 0" in metrics, "a client gone mid-stream: its generation ends", metrics)
        gen = [l for l in metrics.splitlines() if l.startswith("choreo_generated_tokens_total")]
        check(gen and int(float(gen[0].split()[1])) < 2000, "... before its 2000 tokens", gen)

        # More generations than --max-concurrency 2: the rest are 429, and nothing crashes.
        def long_one(_):
            return post(json.dumps({"messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 64,
                                    "temperature": 0}).encode())[0]
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(long_one, range(6)))
        check(statuses.count(429) >= 1 and statuses.count(200) >= 2 and set(statuses) <= {200, 429},
              "more requests than --max-concurrency: 429 for the rest", statuses)
        st, b = raw(s, "GET", "/nowhere")
        check(st == 404, "an unknown route: 404")
        check(healthy(s), "still serving at the end")


def section_langgraph(args):
    from typing import TypedDict
    from langchain_openai import ChatOpenAI
    from langgraph.graph import StateGraph, END

    agents = ["optimist", "skeptic", "judge"]

    class Debate(TypedDict):
        transcript: list
        cached: list

    def run(url):
        llm = ChatOpenAI(base_url=url + "/v1", api_key="unused", model=MODEL_ID, temperature=0, max_tokens=24,
                         max_retries=0)

        def speaker(name):
            def speak(state):
                history = "\n".join(state["transcript"]) or "(nothing yet)"
                msgs = [("system", "You debate whether cities should ban cars. Answer in one sentence."),
                        ("user", f"Debate so far:\n{history}\nYou are the {name}. Your turn.")]
                out = llm.invoke(msgs)
                usage = out.response_metadata.get("token_usage", {})
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                return {"transcript": state["transcript"] + [f"{name}: {out.content}"],
                        "cached": state["cached"] + [cached]}
            return speak

        g = StateGraph(Debate)
        order = [f"{a}{r}" for r in range(3) for a in agents]
        for node in order:
            g.add_node(node, speaker(node.rstrip("012")))
        g.set_entry_point(order[0])
        for a, b in zip(order, order[1:]):
            g.add_edge(a, b)
        g.add_edge(order[-1], END)
        return g.compile().invoke({"transcript": [], "cached": []})

    with Server(args.choreo, args.model) as s:
        first = run(s.url)
    check(len(first["transcript"]) == 9, "nine turns", first["transcript"])
    check(all(c > 0 for c in first["cached"][3:]), "rounds 2-3 report cached tokens", first["cached"])
    with Server(args.choreo, args.model) as s:
        second = run(s.url)
    check(second["transcript"] == first["transcript"], "a restarted server gives the same debate at temperature 0")


class ExecMirror:
    """The `choreo exec` calls that a sequence of extension requests stands for: each message with text is a
    prefill over the entries before it, each item_reference the message it names, the answer a decode over every
    entry (docs/serve.md, "choreo's extensions")."""

    def __init__(self):
        self.lines = []
        self.names = {}  # a request's id -> the exec call id
        self.answers = []  # (exec id, served text)
        self.n = 0

    def request(self, entries, answer_name, served_text, **sampling):
        parents = []
        for e in entries:
            if e.get("type") == "item_reference":
                parents.append(self.names[e["id"]])
                continue
            name = (e.get("choreo") or {}).get("id")
            if name in self.names:
                parents.append(self.names[name])
                continue
            self.n += 1
            call = f"m{self.n}"
            self.lines.append({"op": "prefill", "id": call, "role": e["role"], "text": e["content"],
                               "parents": list(parents)})
            if name:
                self.names[name] = call
            parents.append(call)
        self.n += 1
        call = f"a{self.n}"
        self.lines.append({"op": "decode", "id": call, "role": "assistant", "parents": parents, **sampling})
        self.names[answer_name] = call
        self.answers.append((call, served_text))

    def check(self, choreo, model):
        out = subprocess.run([choreo, "exec", "-m", model, "-"], input="\n".join(json.dumps(l) for l in self.lines),
                             capture_output=True, text=True)
        check(out.returncode == 0, "choreo exec runs the mirrored calls", out.stderr[-2000:])
        texts = {j["id"]: j["text"] for j in map(json.loads, out.stdout.splitlines()) if j["op"] == "decode"}
        for call, served in self.answers:
            check(served == texts[call], f"answer {call}: the served text equals choreo exec's", (served, texts[call]))


def section_extensions(args):
    """choreo's request extensions: ids, item_reference parents, output ids, retention and workflow hints; the
    answers equal `choreo exec` of the same calls, concurrent requests share forward passes, and the faults."""
    import openai
    mirror = ExecMirror()
    sampled = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "max_tokens": 16}
    with Server(args.choreo, args.model, "--metrics", "--max-pin-mib", "2") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)

        def ask(entries, output_id=None, seed=1, stream=False, **choreo):
            if output_id:
                choreo["output_id"] = output_id
            r = c.chat.completions.create(model=MODEL_ID, messages=entries, seed=seed, stream=stream,
                                          max_tokens=sampled["max_tokens"], temperature=sampled["temperature"],
                                          top_p=sampled["top_p"], extra_body={"top_k": 40, "choreo": choreo})
            if stream:
                chunks = list(r)
                return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices), None
            return r.choices[0].message.content, r

        docs = {"sys": "You answer in one short sentence.",
                "d1": "Document 1: The river Lune floods every March.",
                "d2": "Document 2: The bridge at Halton was rebuilt in 1911.",
                "d3": "Document 3: Salmon return to the Lune in autumn."}
        first = [{"role": "system", "content": docs["sys"], "choreo": {"id": "sys"}}] + [
            {"role": "user", "content": docs[d], "choreo": {"id": d}} for d in ("d1", "d2", "d3")] + [
            {"role": "user", "content": "When does the river flood?"}]
        text, r = ask(first, "a1", seed=11)
        mirror.request(first, "a1", text, seed=11, **sampled)
        ch = r.model_extra["choreo"]
        check(ch["message_id"] == "a1" and ch["computed_tokens"] == r.usage.prompt_tokens and
              r.usage.prompt_tokens_details.cached_tokens == 0, "a first request computes its whole prompt", ch)

        again = [{"type": "item_reference", "id": "sys"}, {"type": "item_reference", "id": "d1"},
                 {"role": "user", "content": docs["d2"], "choreo": {"id": "d2"}},
                 {"type": "item_reference", "id": "d3"}, {"role": "user", "content": "What was rebuilt?"}]
        text, r = ask(again, "a2", seed=12)
        mirror.request(again, "a2", text, seed=12, **sampled)
        ch = r.model_extra["choreo"]
        check(r.usage.prompt_tokens_details.cached_tokens == ch["reused_prefix_tokens"] > 0 and
              ch["reused_out_of_prefix_tokens"] == 0,
              "references in their places (and a known id with its text) are a prefix hit", ch)

        reordered = [{"type": "item_reference", "id": "sys"}, {"type": "item_reference", "id": "d3"},
                     {"type": "item_reference", "id": "d1"}, {"role": "user", "content": "What returns in autumn?"}]
        text, r = ask(reordered, "a3", seed=13)
        mirror.request(reordered, "a3", text, seed=13, **sampled)
        ch = r.model_extra["choreo"]
        check(ch["reused_out_of_prefix_tokens"] > 0 and r.usage.prompt_tokens_details.cached_tokens ==
              ch["reused_prefix_tokens"] and ch["reused_prefix_tokens"] + ch["reused_out_of_prefix_tokens"] +
              ch["computed_tokens"] == r.usage.prompt_tokens,
              "a reordered subset is reused out of prefix, and cached_tokens counts the prefix only", ch)

        follow = [{"type": "item_reference", "id": "sys"}, {"type": "item_reference", "id": "a1"},
                  {"role": "user", "content": "Say it again, shorter."}]
        text, r = ask(follow, None, seed=14)
        mirror.request(follow, r.model_extra["choreo"]["message_id"], text, seed=14, **sampled)
        check(r.model_extra["choreo"]["message_id"].startswith("msg_"), "an answer without output_id gets an id",
              r.model_extra["choreo"])

        # Concurrent requests (half of them streamed) share forward passes.
        _, before = raw(s, "GET", "/metrics")
        barrier = threading.Barrier(8)
        entries = [[{"type": "item_reference", "id": "sys"}, {"type": "item_reference", "id": f"d{1 + i % 3}"},
                    {"type": "item_reference", "id": "a1"},
                    {"role": "user", "content": f"Agent {i}: add one fact."}] for i in range(8)]

        def agent(i):
            barrier.wait()
            return ask(entries[i], f"c{i}", seed=100 + i, stream=i % 2 == 0, workflow_id="w", agent_id=f"agent{i}",
                       step_id=1, next={f"agent{j}": 1 for j in range(8)})[0]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(agent, range(8)))
        for i in range(8):
            mirror.request(entries[i], f"c{i}", texts[i], seed=100 + i, **sampled)
        _, after = raw(s, "GET", "/metrics")
        value = lambda text, name: float([l for l in text.splitlines() if l.startswith(name)][0].split()[-1])
        decodes = value(after, 'choreo_extension_calls_total{op="decode"}') - value(before, 'choreo_extension_calls_total{op="decode"}')
        batches = value(after, 'choreo_extension_batches_total{op="decode"}') - value(before, 'choreo_extension_batches_total{op="decode"}')
        check(decodes == 8 and decodes / batches > 1, f"8 concurrent requests decoded in {batches:.0f} batches")

        # The Responses API takes the same entries (item_reference is one of its input item types).
        resp_in = [{"type": "item_reference", "id": "c0"}, {"type": "item_reference", "id": "c1"},
                   {"role": "user", "content": "Which agent was right?", "choreo": {"id": "judge_q"}}]
        rr = c.responses.create(model=MODEL_ID, input=resp_in, temperature=0.8, top_p=0.95, max_output_tokens=16,
                                extra_body={"seed": 15, "top_k": 40, "choreo": {"output_id": "judged"}})
        mirror.request(resp_in, "judged", rr.output_text, seed=15, **sampled)
        check(rr.output[0].id == "judged", "responses: the output message's id is the answer's", rr.output[0].id)
        stream_in = [{"type": "item_reference", "id": "judged"}, {"role": "user", "content": "Explain in a line."}]
        events = list(c.responses.create(model=MODEL_ID, input=stream_in, temperature=0.8, top_p=0.95,
                                         max_output_tokens=16, stream=True,
                                         extra_body={"seed": 16, "top_k": 40, "choreo": {"output_id": "explained"}}))
        streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        mirror.request(stream_in, "explained", streamed, seed=16, **sampled)
        check(events[2].item.id == "explained" and events[-1].response.output_text == streamed and
              events[-1].type in ("response.completed", "response.incomplete") and
              events[-1].response.model_extra["choreo"]["reused_out_of_prefix_tokens"] > 0,
              "responses stream with extensions: the item is the answer's id, the choreo object at the end",
              events[-1].response)

        # Retention: a pin within --max-pin-mib 2 (one 32-token page is 1.4 MiB here), then one past it.
        pin = {"retention": {"pin": True, "ttl": "5m"}}
        _, r = ask([{"role": "user", "content": "Pin me.", "choreo": {"id": "p1", **pin}}], "p1a")
        check("pins_refused" not in r.model_extra["choreo"], "a pin within the budget is granted", r.model_extra)
        _, r = ask([{"role": "user", "content": "Pin me too.", "choreo": {"id": "p2", **pin}}], "p2a")
        check(r.model_extra["choreo"].get("pins_refused") == ["p2"], "a pin past --max-pin-mib is refused",
              r.model_extra)

        # Faults: each a typed error, and the server keeps serving.
        try:
            ask([{"type": "item_reference", "id": "never-named"}])
            check(False, "an unknown id raises NotFoundError")
        except openai.NotFoundError as e:
            check(e.body.get("code") == "message_not_found", "an unknown id: 404 message_not_found", e.body)
        try:
            ask([{"role": "user", "content": "Another text.", "choreo": {"id": "d1"}}])
            check(False, "an id reused with another text raises ConflictError")
        except openai.ConflictError as e:
            check(e.status_code == 409, "an id reused with another text: 409", e.body)
        for bad, what in [([{"type": "item_reference", "id": "loop"}, {"role": "user", "content": "x",
                                                                      "choreo": {"id": "loop"}}],
                           "an item_reference to a message the request defines after it"),
                          ([{"type": "item_reference", "id": "sys"}], "an output_id that is also a parent")]:
            try:
                ask(bad, "sys" if "output_id" in what else None)
                check(False, f"{what} raises BadRequestError")
            except openai.BadRequestError as e:
                check(e.body.get("code") == "item_reference_cycle", f"{what}: 400 item_reference_cycle", e.body)
        try:
            ask([{"role": "user", "content": "x", "choreo": {"idd": "y"}}])
            check(False, "an unknown choreo field raises BadRequestError")
        except openai.BadRequestError as e:
            check("did you mean 'id'" in e.body.get("message", ""), "an unknown choreo field: 400 with a hint", e.body)
        check(healthy(s), "still serving")
    mirror.check(args.choreo, args.model)


def section_tiers(args):
    """Served messages in the KV tiers. With a T0 too small for the session, named documents move to T1 and come
    back (the response's choreo object and /metrics say so). Killed with -9 during a generation and started again
    over the same T2 store, the server answers a request over the same documents by loading them from T2 instead
    of computing them; a server with only the Redis store (T3) loads them from there. Every answer equals
    `choreo exec` of the same calls (where the KV was never moves a bit)."""
    import openai
    import tempfile
    mirror = ExecMirror()
    sampled = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "max_tokens": 8}
    store = tempfile.mkdtemp(prefix="choreo-serve-tiers-")
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    redis_port = port.getsockname()[1]
    port.close()
    os.environ["CHOREO_REDIS_PASSWORD"] = "serve-tiers-test"
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--requirepass",
                              "serve-tiers-test", "--save", "", "--appendonly", "no", "--dir", store],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redis_flag = ["--redis", f"127.0.0.1:{redis_port}"]
    # T0 holds 16 pages of 32 tokens (SmolLM2-135M, f32 KV: 1.4 MiB a page): less than the session's messages.
    flags = ["--metrics", "--cache-mib", "24", "--host-cache-mib", "512", "--cache-dir", store, "--disk-cache-mib",
             "512", "--write-through", "--evict", "lru", *redis_flag]
    docs = {f"d{i}": f"Document {i}: the lighthouse keeper logged {i + 3} ships passing the northern reef "
                     f"on day {i * 7 + 1}, noting their flags, cargo and the weather at dawn." for i in range(4)}
    system = {"role": "system", "content": "You answer from the documents, briefly."}

    def ask(c, entries, output_id=None, seed=1):
        r = c.chat.completions.create(model=MODEL_ID, messages=entries, seed=seed, max_tokens=sampled["max_tokens"],
                                      temperature=sampled["temperature"], top_p=sampled["top_p"],
                                      extra_body={"top_k": 40, "choreo": {"output_id": output_id} if output_id else {}})
        mirror.request(entries, r.model_extra["choreo"]["message_id"], r.choices[0].message.content, seed=seed,
                       **sampled)
        return r.model_extra["choreo"]

    named = [{**system, "choreo": {"id": "sys"}}] + [
        {"role": "user", "content": text, "choreo": {"id": name}} for name, text in docs.items()]
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", redis_port)).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        with Server(args.choreo, args.model, *flags) as s:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
            ch = ask(c, named + [{"role": "user", "content": "How many ships passed on day 8?"}], "a1", seed=1)
            check(ch["loaded_tokens"] == {"t1": 0, "t2": 0, "t3": 0}, "a first request loads nothing", ch)
            for k in range(4):  # other documents push the first ones out of T0
                filler = [{"role": "user", "content": f"Filler {k}.{j}: the ferry timetable for route {k}{j} lists "
                                                      "departures at six, nine, noon and four, weather permitting, "
                                                      "from the east pier."} for j in range(3)]
                ask(c, filler + [{"role": "user", "content": "Summarize."}], seed=10 + k)
            ch = ask(c, [{"type": "item_reference", "id": "sys"}, {"type": "item_reference", "id": "d2"},
                         {"type": "item_reference", "id": "d0"}, {"role": "user", "content": "Compare days."}], seed=2)
            check(ch["loaded_tokens"]["t1"] > 0, "documents evicted from T0 are loaded back from T1", ch)
            _, metrics = raw(s, "GET", "/metrics")
            value = lambda name: float([l for l in metrics.splitlines() if l.startswith(name)][0].split()[-1])
            check(value('choreo_tier_evictions_total{tier="t0"}') > 0 and value('choreo_tier_loads_total{tier="t1"}') > 0
                  and value('choreo_prompt_loaded_tokens_total{tier="t1"}') >= ch["loaded_tokens"]["t1"] and
                  value('choreo_tier_writes_total{tier="t2"}') > 0 and value('choreo_tier_writes_total{tier="t3"}') > 0,
                  "/metrics counts the evictions, the T1 loads and the T2 and T3 writes")
            # kill -9 while a generation is running.
            sock = socket.create_connection(("127.0.0.1", s.port))
            body = json.dumps({"messages": [{"type": "item_reference", "id": "a1"},
                                            {"role": "user", "content": "Tell the whole story."}],
                               "max_tokens": 400, "stream": True, "ignore_eos": True}).encode()
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            got = b""
            while got.count(b"data: ") < 3:
                got += sock.recv(4096)
            s.proc.kill()
            s.proc.wait()
            sock.close()
            check(s.proc.returncode == -9, "the server was killed with -9 mid-generation")
        with Server(args.choreo, args.model, *flags) as s:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
            ch = ask(c, named + [{"role": "user", "content": "Which day had the most ships?"}], seed=3)
            check(ch["loaded_tokens"]["t2"] == ch["reused_prefix_tokens"] > ch["computed_tokens"] > 0,
                  "restarted over the same store, the documents are loaded from T2, not computed", ch)
        with Server(args.choreo, args.model, "--no-store", *redis_flag) as s:
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
            ch = ask(c, named + [{"role": "user", "content": "On which day did 5 ships pass?"}], seed=4)
            check(ch["loaded_tokens"]["t3"] == ch["reused_prefix_tokens"] > ch["computed_tokens"] > 0,
                  "another server with only the Redis store loads the documents from T3", ch)
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(store, ignore_errors=True)
    mirror.check(args.choreo, args.model)


DEBATE_YAML = """name: debate
description: Two agents answer, then each reads the other's answer and answers again.
inputs:
  problem: string
params:
  agents: 2
  rounds: 2
sampling: {temperature: 0.7, top_p: 1.0, max_tokens: 12, seed: 42}
messages:
  start: {role: user, text: "Solve: {{ problem }}"}
  debate: {role: user, text: "Above are the other agents' answers. Update yours."}
steps:
  - decode: {as: "answer[0][i]", for: "i in range(agents)", role: assistant, header: "Agent {{ i }}: ",
             parents: [start], seed: "42 + i"}
  - repeat: "r in range(1, rounds)"
    steps:
      - decode:
          as: "answer[r][i]"
          for: "i in range(agents)"
          role: assistant
          header: "Agent {{ i }}: "
          parents: [start, "answer[r-1][j] for j in range(agents) if j != i", debate]
          seed: "42 + 100 * r + i"
output: "{{ answer[rounds-1][0] }}"
"""


def section_workflows(args):
    """POST /choreo/v1/workflows/{name} with --workflows DIR: the streamed text is what `choreo run` prints for
    the same workflow and inputs, and the last event is run's --json record (the same messages, texts and
    tokens); unknown workflows and bad inputs are typed errors."""
    import tempfile
    wf_dir = tempfile.mkdtemp(prefix="choreo-serve-workflows-")
    try:
        with open(os.path.join(wf_dir, "debate.yaml"), "w") as f:
            f.write(DEBATE_YAML)
        shutil.copy(os.path.join(os.path.dirname(__file__), "..", "..", "workflows", "hello.yaml"), wf_dir)
        cases = [("debate", {"problem": "What is 6 times 7?"}, {"rounds": 3}, True),
                 ("hello", {"question": "What colour is the sky?"}, {}, False)]
        served = []
        with Server(args.choreo, args.model, "--workflows", wf_dir, "--workflow-params", "rounds") as s:
            st, b = raw(s, "POST", "/choreo/v1/workflows/debate",
                        json.dumps({"inputs": {"problem": "x"}, "params": {"agents": 9}}).encode())
            check(st == 400 and b["error"]["param"] == "params.agents",
                  "a param --workflow-params does not allow: 400 naming it", b)
            st, listed = raw(s, "GET", "/choreo/v1/workflows")
            check(st == 200 and listed["data"] == ["debate", "hello"], "GET /choreo/v1/workflows lists them", listed)
            for name, inputs, params, stream in cases:
                body = json.dumps({"inputs": inputs, "params": params, "stream": stream}).encode()
                req = urllib.request.Request(s.url + f"/choreo/v1/workflows/{name}", data=body, method="POST")
                with urllib.request.urlopen(req, timeout=120) as r:
                    data = r.read().decode()
                    kind = r.headers.get("Content-Type")
                if stream:
                    check(kind == "text/event-stream", f"{name}: streamed as server-sent events", kind)
                    events = []
                    for block in data.split("\n\n"):
                        if not block:
                            continue
                        event = block.split("\n")[0].removeprefix("event: ")
                        events.append((event, json.loads(block.split("\n", 1)[1].removeprefix("data: "))))
                    check([e for e, _ in events][-1] == "result" and len(events) > 3,
                          f"{name}: text events, then the record", [e for e, _ in events][-3:])
                    served.append(("".join(d["text"] for e, d in events if e == "text"), events[-1][1]))
                else:
                    whole = json.loads(data)
                    served.append((whole["text"], whole["record"]))
            st, b = raw(s, "POST", "/choreo/v1/workflows/nowhere", b"{}")
            check(st == 404 and b["error"]["code"] == "workflow_not_found", "an unknown workflow: 404", b)
            st, b = raw(s, "POST", "/choreo/v1/workflows/debate", json.dumps({"inputs": {}}).encode())
            check(st == 400 and "problem" in b["error"]["message"], "a missing input: 400 naming it", b)
            st, b = raw(s, "POST", "/choreo/v1/workflows/debate",
                        json.dumps({"inputs": {"problem": "x"}, "params": {"agentz": 3}}).encode())
            check(st == 400 and "did you mean 'agents'" in b["error"]["message"], "an unknown param: 400", b)
            check(healthy(s), "still serving")
        for (name, inputs, params, _), (text, record) in zip(cases, served):
            out_json = os.path.join(wf_dir, f"{name}.json")
            cmd = [args.choreo, "run", os.path.join(wf_dir, f"{name}.yaml"), "-m", args.model, "--no-store",
                   "--json", out_json]
            cmd += [f"--input={k}={v}" for k, v in inputs.items()] + [f"--param={k}={v}" for k, v in params.items()]
            run = subprocess.run(cmd, capture_output=True, text=True)
            check(run.returncode == 0, f"{name}: choreo run runs", run.stderr[-2000:])
            check(text == run.stdout, f"{name}: the served text is what choreo run prints", (text, run.stdout))
            with open(out_json) as f:
                ran = json.load(f)
            keys = ("name", "kind", "agent", "parents", "text", "tokens")
            same = lambda rec: [{k: m.get(k) for k in keys} for m in rec["messages"]]
            check(same(record) == same(ran) and record["output"] == ran["output"] and record["workflow"] == name,
                  f"{name}: the record has run --json's messages, texts and tokens", (same(record), same(ran)))
    finally:
        shutil.rmtree(wf_dir, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("section", choices=["openai", "anthropic", "equality", "faults", "langgraph", "extensions",
                                       "tiers", "workflows"])
    p.add_argument("--choreo", required=True)
    p.add_argument("--model", required=True)
    args = p.parse_args()
    globals()["section_" + args.section](args)
    print(f"section {args.section}: every check holds")


if __name__ == "__main__":
    main()
