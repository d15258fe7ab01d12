-- usage (#18, item 6): the report and capacity functions without JIT and parallel workers,
-- and the coarse daily rollups of the days compacted before 0014.
--
-- Measured on 10M usage rows (spec/bench/usage_bench.sh, 3,200 combinations an hour): a
-- 14-day report by model read 5,760 coarse rows in ~50 ms, but took 220–320 ms: ~100 ms
-- compiling its 66 aggregates with LLVM (jit, on by default, for a plan that costs more
-- than jit_above_cost) and ~150 ms starting parallel workers for a Gather Merge over a few
-- thousand rows. Both are off for these two functions (SET on the function: only for
-- their own statements, the connection's settings are untouched).
ALTER FUNCTION tg_usage_report(timestamptz, timestamptz, text[], bigint, bigint, bigint, bigint, text, int, int, text)
    SET jit = off SET max_parallel_workers_per_gather = 0;
ALTER FUNCTION tg_usage_capacity(timestamptz, timestamptz, text, int)
    SET jit = off SET max_parallel_workers_per_gather = 0;

-- 0014's compaction filled usage_daily_acct only for the days it compacted itself: the
-- days compacted before it (by 0010's tg_usage_compact) had no coarse daily rows, so a
-- report reading them missed those days. All compacted days' coarse rows, recomputed
-- from usage_daily (the hourly part of the call covers no hour).
LOCK TABLE usage_hourly, usage_daily, usage_capacity_hourly, usage_hourly_acct, usage_daily_acct IN SHARE ROW EXCLUSIVE MODE;
SELECT tg_usage_acct_refresh('infinity', 'infinity', '-infinity', 'infinity');
