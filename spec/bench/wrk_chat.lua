-- wrk script for spec/bench/core_bench.sh: the same small non-stream chat request to
-- every target (the mock ignores the Authorization header; tollgate needs it).
wrk.method = "POST"
wrk.body = '{"model":"mock-gpt","messages":[{"role":"user","content":"hello"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer tg-bench-key-0001"
