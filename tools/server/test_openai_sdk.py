#!/usr/bin/env python3
"""End-to-end checks of `dsv4 serve` with the official `openai` SDK (run by tests/scripts/server_openai.sh).

Two servers on a random-weight tiny model, CPU backend:
  main: --max-batch 16, --enable-test-hooks (scripted completions for DSML tool calls / reasoning)
  aux : --max-batch 1 --max-queue 1 --api-key KEY (401 and 429)
Random weights give random text, so checks compare servers against themselves (seeded determinism, serial vs
concurrent), never against meaning.
"""
import asyncio
import http.client
import json
import random
import re
import sys
import threading
import time
import urllib.request

import openai

MAIN, AUX, KEY = sys.argv[1], sys.argv[2], sys.argv[3]
N_CLIENTS, N_PER_CLIENT = 16, int(sys.argv[4]) if len(sys.argv) > 4 else 8
N_TOKENS = 12  # completion tokens of each concurrency-check request
client = openai.OpenAI(base_url=MAIN + "/v1", api_key="unused", max_retries=0, timeout=120)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def section(name):
    print(f"-- {name}", flush=True)


def metrics(base=MAIN):
    text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


USER = [{"role": "user", "content": "Say something."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}}]
DSML_CALL = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
             '<｜DSML｜parameter name="city" string="true">Paris "FR"</｜DSML｜parameter>\n'
             '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
             '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')

section("health, models")
check(json.load(urllib.request.urlopen(MAIN + "/health"))["status"] == "ok", "health")
models = client.models.list()
check([m.id for m in models.data] == ["deepseek-v4"], f"models: {models}")

section("chat non-stream, usage, seed determinism")
r1 = client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=8, seed=7, temperature=1.0)
r2 = client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=8, seed=7, temperature=1.0)
r3 = client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=8, seed=8, temperature=1.0)
c = r1.choices[0]
check(c.message.role == "assistant" and isinstance(c.message.content, str), "chat message shape")
check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason}")
check(r1.usage.completion_tokens == 8 or c.finish_reason == "stop", f"usage {r1.usage}")
check(r1.usage.total_tokens == r1.usage.prompt_tokens + r1.usage.completion_tokens, "usage total")
check(r1.usage.prompt_tokens == 7, f"prompt tokens of the rendered chat prompt: {r1.usage.prompt_tokens}")
check(c.message.content == r2.choices[0].message.content, "same seed -> same text")
check(c.message.content != r3.choices[0].message.content, "different seed -> different text")

section("chat stream == non-stream (same seed), include_usage")
chunks = list(client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=8, seed=7, stream=True,
                                             stream_options={"include_usage": True}))
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check(text == c.message.content, f"stream text {text!r} != {c.message.content!r}")
fins = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
check(fins == [c.finish_reason], f"stream finish {fins}")
check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r1.usage.completion_tokens, "usage chunk")

section("thinking mode: reasoning_content vs content (scripted completion)")
script = "Let me think about it.</think>The answer is 42."
for stream in (False, True):
    kw = dict(model="deepseek-v4", messages=USER, max_tokens=100, extra_body={
        "chat_template_kwargs": {"thinking": True}, "dsv4_test_completion": script})
    if stream:
        ch = list(client.chat.completions.create(stream=True, **kw))
        reasoning = "".join(getattr(x.choices[0].delta, "reasoning_content", None) or "" for x in ch if x.choices)
        content = "".join(x.choices[0].delta.content or "" for x in ch if x.choices)
        finish = [x.choices[0].finish_reason for x in ch if x.choices and x.choices[0].finish_reason]
    else:
        m = client.chat.completions.create(**kw)
        reasoning, content, finish = m.choices[0].message.reasoning_content, m.choices[0].message.content, [m.choices[0].finish_reason]
    check(reasoning == "Let me think about it.", f"reasoning (stream={stream}) {reasoning!r}")
    check(content == "The answer is 42.", f"content (stream={stream}) {content!r}")
    check(finish == ["stop"], f"finish (stream={stream}) {finish}")
# reasoning_effort "none" is chat mode: a </think> the model emits is not reasoning.
m = client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=50, reasoning_effort="none",
                                   extra_body={"dsv4_test_completion": "Plain answer."})
check(m.choices[0].message.content == "Plain answer." and not getattr(m.choices[0].message, "reasoning_content", None),
      f"chat mode {m.choices[0].message}")

section("stop strings")
m = client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=50, stop=["is 4"],
                                   extra_body={"dsv4_test_completion": "The answer is 42."})
check(m.choices[0].message.content == "The answer " and m.choices[0].finish_reason == "stop", f"stop {m.choices[0]}")
ch = list(client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=50, stop="is 4", stream=True,
                                         extra_body={"dsv4_test_completion": "The answer is 42."}))
check("".join(x.choices[0].delta.content or "" for x in ch if x.choices) == "The answer ", "stop (stream)")

section("tool calls: two-turn round trip, stream and non-stream")
kw = dict(model="deepseek-v4", tools=TOOLS, max_tokens=200,
          extra_body={"chat_template_kwargs": {"thinking": True},
                      "dsv4_test_completion": "I should look it up.</think>Checking." + DSML_CALL})
m = client.chat.completions.create(messages=[{"role": "user", "content": "Weather in Paris?"}], **kw)
msg = m.choices[0].message
check(m.choices[0].finish_reason == "tool_calls", f"tool finish {m.choices[0].finish_reason}")
check(msg.content == "Checking." and msg.reasoning_content == "I should look it up.", f"tool msg {msg}")
check(len(msg.tool_calls) == 1 and msg.tool_calls[0].function.name == "get_weather", f"calls {msg.tool_calls}")
args = json.loads(msg.tool_calls[0].function.arguments)
check(args == {"city": 'Paris "FR"', "days": 3}, f"arguments {args}")
check(msg.tool_calls[0].id.startswith("call_"), "call id")
check("DSML" not in (msg.content or ""), "no DSML in content")
ch = list(client.chat.completions.create(messages=[{"role": "user", "content": "Weather in Paris?"}], stream=True, **kw))
deltas = [tc for x in ch if x.choices for tc in (x.choices[0].delta.tool_calls or [])]
check(len(deltas) == 2 and deltas[0].function.name == "get_weather" and deltas[0].id, f"stream name delta {deltas}")
check(json.loads("".join(d.function.arguments or "" for d in deltas)) == args, "stream arguments")
check([x.choices[0].finish_reason for x in ch if x.choices and x.choices[0].finish_reason] == ["tool_calls"], "stream finish")
check("DSML" not in "".join(x.choices[0].delta.content or "" for x in ch if x.choices), "no DSML in streamed content")
# Second turn: the tool result goes back; the assistant turn with tool_calls must render (no 400).
turn2 = [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": msg.content, "reasoning_content": msg.reasoning_content,
          "tool_calls": [tc.model_dump() for tc in msg.tool_calls]},
         {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "Sunny, 21C"}]
m2 = client.chat.completions.create(model="deepseek-v4", messages=turn2, tools=TOOLS, max_tokens=50,
                                    extra_body={"chat_template_kwargs": {"thinking": True},
                                                "dsv4_test_completion": "Got it.</think>Sunny, 21C in Paris."})
check(m2.choices[0].message.content == "Sunny, 21C in Paris." and m2.choices[0].finish_reason == "stop", f"turn 2 {m2}")
check(m2.usage.prompt_tokens > m.usage.prompt_tokens, "turn 2 prompt holds turn 1")
# tool_choice named: the DSML opening is forced; the scripted "sampled" part continues inside the call.
m3 = client.chat.completions.create(
    model="deepseek-v4", messages=USER, tools=TOOLS, max_tokens=100,
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    extra_body={"dsv4_test_completion": '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
                                        '</｜DSML｜invoke>\n</｜DSML｜tool_calls>'})
tc3 = m3.choices[0].message.tool_calls
check(m3.choices[0].finish_reason == "tool_calls" and tc3 and tc3[0].function.name == "get_weather" and
      json.loads(tc3[0].function.arguments) == {"city": "Rome"} and not m3.choices[0].message.content,
      f"named tool_choice {m3.choices[0]}")
# tool_choice required in thinking mode: forced after the reasoning's </think>.
m4 = client.chat.completions.create(
    model="deepseek-v4", messages=USER, tools=TOOLS, max_tokens=100, tool_choice="required",
    extra_body={"chat_template_kwargs": {"thinking": True},
                "dsv4_test_completion": 'Must call.</think>get_weather">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>'})
tc4 = m4.choices[0].message.tool_calls
check(m4.choices[0].message.reasoning_content == "Must call." and tc4 and tc4[0].function.name == "get_weather" and
      tc4[0].function.arguments == "{}", f"required tool_choice {m4.choices[0]}")

section("logprobs")
m = client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=5, seed=3, logprobs=True, top_logprobs=3)
lp = m.choices[0].logprobs.content
check(len(lp) == m.usage.completion_tokens and all(len(e.top_logprobs) == 3 for e in lp), f"logprobs {lp}")
check(all(e.logprob <= e.top_logprobs[0].logprob + 1e-4 for e in lp), "top_logprobs[0] is the best")
check("".join(e.token for e in lp) == m.choices[0].message.content, "logprob tokens spell the content")

section("completions")
r = client.completions.create(model="deepseek-v4", prompt=[100, 200, 300, 400, 500], max_tokens=6, seed=2, logprobs=2)
check(r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length", f"completion {r}")
check(len(r.choices[0].logprobs.tokens) == 6, "completion logprobs")
s = "".join(x.choices[0].text for x in client.completions.create(
    model="deepseek-v4", prompt=[100, 200, 300, 400, 500], max_tokens=6, seed=2, stream=True))
check(s == r.choices[0].text, f"completion stream {s!r} != {r.choices[0].text!r}")

section("errors -> SDK exception types")
def expect(exc, fn, what):
    try:
        fn()
        check(False, f"{what}: no error")
    except exc as e:
        check(isinstance(e.body, dict) and "message" in e.body, f"{what}: error body {e.body}")
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: {type(e).__name__} {e}")
expect(openai.BadRequestError, lambda: client.chat.completions.create(model="deepseek-v4", messages=USER, n=2), "n=2")
expect(openai.BadRequestError, lambda: client.chat.completions.create(model="deepseek-v4", messages=USER, temperature="hot"), "temperature type")
expect(openai.BadRequestError, lambda: client.chat.completions.create(model="deepseek-v4", messages=[]), "empty messages")
expect(openai.BadRequestError, lambda: client.chat.completions.create(
    model="deepseek-v4", messages=[{"role": "user", "content": "word " * 600}]), "prompt longer than the context")
expect(openai.NotFoundError, lambda: client.chat.completions.create(model="gpt-4", messages=USER), "unknown model")
aux = openai.OpenAI(base_url=AUX + "/v1", api_key="wrong", max_retries=0)
expect(openai.AuthenticationError, lambda: aux.models.list(), "wrong api key")
aux = openai.OpenAI(base_url=AUX + "/v1", api_key=KEY, max_retries=0, timeout=120)
check(aux.models.list().data[0].id == "deepseek-v4", "right api key")

section("overload -> 429 (aux server: 1 slot, queue 1)")
results = []
def long_req():
    try:
        aux.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=24, seed=1)
        results.append("ok")
    except openai.RateLimitError:
        results.append("429")
    except Exception as e:  # noqa: BLE001
        results.append(repr(e))
ts = [threading.Thread(target=long_req) for _ in range(5)]
[t.start() for t in ts]
[t.join() for t in ts]
check(results.count("429") >= 2 and results.count("ok") >= 1 and len(results) == 5 and
      set(results) <= {"ok", "429"}, f"overload results {results}")

section("hostile input: fuzz loop")
rng = random.Random(1234)
host, port = MAIN.replace("http://", "").split(":")
FIELDS = ["model", "messages", "stream", "temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "n", "tools",
          "tool_choice", "logprobs", "top_logprobs", "stream_options", "reasoning_effort", "chat_template_kwargs",
          "prompt", "presence_penalty", "response_format", "max_completion_tokens", "min_p"]
BAD = [None, True, -1, 10**30, -10**30, 1.5e308, "x", "", [], {}, [1, "a"], {"a": {"b": []}}, "\ud800", 3.5, [[[]]]]
def fuzz_body(i):
    kind = i % 8
    if kind == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
    base = {"model": "deepseek-v4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if kind == 1:
        return json.dumps(base).encode()[: rng.randint(0, 60)]  # truncated
    if kind == 2:  # invalid UTF-8 inside a string
        return b'{"messages":[{"role":"user","content":"\xff\xfe' + bytes([rng.randint(0x80, 0xff)]) + b'"}]}'
    if kind == 3:  # deep nesting
        d = rng.randint(400, 3000)
        return b'{"messages":' + b"[" * d + b"]" * d + b"}"
    if kind == 4:  # wrong role / content shapes
        return json.dumps({"messages": [rng.choice([{"role": 5}, {"content": "x"}, {"role": "user", "content": 5},
                                                    {"role": "wizard", "content": "x"},
                                                    {"role": "user", "content": [{"type": "image_url"}]}]),
                                        ], "max_tokens": 1}).encode()
    if kind == 5:  # prompt too long, completions endpoint
        return json.dumps({"prompt": list(range(1, 700)), "max_tokens": 1}).encode()
    body = dict(base)
    body[rng.choice(FIELDS)] = rng.choice(BAD)
    if kind == 7:
        body[rng.choice(FIELDS)] = rng.choice(BAD)
    return json.dumps(body).encode(errors="surrogatepass") if False else json.dumps(body).encode("utf-8", "surrogatepass")
statuses = {}
conn = http.client.HTTPConnection(host, int(port), timeout=30)
sent = 0
valid_by_chance = 0
for i in range(2000):
    body = fuzz_body(i)
    path = "/v1/completions" if i % 8 == 5 else "/v1/chat/completions"
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except (http.client.HTTPException, OSError):
        conn.close()
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        statuses["conn-reset"] = statuses.get("conn-reset", 0) + 1
        continue
    sent += 1
    statuses[resp.status] = statuses.get(resp.status, 0) + 1
    if resp.status == 200:
        valid_by_chance += 1  # a mutation that happens to be valid (e.g. stop=None); must still be well-formed
        json.loads(data)
    else:
        check(400 <= resp.status < 500 and "error" in json.loads(data), f"fuzz {i}: {resp.status} {data[:200]!r}")
# Oversized bodies.
for size in (9 << 20,):
    conn.request("POST", "/v1/chat/completions", body=b" " * size)
    resp = conn.getresponse()
    resp.read()
    statuses[resp.status] = statuses.get(resp.status, 0) + 1
    check(resp.status == 413, f"oversized body: {resp.status}")
conn.close()
print(f"fuzz: {sent} requests answered, statuses {statuses}", flush=True)
check(sent >= 2000 - 10 and statuses.get("conn-reset", 0) <= 10, "fuzz: server kept answering")
check(valid_by_chance < 300, f"fuzz: too many mutations were valid ({valid_by_chance})")
check(json.load(urllib.request.urlopen(MAIN + "/health"))["status"] == "ok", "healthy after fuzz")

section("disconnect mid-stream frees the slot")
before = metrics()
stream = client.chat.completions.create(model="deepseek-v4", messages=USER, max_tokens=400, stream=True)
got = 0
for _ in stream:
    got += 1
    if got == 3:
        break
busy_seen = metrics()["dsv4_slots_busy"]
stream.close()
deadline = time.time() + 10
while time.time() < deadline:
    m = metrics()
    if m["dsv4_slots_busy"] == 0 and m['dsv4_generations_total{finish_reason="cancelled"}'] > \
            before['dsv4_generations_total{finish_reason="cancelled"}']:
        break
    time.sleep(0.1)
check(busy_seen == 1, f"slot busy while streaming: {busy_seen}")
check(m["dsv4_slots_busy"] == 0, "slot freed after disconnect")
check(m['dsv4_generations_total{finish_reason="cancelled"}'] == before['dsv4_generations_total{finish_reason="cancelled"}'] + 1,
      "cancellation counted")
check(m['dsv4_generation_tokens_total'] - before['dsv4_generation_tokens_total'] < 200, "generation stopped early")

section(f"concurrency: {N_CLIENTS} clients x {N_PER_CLIENT} requests, each equal to the same request run alone")
# Both phases run through the same client code: the SDK's AsyncOpenAI in one event loop (16 SDK threads under one GIL
# cost the 2-core box more client CPU and delay every streamed chunk behind the GIL). Nothing one-time is timed:
# connections are opened one client at a time (16 connects at once overflow the server's listen backlog of 5, and a
# dropped SYN is retried only after 1-3 s), and a warm-up round with all 16 slots busy at once creates every slot's
# session first (a slot's first use allocates its session and forward scratch, 0.1-0.25 s each in the scheduler
# thread, stalling the whole batch; single requests run on an already warm slot). Those two one-time costs put
# stalls of up to 5 s into the concurrent wall (0.69-1.40x on the 2-core box); without them 1.4-2.9x, ctest -j2 included.
def req(ci, k):  # even k greedy, odd k seeded sampling
    return dict(model="deepseek-v4", max_tokens=N_TOKENS, temperature=0.0 if k % 2 == 0 else 0.8, seed=1000 * ci + k,
                messages=[{"role": "user", "content": f"Client {ci} asks question number {k} " + "about x " * (ci % 5)}])
async def run(cl, ci, k, stream):  # half the requests of each phase streamed: the client does the same work in both
    if stream:
        chunks = await cl.chat.completions.create(stream=True, **req(ci, k))
        return "".join([x.choices[0].delta.content or "" async for x in chunks if x.choices])
    return (await cl.chat.completions.create(**req(ci, k))).choices[0].message.content
def decode_counters():  # (decode rows, batched decode forwards, seconds in those forwards) so far
    m = metrics()
    return m["dsv4_decode_batch_size_sum"], m["dsv4_decode_batch_size_count"], m["dsv4_decode_forward_seconds_total"]
async def concurrency():
    def connect():  # N_CLIENTS clients, one connection each, opened one at a time
        return [openai.AsyncOpenAI(base_url=MAIN + "/v1", api_key="unused", max_retries=0, timeout=300)
                for _ in range(N_CLIENTS)]
    async def opened(clients):
        for cl in clients:
            await cl.models.list()
        return clients
    async def warm(cl, ci):
        await cl.chat.completions.create(model="deepseek-v4", max_tokens=N_TOKENS, temperature=0.0,
                                         messages=[{"role": "user", "content": f"Warm-up {ci}"}])
    clients = await opened(connect())
    await asyncio.gather(*(warm(cl, ci) for ci, cl in enumerate(clients)))  # all slots busy at once: sessions exist
    for cl in clients:
        await cl.close()
    solo = (await opened([openai.AsyncOpenAI(base_url=MAIN + "/v1", api_key="unused", max_retries=0, timeout=300)]))[0]
    alone, t_alone = {}, 0.0
    c0 = decode_counters()
    for ci in range(N_CLIENTS):  # one request at a time
        for k in range(N_PER_CLIENT):
            t = time.perf_counter()
            alone[(ci, k)] = await run(solo, ci, k, k % 2 == 1)
            t_alone += time.perf_counter() - t
    c1 = decode_counters()
    await solo.close()
    # Fresh connections: the server closes one idle for 5 s (and one that served 5 requests).
    clients = await opened(connect())
    together, errors = {}, []
    async def client_loop(ci):
        for k in range(N_PER_CLIENT):
            try:
                together[(ci, k)] = await run(clients[ci], ci, k, k % 2 == 0)  # the other half: stream == non-stream
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
    t0 = time.perf_counter()
    await asyncio.gather(*(client_loop(ci) for ci in range(N_CLIENTS)))
    t_together = time.perf_counter() - t0
    c2 = decode_counters()
    for cl in clients:
        await cl.close()
    return alone, t_alone, together, t_together, errors, (c0, c1, c2)
alone, t_alone, together, t_together, errors, (c0, c1, c2) = asyncio.run(concurrency())
check(not errors, f"concurrent errors: {errors[:3]}")
check(len(alone) == N_CLIENTS * N_PER_CLIENT and all(isinstance(v, str) for v in [*alone.values(), *together.values()]),
      "every response has text content")
mismatch = [k for k in alone if together.get(k) != alone[k]]
check(not mismatch, f"{len(mismatch)} concurrent responses differ from the same request alone, e.g. {mismatch[:3]}")
rows, steps = c2[0] - c1[0], c2[1] - c1[1]
row_alone = (c1[2] - c0[2]) / max(c1[0] - c0[0], 1)  # decode forward seconds per row, one sequence per forward
row_together = (c2[2] - c1[2]) / max(rows, 1)
row_speedup = row_alone / max(row_together, 1e-9)
print(f"concurrency: {len(alone)} requests of {N_TOKENS} tokens; sum of single-request times {t_alone:.2f} s, "
      f"concurrent wall {t_together:.2f} s (speed-up {t_alone / t_together:.2f}x); decode forward per row "
      f"{1e3 * row_alone:.2f} ms alone, {1e3 * row_together:.2f} ms batched (speed-up {row_speedup:.2f}x); "
      f"{rows:.0f} decode rows in {steps:.0f} batched steps (mean batch {rows / max(steps, 1):.1f})", flush=True)
# Decode steps of concurrent requests share one forward (Session::append_batch), so each decoded row must cost less
# than in a forward of its own (server-timed; a broken batch measures about 1x), and the 16 clients together must
# finish in less wall time than the sum of the same requests run one at a time (issue 7).
check(c1[1] - c0[1] == c1[0] - c0[0], "requests run alone decode one row per forward")
check(rows / max(steps, 1) > 2, "decode steps batched across requests")
check(row_speedup > 1.2, f"a batched decode forward costs less per row than a forward per sequence ({row_speedup:.2f}x)")
check(t_together < t_alone, f"concurrent wall {t_together:.2f} s < sum of single-request times {t_alone:.2f} s")
m = metrics()
check(m["dsv4_slots_busy"] == 0 and m["dsv4_queue_depth"] == 0, "idle after the concurrency run")
check(m["dsv4_time_to_first_token_seconds_count"] > 0 and m["dsv4_inter_token_latency_seconds_count"] > 0, "histograms")
check(m['dsv4_http_requests_total{endpoint="/v1/chat/completions",status="400"}'] > 100, "400s counted")

print("PASS" if not failures else f"{len(failures)} failure(s)", flush=True)
sys.exit(1 if failures else 0)
