/*
 * settle.lua against a real Redis (TOLLGATE_REDIS): the holds of one tenant given back
 * in one call (a settlement batch's), exactly once each — a hold named twice in one call
 * (the same settlement queued twice) is credited once, a second call changes nothing,
 * the key budgets move by their own holds' sums, amounts of 2^53 stay exact, and a
 * reservation that is not a number is left with its index entry while the others go.
 * Without TOLLGATE_REDIS, `tg_unit settle_redis` exits 77 (skipped).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tg_test_redis.h"
#include "tollgate/tg_scripts.h"

__attribute__((constructor)) static void settle_skip_without_server(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "settle_redis") == 0 && !getenv("TOLLGATE_REDIS")) {
        fprintf(stderr, "skipped: TOLLGATE_REDIS (unix:///path or redis://host:port) is not set\n");
        exit(77);
    }
}

typedef struct {
    redisContext *c;
    char tag[48];
} sx_t;

static void sx_init(sx_t *x, const char *salt) {
    x->c = side_connect(getenv("TOLLGATE_REDIS"));
    snprintf(x->tag, sizeof(x->tag), "{t:settle-%s-%d}", salt, rand());
    redisReply *r = redisCommand(x->c, "HSET %s:money avail 1000 reserved 0", x->tag);
    freeReplyObject(r);
}

static void cmd(sx_t *x, const char *fmt, const char *a, const char *b) {
    char key[160];
    snprintf(key, sizeof(key), fmt, x->tag, a);
    redisReply *r = redisCommand(x->c, b ? "SET %s %s" : "DEL %s", key, b);
    ASSERT(r && r->type != REDIS_REPLY_ERROR);
    freeReplyObject(r);
}

/* A hold of `amount` for request id under key `k`: what a reservation leaves in Redis
 * (the reservation key, the index entry, the balances already down by it). */
static void hold(sx_t *x, const char *id, const char *k, long long amount) {
    char v[32];
    snprintf(v, sizeof(v), "%lld", amount);
    cmd(x, "%s:res:%s:1", id, v);
    redisReply *r = redisCommand(x->c, "HSET %s:holds %s:1 %s|i|0|%s|m", x->tag, id, k, v);
    freeReplyObject(r);
    r = redisCommand(x->c, "HINCRBY %s:money avail %lld", x->tag, -amount);
    freeReplyObject(r);
    r = redisCommand(x->c, "HINCRBY %s:money reserved %lld", x->tag, amount);
    freeReplyObject(r);
}

static long long hget(sx_t *x, const char *key, const char *field) {
    redisReply *r = redisCommand(x->c, "HGET %s%s %s", x->tag, key, field);
    long long v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : -999999;
    freeReplyObject(r);
    return v;
}

static long long hlen(sx_t *x) {
    redisReply *r = redisCommand(x->c, "HLEN %s:holds", x->tag);
    long long v = r ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

/* settle.lua over n holds: ids[i] under key keys[i], spent actual[i]. Returns its answer. */
static long long settle(sx_t *x, int n, const char *const *ids, const char *const *keys, const long long *actual) {
    int argc = 3 + 2 + 4 * n;
    const char **argv = calloc((size_t)argc, sizeof(*argv));
    char (*s)[160] = calloc((size_t)(2 + 4 * n), sizeof(*s));
    char nk[16];
    snprintf(nk, sizeof(nk), "%d", 2 + 2 * n);
    argv[0] = "EVAL";
    argv[1] = tg_scripts_source("settle");
    argv[2] = nk;
    snprintf(s[0], 160, "%s:money", x->tag);
    snprintf(s[1], 160, "%s:holds", x->tag);
    argv[3] = s[0];
    argv[4] = s[1];
    for (int i = 0; i < n; i++) {
        snprintf(s[2 + 4 * i], 160, "%s:res:%s:1", x->tag, ids[i]);
        snprintf(s[3 + 4 * i], 160, "%s:kmoney:%s", x->tag, keys[i]);
        snprintf(s[4 + 4 * i], 160, "%lld", actual[i]);
        snprintf(s[5 + 4 * i], 160, "%s:1", ids[i]);
        argv[5 + 2 * i] = s[2 + 4 * i];
        argv[6 + 2 * i] = s[3 + 4 * i];
        argv[5 + 2 * n + 2 * i] = s[4 + 4 * i];
        argv[6 + 2 * n + 2 * i] = s[5 + 4 * i];
    }
    redisReply *r = redisCommandArgv(x->c, argc, argv, NULL);
    if (r && r->type == REDIS_REPLY_ERROR)
        fprintf(stderr, "settle.lua: %s\n", r->str);
    ASSERT(r && r->type == REDIS_REPLY_INTEGER);
    long long v = r->integer;
    freeReplyObject(r);
    free(argv);
    free(s);
    return v;
}

TG_TEST(settle_redis, a_batch_of_holds_goes_back_once_each) {
    sx_t x;
    sx_init(&x, "batch");
    redisReply *r = redisCommand(x.c, "HSET %s:kmoney:7 avail 500", x.tag);
    freeReplyObject(r);
    hold(&x, "a", "7", 100);
    hold(&x, "b", "7", 200);
    hold(&x, "c", "8", 300); /* key 8 has no budget: its kmoney key is never made */
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 400);
    ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 600);
    const char *ids[3] = {"a", "b", "c"}, *keys[3] = {"7", "7", "8"};
    const long long spent[3] = {30, 200, 0};
    ASSERT_EQ_INT(settle(&x, 3, ids, keys, spent), 3);
    /* back: 70 + 0 + 300 */
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 770);
    ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 0);
    ASSERT_EQ_INT(hget(&x, ":kmoney:7", "avail"), 570);
    redisReply *e = redisCommand(x.c, "EXISTS %s:kmoney:8", x.tag);
    ASSERT_EQ_INT(e->integer, 0);
    freeReplyObject(e);
    ASSERT_EQ_INT(hlen(&x), 0);
    /* Sent again (its answer lost): nothing moves. */
    ASSERT_EQ_INT(settle(&x, 3, ids, keys, spent), 0);
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 770);
    ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 0);
    ASSERT_EQ_INT(hget(&x, ":kmoney:7", "avail"), 570);
    redisFree(x.c);
}

TG_TEST(settle_redis, a_hold_named_twice_in_one_call_is_credited_once) {
    sx_t x;
    sx_init(&x, "twice");
    hold(&x, "d", "7", 100);
    const char *ids[3] = {"d", "d", "d"}, *keys[3] = {"7", "7", "7"};
    const long long spent[3] = {30, 30, 30};
    ASSERT_EQ_INT(settle(&x, 3, ids, keys, spent), 1);
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 970);
    ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 0);
    redisFree(x.c);
}

TG_TEST(settle_redis, amounts_of_two_to_the_53_stay_exact) {
    sx_t x;
    sx_init(&x, "big");
    const long long big = 9007199254740992LL; /* 2^53, TG_MONEY_REQUEST_MAX */
    redisReply *r = redisCommand(x.c, "HSET %s:money avail %lld", x.tag, 3 * big + 7);
    freeReplyObject(r);
    r = redisCommand(x.c, "HSET %s:kmoney:7 avail %lld", x.tag, 3 * big + 7);
    freeReplyObject(r);
    hold(&x, "e", "7", big);
    hold(&x, "f", "7", big - 1);
    hold(&x, "g", "7", 3);
    r = redisCommand(x.c, "HINCRBY %s:kmoney:7 avail %lld", x.tag, -(2 * big + 2));
    freeReplyObject(r);
    const char *ids[3] = {"e", "f", "g"}, *keys[3] = {"7", "7", "7"};
    const long long spent[3] = {1, 0, 3};
    ASSERT_EQ_INT(settle(&x, 3, ids, keys, spent), 3);
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 3 * big + 7 - 1 - 3);
    ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 0);
    ASSERT_EQ_INT(hget(&x, ":kmoney:7", "avail"), 3 * big + 7 - 1 - 3);
    redisFree(x.c);
}

TG_TEST(settle_redis, a_reservation_that_is_not_a_number_is_left_with_its_entry) {
    sx_t x;
    sx_init(&x, "bad");
    hold(&x, "h", "7", 100);
    hold(&x, "i", "7", 50);
    cmd(&x, "%s:res:%s:1", "h", "garbage");
    const char *ids[2] = {"h", "i"}, *keys[2] = {"7", "7"};
    const long long spent[2] = {0, 10};
    ASSERT_EQ_INT(settle(&x, 2, ids, keys, spent), 1);
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 850 + 40);
    ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 100);
    ASSERT_EQ_INT(hlen(&x), 1); /* h's entry stays for the reconciler or an operator */
    redisFree(x.c);
}

TG_TEST(settle_redis, periodic_budgets_get_back_the_unused_part_once) {
    /* money.lua writes "<amount>|<budget period key>..." (budgets #24): each period's
     * spend goes down by the unused part of every hold that counted in it. */
    sx_t x;
    sx_init(&x, "bud");
    char bk[96], v[160];
    snprintf(bk, sizeof(bk), "%s:bud:5:1700000000", x.tag);
    redisReply *r = redisCommand(x.c, "SET %s 300", bk);
    freeReplyObject(r);
    hold(&x, "j", "7", 100);
    hold(&x, "k", "7", 200);
    snprintf(v, sizeof(v), "100|%s", bk);
    cmd(&x, "%s:res:%s:1", "j", v);
    snprintf(v, sizeof(v), "200|%s", bk);
    cmd(&x, "%s:res:%s:1", "k", v);
    const char *ids[3] = {"j", "k", "j"}, *keys[3] = {"7", "7", "7"};
    const long long spent[3] = {40, 50, 40};
    ASSERT_EQ_INT(settle(&x, 3, ids, keys, spent), 2);
    r = redisCommand(x.c, "GET %s", bk);
    ASSERT(r && r->type == REDIS_REPLY_STRING);
    ASSERT_EQ_INT(atoll(r->str), 300 - 60 - 150);
    freeReplyObject(r);
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 700 + 60 + 150);
    ASSERT_EQ_INT(settle(&x, 3, ids, keys, spent), 0);
    r = redisCommand(x.c, "GET %s", bk);
    ASSERT_EQ_INT(atoll(r->str), 90);
    freeReplyObject(r);
    redisFree(x.c);
}

/* A failed attempt's hold, kept ("k0", tg_billing_release_failed): its amount goes back
 * to the balances at once, but the reservation stays at zero with its index entry, so
 * that a settlement charging the attempt later (the reconciler's bound, its gateway
 * dead) charges Redis as it charges Postgres; sent again it moves nothing. */
TG_TEST(settle_redis, a_kept_hold_goes_back_and_stays_at_zero_until_settled) {
    sx_t x;
    sx_init(&x, "kept");
    redisReply *r = redisCommand(x.c, "HSET %s:kmoney:7 avail 500", x.tag);
    freeReplyObject(r);
    hold(&x, "f", "7", 100);
    r = redisCommand(x.c, "HINCRBY %s:kmoney:7 avail -100", x.tag);
    freeReplyObject(r);
    for (int round = 0; round < 2; round++) {
        char money[160], holds[160], res[160], km[160];
        snprintf(money, sizeof(money), "%s:money", x.tag);
        snprintf(holds, sizeof(holds), "%s:holds", x.tag);
        snprintf(res, sizeof(res), "%s:res:f:1", x.tag);
        snprintf(km, sizeof(km), "%s:kmoney:7", x.tag);
        const char *argv[9] = {"EVAL", tg_scripts_source("settle"), "4", money, holds, res, km, "k0", "f:1"};
        r = redisCommandArgv(x.c, 9, argv, NULL);
        ASSERT(r && r->type == REDIS_REPLY_INTEGER);
        freeReplyObject(r);
        ASSERT_EQ_INT(hget(&x, ":money", "avail"), 1000);
        ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 0);
        ASSERT_EQ_INT(hget(&x, ":kmoney:7", "avail"), 500);
        ASSERT_EQ_INT(hlen(&x), 1); /* still indexed: the reconciler finds it */
        r = redisCommand(x.c, "GET %s:res:f:1", x.tag);
        ASSERT(r && r->type == REDIS_REPLY_STRING && strcmp(r->str, "0") == 0);
        freeReplyObject(r);
    }
    /* The reconciler charges the attempt's bound (100): Redis pays it too. */
    const char *ids[1] = {"f"}, *keys[1] = {"7"};
    const long long spent[1] = {100};
    ASSERT_EQ_INT(settle(&x, 1, ids, keys, spent), 1);
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 900);
    ASSERT_EQ_INT(hget(&x, ":money", "reserved"), 0);
    ASSERT_EQ_INT(hget(&x, ":kmoney:7", "avail"), 400);
    ASSERT_EQ_INT(hlen(&x), 0);
    ASSERT_EQ_INT(settle(&x, 1, ids, keys, spent), 0);
    ASSERT_EQ_INT(hget(&x, ":money", "avail"), 900);
    redisFree(x.c);
}
