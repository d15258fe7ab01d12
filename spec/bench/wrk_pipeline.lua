-- wrk script for spec/bench/pipeline_bench.sh: the same small non-stream chat request
-- with max_tokens 16 to every target, with the key in TG_BENCH_KEY (the mock and
-- nginx's proxy_pass ignore it; the limiter and tollgate need it).
wrk.method = "POST"
wrk.body = '{"model":"mock-gpt","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("TG_BENCH_KEY") or "missing-key")
