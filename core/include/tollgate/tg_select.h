/*
 * Account selection: which accounts of a group a request tries, in order. Reads the
 * snapshot's group index (tg_accounts.h) and the worker's account health (tg_health.h);
 * owns nothing and allocates nothing.
 *
 * Cost does not grow with the group. Priority tiers are walked from the highest, and of
 * a tier larger than what is still wanted only a sample is read: the usable accounts
 * found from a random offset (per-thread xorshift, no system call) onwards, until
 * TG_SELECT_MAX are found. Lower tiers are reached only when the higher ones have fewer
 * usable accounts than that. Only sampled accounts get a health lookup. They are then
 * ranked: a half-open account's trial first, then the account furthest below its fair
 * share — picks / (weight × (1 − error EWMA)² × (1 − load)) — so among the sampled the
 * least served wins (power-of-k choices). Every account of a tier is sampled with the
 * same probability, so every one gets traffic, and the fair-share key keeps equal
 * accounts within a few requests of each other.
 *
 * When most of a tier is unusable (cooling, tried, of the wrong provider) the scan reads
 * on until it finds a usable account, then at most 4 × TG_SELECT_MAX more, so it costs
 * about 1 / (the usable share) reads; only when a single account of thousands is usable
 * does it read the whole group.
 */
#ifndef TOLLGATE_TG_SELECT_H
#define TOLLGATE_TG_SELECT_H

#include "tollgate/tg_accounts.h"
#include "tollgate/tg_health.h"

/** The most accounts one selection returns (and hands to a select_account plugin). */
#define TG_SELECT_MAX 16

typedef struct {
    int64_t group_id;
    const char *model;      /* "" matches only accounts that list no models */
    int64_t now_ms;         /* wall clock, for cooldowns */
    int openai_only;        /* embeddings: OpenAI accounts only */
    const int64_t *avoid;   /* a retry must move: these are skipped unless nothing else is left */
    int navoid;
    int64_t sticky;         /* the conversation's bound account, first while healthy; 0 none */
    int64_t est_tokens;     /* the request's token estimate (0 unknown): an account whose
                               learned quota cannot cover it is passed over */
    int64_t quota_stale_ms; /* learned quota older than this is not trusted (0: no bound) */
    int *quota_skipped;     /* out, optional: accounts passed over for their quota */
} tg_select_t;

/**
 * Fills out[0..n) with the accounts to try, best first, and returns n (0: no account of
 * the group can take this request now; at most min(max, TG_SELECT_MAX)). Accounts are
 * active, not cooling (snapshot or health), serve the model, and are available
 * (tg_health_available: a half-open account only while no trial runs), and have quota
 * for the request by what their provider said (tg_quota_blocked_until: no window spent,
 * requests left, tokens for q->est_tokens) — unless no account has, when the quota is
 * not looked at (the provider answers for itself). *sticky_first is
 * set to 1 when out[0] is q->sticky, kept because it is healthy: not failing (error EWMA
 * < 0.5), not slow (TTFT EWMA < 30 s) and not saturated. May create health entries for
 * the accounts it looks at.
 */
int tg_select(const tg_snapshot_t *s, tg_health_t *h, const tg_select_t *q, const tg_account_t **out, int max,
              int *sticky_first);

/** Seeds this thread's sampling generator (tests and benchmarks; otherwise seeded from
 *  the OS on first use). */
void tg_select_seed(uint64_t seed);

#endif
