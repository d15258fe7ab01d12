-- wrk script for spec/bench/billing_bench.sh: a small non-stream chat request with a
-- billed key (TG_BENCH_KEY) and an explicit max_tokens, so every request reserves the
-- same bound and is settled with the same usage.
wrk.method = "POST"
wrk.body = '{"model":"mock-gpt","max_tokens":16,"messages":[{"role":"user","content":"hello [mock chunks=4]"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("TG_BENCH_KEY") or "missing-key")
