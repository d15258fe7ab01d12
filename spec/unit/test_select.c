/*
 * Account selection (tg_select.c) over the snapshot's group index (tg_accounts.c):
 * the filters (model, status, cooldown, provider, tried), priority tiers, half-open
 * trials first, stickiness, the weighted fair share, that every account of a large
 * group gets traffic, and that one selection looks at a bounded number of accounts
 * whatever the group's size.
 *
 * Snapshots are built in memory (tg_snapshot_build); a "request" is a tg_select call
 * followed by what phase_slot does with the first account (picks + 1).
 */
#include "tg_test.h"
#include "tollgate/tg_select.h"

#define GID 7

/* n accounts with ids 1000.., equal (priority 0, weight 100, concurrency 16), all in GID. */
static tg_account_t *accounts(int n) {
    tg_account_t *a = calloc((size_t)n, sizeof(*a));
    for (int i = 0; i < n; i++)
        a[i] = (tg_account_t){.id = 1000 + i, .name = "acc", .provider = "openai", .concurrency = 16,
                              .weight = 100, .active = 1};
    return a;
}

static tg_snapshot_t *build(tg_account_t *a, int n) {
    tg_membership_t *m = calloc((size_t)n, sizeof(*m));
    for (int i = 0; i < n; i++)
        m[i] = (tg_membership_t){GID, a[i].id};
    tg_snapshot_t *s = tg_snapshot_build(a, (size_t)n, m, (size_t)n);
    free(m);
    return s;
}

static tg_select_t query(const char *model) { return (tg_select_t){.group_id = GID, .model = model, .now_ms = 1000000}; }

/* One request: the first account of the order takes it. Returns its id, 0 if none. */
static int64_t route(const tg_snapshot_t *s, tg_health_t *h, const tg_select_t *q) {
    const tg_account_t *out[TG_SELECT_MAX];
    int sticky;
    int n = tg_select(s, h, q, out, TG_SELECT_MAX, &sticky);
    if (n == 0)
        return 0;
    tg_health_get(h, out[0]->id)->picks += 1;
    return out[0]->id;
}

TG_TEST(select, index_by_model_and_priority) {
    tg_account_t *a = accounts(5);
    char *gpt[] = {"gpt"}, *claude[] = {"claude", "gpt"};
    a[1].models = gpt, a[1].nmodels = 1;
    a[2].models = claude, a[2].nmodels = 2;
    a[3].models = claude, a[3].nmodels = 1, a[3].model_map = json_pack("{s:s}", "alias", "claude");
    a[1].model_map = json_pack("{s:s}", "gpt", "gpt-4o"); /* listed and mapped: once */
    a[0].priority = 1;
    a[4].priority = 5;
    tg_snapshot_t *s = build(a, 5);
    tg_pool_t p;
    ASSERT_EQ_INT(tg_snapshot_pool(s, GID, "gpt", &p), 1);
    ASSERT_EQ_INT(p.n[0], 2); /* 1004 and 1000 list no models, by priority */
    ASSERT_EQ_INT(p.acc[0][0]->id, 1004);
    ASSERT_EQ_INT(p.acc[0][1]->id, 1000);
    ASSERT_EQ_INT(p.n[1], 2); /* 1001, 1002 list gpt */
    ASSERT_EQ_INT(p.acc[1][0]->id, 1001);
    ASSERT_EQ_INT(p.acc[1][1]->id, 1002);
    ASSERT_EQ_INT(tg_snapshot_pool(s, GID, "alias", &p), 1);
    ASSERT_EQ_INT(p.n[1], 1); /* mapped only */
    ASSERT_EQ_INT(p.acc[1][0]->id, 1003);
    ASSERT_EQ_INT(tg_snapshot_pool(s, GID, "claude", &p), 1);
    ASSERT_EQ_INT(p.n[1], 2);
    ASSERT_EQ_INT(tg_snapshot_pool(s, GID, "unknown", &p), 1);
    ASSERT_EQ_INT(p.n[1], 0);
    ASSERT_EQ_INT(tg_snapshot_pool(s, GID + 1, "gpt", &p), 0);
    ASSERT(tg_snapshot_member(s, GID, 1003) != NULL);
    ASSERT(tg_snapshot_member(s, GID, 1005) == NULL);
    ASSERT(tg_snapshot_member(s, GID + 1, 1003) == NULL);
    ASSERT_EQ_INT(tg_account_serves(tg_snapshot_member(s, GID, 1003), "alias"), 1);
    ASSERT_EQ_INT(tg_account_serves(tg_snapshot_member(s, GID, 1003), "gpt"), 0);
    json_decref(a[1].model_map);
    json_decref(a[3].model_map);
    tg_snapshot_release(s);
    free(a);
}

TG_TEST(select, filters_and_tiers) {
    tg_account_t *a = accounts(6);
    char *other[] = {"other"};
    a[0].priority = 2, a[0].active = 0;              /* disabled */
    a[1].priority = 2, a[1].cooldown_until_ms = 2e6; /* cooling (another instance said so) */
    a[2].priority = 2, a[2].models = other, a[2].nmodels = 1;
    a[3].priority = 1, a[3].provider = "anthropic";
    a[4].priority = 1;
    tg_snapshot_t *s = build(a, 6);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    const tg_account_t *out[TG_SELECT_MAX];
    int sticky;
    /* Nothing usable at priority 2 for gpt: priority 1 (both), then 0. */
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 3);
    ASSERT(out[0]->priority == 1 && out[1]->priority == 1 && out[2]->id == 1005);
    q.openai_only = 1;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 2);
    ASSERT_EQ_INT(out[0]->id, 1004);
    /* Cooling in this worker's health: skipped. */
    tg_health_cool(tg_health_get(h, 1004), q.now_ms, 5000);
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 1);
    ASSERT_EQ_INT(out[0]->id, 1005);
    /* A retry must move; with nothing else left it goes back to a tried account. */
    int64_t tried[] = {1005};
    q.avoid = tried, q.navoid = 1;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 1);
    ASSERT_EQ_INT(out[0]->id, 1005);
    q.openai_only = 0;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 1);
    ASSERT_EQ_INT(out[0]->id, 1003);
    /* The model "other" is served by 1002 (priority 2) first. */
    q = query("other");
    ASSERT_EQ_INT(tg_select(s, h, &q, out, 1, &sticky), 1);
    ASSERT_EQ_INT(out[0]->id, 1002);
    q.group_id = GID + 1;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 0);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}

TG_TEST(select, half_open_trial_first_and_one_at_a_time) {
    tg_account_t *a = accounts(3);
    tg_snapshot_t *s = build(a, 3);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    tg_health_entry_t *e = tg_health_get(h, 1002);
    tg_health_cool(e, q.now_ms - 10000, 5000); /* cooled, and the cooldown is over */
    e->picks = 1000;                           /* far above its share: the trial still goes first */
    const tg_account_t *out[TG_SELECT_MAX];
    int sticky;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 3);
    ASSERT_EQ_INT(out[0]->id, 1002);
    tg_health_begin(e); /* the trial runs: nobody else gets the account meanwhile */
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 2);
    ASSERT(out[0]->id != 1002 && out[1]->id != 1002);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}

TG_TEST(select, sticky_while_healthy) {
    tg_account_t *a = accounts(40);
    tg_snapshot_t *s = build(a, 40);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    q.sticky = 1033;
    tg_health_get(h, 1033)->picks = 1e6; /* the fair share would never pick it */
    const tg_account_t *out[TG_SELECT_MAX];
    int sticky;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), TG_SELECT_MAX);
    ASSERT_EQ_INT(sticky, 1);
    ASSERT_EQ_INT(out[0]->id, 1033);
    for (int i = 1; i < TG_SELECT_MAX; i++)
        ASSERT(out[i]->id != 1033);
    tg_health_get(h, 1033)->err_ewma = 0.6; /* failing: the conversation moves */
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), TG_SELECT_MAX);
    ASSERT_EQ_INT(sticky, 0);
    ASSERT(out[0]->id != 1033);
    tg_health_get(h, 1033)->err_ewma = 0;
    tg_health_get(h, 1033)->inflight = 16; /* saturated */
    tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky);
    ASSERT_EQ_INT(sticky, 0);
    tg_health_get(h, 1033)->inflight = 0;
    tg_health_get(h, 1033)->ttft_ewma_ms = 40000; /* slow */
    tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky);
    ASSERT_EQ_INT(sticky, 0);
    q.sticky = 99; /* not a member of the group */
    tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky);
    ASSERT_EQ_INT(sticky, 0);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}

/* Equal accounts share within a few requests; weights are honoured; a failing account
 * gets less. */
TG_TEST(select, fair_share) {
    tg_select_seed(1);
    tg_account_t *a = accounts(4);
    tg_snapshot_t *s = build(a, 4);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    int count[4] = {0};
    for (int i = 0; i < 400; i++)
        count[route(s, h, &q) - 1000]++;
    for (int i = 0; i < 4; i++)
        ASSERT(count[i] >= 99 && count[i] <= 101);
    tg_health_destroy(h);
    tg_snapshot_release(s);

    a[0].weight = 300; /* three times the others */
    s = build(a, 4);
    h = tg_health_create();
    memset(count, 0, sizeof(count));
    for (int i = 0; i < 600; i++)
        count[route(s, h, &q) - 1000]++;
    ASSERT(count[0] >= 295 && count[0] <= 305);
    tg_health_get(h, 1001)->err_ewma = 0.4; /* failing: (1 - 0.4)^2 = 0.36 of its weight */
    memset(count, 0, sizeof(count));
    for (int i = 0; i < 600; i++)
        count[route(s, h, &q) - 1000]++;
    ASSERT(count[1] < count[2] / 2);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}

/* 10,000 equal accounts: one selection reads at most a sample, yet over many requests
 * every account is used and none runs far ahead (power of k choices). */
TG_TEST(select, large_group_bounded_and_no_starvation) {
    enum { N = 10000 };
    tg_select_seed(42);
    tg_account_t *a = accounts(N);
    tg_snapshot_t *s = build(a, N);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    ASSERT(route(s, h, &q) != 0);
    ASSERT(tg_health_count(h) <= TG_SELECT_MAX); /* health looked up for the sample only */
    for (int i = 1; i < 20 * N; i++)
        ASSERT(route(s, h, &q) != 0);
    ASSERT_EQ_INT(tg_health_count(h), N);
    double lo = 1e18, hi = 0;
    for (int i = 0; i < N; i++) {
        double p = tg_health_get(h, 1000 + i)->picks;
        lo = TG_MIN(lo, p);
        hi = TG_MAX(hi, p);
    }
    /* 20 requests per account on average: every one got traffic, and the spread is tight. */
    ASSERT(lo >= 15);
    ASSERT(hi <= 25);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}

/* Most of a large group cooling: the scan reads past them and still finds the few
 * usable accounts, each in its turn (correct, at a cost of about 1 / the usable share). */
TG_TEST(select, large_group_mostly_cooling) {
    enum { N = 5000 };
    tg_select_seed(7);
    tg_account_t *a = accounts(N);
    for (int i = 0; i < N; i++)
        if (i != 1234 && i != 4321)
            a[i].cooldown_until_ms = 2e6;
    tg_snapshot_t *s = build(a, N);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    int hits[2] = {0};
    for (int i = 0; i < 50; i++) {
        int64_t id = route(s, h, &q);
        ASSERT(id == 2234 || id == 5321);
        hits[id == 5321]++;
    }
    ASSERT(hits[0] >= 10 && hits[1] >= 10);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}

/* Priority tiers in a large group: the lower tier is read only when the top has too few. */
TG_TEST(select, large_group_top_tier_only) {
    enum { N = 2000 };
    tg_account_t *a = accounts(N);
    for (int i = 0; i < N / 2; i++)
        a[i].priority = 1;
    tg_snapshot_t *s = build(a, N);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    const tg_account_t *out[TG_SELECT_MAX];
    int sticky;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), TG_SELECT_MAX);
    for (int i = 0; i < TG_SELECT_MAX; i++)
        ASSERT_EQ_INT(out[i]->priority, 1);
    ASSERT(tg_health_count(h) <= TG_SELECT_MAX);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}

/* An account whose provider said it is spent (a window used up, no requests left, fewer
 * tokens than the request needs) is passed over until the stated reset — and a sticky
 * conversation leaves it; when every account is spent the quota is not looked at. */
TG_TEST(select, learned_quota_passes_over_spent_accounts) {
    tg_account_t *a = accounts(3);
    tg_snapshot_t *s = build(a, 3);
    tg_health_t *h = tg_health_create();
    tg_select_t q = query("gpt");
    int skipped = 0;
    q.quota_skipped = &skipped;
    q.est_tokens = 500;
    tg_quota_t qt;
    tg_quota_init(&qt, q.now_ms);
    const char *spent = "x-codex-primary-used-percent: 100\r\nx-codex-primary-reset-after-seconds: 60\r\n";
    tg_quota_parse_headers(&qt, spent, strlen(spent), q.now_ms);
    tg_health_learn(tg_health_get(h, 1000), &qt);
    tg_quota_init(&qt, q.now_ms);
    const char *few = "x-ratelimit-limit-tokens: 10000\r\nx-ratelimit-remaining-tokens: 200\r\n"
                      "x-ratelimit-reset-tokens: 30s\r\n";
    tg_quota_parse_headers(&qt, few, strlen(few), q.now_ms);
    tg_health_learn(tg_health_get(h, 1001), &qt);
    const tg_account_t *out[TG_SELECT_MAX];
    int sticky;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 1);
    ASSERT_EQ_INT(out[0]->id, 1002);
    ASSERT_EQ_INT(skipped, 2);
    q.est_tokens = 100; /* 200 tokens left cover this one */
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 2);
    q.sticky = 1000; /* a conversation bound to the spent account leaves it */
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 2);
    ASSERT_EQ_INT(sticky, 0);
    q.sticky = 0;
    q.now_ms += 60001; /* past the reset: back */
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 3);
    ASSERT_EQ_INT(skipped, 0);
    q.now_ms -= 60001;
    q.quota_stale_ms = 1; /* stale state is not trusted */
    q.now_ms += 2;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 3);
    q.now_ms -= 2;
    q.quota_stale_ms = 0;
    a[2].active = 0; /* every account left is spent: the providers answer for themselves */
    tg_snapshot_release(s);
    s = build(a, 3);
    q.est_tokens = 500;
    ASSERT_EQ_INT(tg_select(s, h, &q, out, TG_SELECT_MAX, &sticky), 2);
    ASSERT_EQ_INT(skipped, 0);
    tg_health_destroy(h);
    tg_snapshot_release(s);
    free(a);
}
